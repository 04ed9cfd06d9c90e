"""Find every process of one stage's embedded control plane, recorded or not.

`spz api stop` must stop what a crashed or racing start left behind, not only what `api.json`
names, and a start must never open the JetStream store beside a server still holding it. Each
control-plane process is recognisable from its command line alone:
- the supervisor, the services process and the API server carry `--control-plane <state dir>`;
- nats-server runs `-c <state dir>/jetstream/nats.conf`;
- a services process of an older release (`-m skypurza.cli.serve --nats <url> --stage <stage>`)
  is matched by its stage and the stage's recorded URL.
Node agents of local clusters also name the state directory (their homes live under it); they are
nodes, not the control plane, and never match.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CONTROL_PLANE_FLAG = "--control-plane"
SUPERVISOR_MODULE = "skypurza.cli.supervisor"
SERVE_MODULE = "skypurza.cli.serve"
API_MODULE = "skypurza.services.api"
WORKER_MODULE = "skypurza.cli.warmworker"
_ROLE_OF_MODULE = {SUPERVISOR_MODULE: "supervisor", SERVE_MODULE: "services", API_MODULE: "api-server",
                   WORKER_MODULE: "cli-worker"}


@dataclass(frozen=True)
class PlaneProcess:
    pid: int
    role: str  # supervisor | services | api-server | nats-server | cli-worker


def classify(argv: list[str], state_dir: str, nats_conf: str, stage: str, nats_url: str | None) -> str | None:
    """The control-plane role of a process with this argv in this stage, or None (pure)."""
    if not argv:
        return None
    if Path(argv[0]).name == "nats-server":
        return "nats-server" if nats_conf in argv else None
    if "-m" not in argv:
        return None
    module = argv[argv.index("-m") + 1] if argv.index("-m") + 1 < len(argv) else ""
    role = _ROLE_OF_MODULE.get(module)
    if role is None:
        return None
    if _flag_value(argv, CONTROL_PLANE_FLAG) == state_dir:
        return role
    if role == "services" and nats_url and _flag_value(argv, "--stage") == stage \
            and _flag_value(argv, "--nats") == nats_url:
        return role
    return None


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def read_argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


# /proc/<pid>/comm of the processes the CLI worker forks per command (cli/warmworker.py names them).
FORKED_BY_WORKER = ("spz-command", "spz-monitor")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a live process, or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        return fields[0], int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def find(state_dir: Path, nats_conf: Path, stage: str, nats_url: str | None = None) -> list[PlaneProcess]:
    """Every live control-plane process of this stage on this machine."""
    me = os.getpid()
    sd = str(state_dir)
    conf = str(nats_conf)
    found: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        role = classify(read_argv(pid), sd, conf, stage, nats_url)
        if role == "cli-worker" and _comm(pid) in FORKED_BY_WORKER:
            continue  # a command the CLI worker runs for a user (and its monitor): not the plane
        stat = _stat(pid) if role else None
        if role and stat is not None and stat[0] != "Z":
            found[pid] = (role, stat[1])
    # A child between fork and exec (the services process starting a node agent) still shows its
    # parent's command line for a moment: it is not a second process of that role.
    return [PlaneProcess(pid, role) for pid, (role, ppid) in found.items()
            if found.get(ppid, ("", 0))[0] != role]
