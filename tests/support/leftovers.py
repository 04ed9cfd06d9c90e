"""Kill every process a test left under its temporary directory, on failure too.

Node agents and the jobs they run are detached (their own sessions) so that they outlive the
CLI, exactly as on a real machine; a test that fails half-way would otherwise leave them running
for minutes after their nats-server is gone. A process belongs to a test when its working
directory or one of its arguments lies under the test's directory, or when its process group is
recorded in a `*.pgid` file there (the agent's record of a running job).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def processes_under(root: Path) -> list[int]:
    r = str(root.resolve())
    spared = _ancestors()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared:
            continue
        pid = int(entry)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if _under(cwd, r) or any(_under(a, r) or ("=" in a and _under(a.split("=", 1)[1], r)) for a in argv):
            found.append(pid)
    return found


def recorded_groups(root: Path) -> list[int]:
    groups = []
    for f in root.rglob("*.pgid"):
        try:
            groups.append(int(f.read_text().strip()))
        except (OSError, ValueError):
            pass
    return groups


def kill_with_group(pid: int) -> None:
    """SIGKILL a process and its process group (that process alone when it shares the test
    runner's group)."""
    try:
        group = os.getpgid(pid)
        if group != os.getpgid(0) and group > 1:
            os.killpg(group, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_under(root: Path) -> list[int]:
    """SIGKILL (with their process groups) every process that belongs to `root`; returns pids."""
    if not root.exists():
        return []
    own_group = os.getpgid(0)
    killed = []
    for pgid in recorded_groups(root):
        if pgid > 1 and pgid != own_group:
            try:
                os.killpg(pgid, signal.SIGKILL)
                killed.append(pgid)
            except (ProcessLookupError, PermissionError):
                pass
    for pid in processes_under(root):
        kill_with_group(pid)
        killed.append(pid)
    return killed


def kill_stage(home: Path, stage: str) -> None:
    """SIGKILL whatever the stage's control plane under `home` left running (its supervisor,
    nats-server, services, API server, CLI worker), as `cli/planeprocs.py` finds them: what a test
    that fails before `spz api stop` would otherwise leave behind."""
    from skypurza.cli import planeprocs

    sd = home / stage
    for p in planeprocs.find(sd, sd / "jetstream" / "nats.conf", stage):
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
