"""Is a process (or a process group) still running? Shared by the CLI's control plane, the node
agent and the local backend, which all manage detached processes on this machine.

A zombie (exited, not yet reaped) answers `kill(pid, 0)` like a live process, so both checks
read /proc to tell them apart.
"""

from __future__ import annotations

import os


def _state(pid: int | str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return fields[0] if fields else None


def pid_alive(pid: int | None) -> bool:
    """True while the process exists and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = _state(pid)
    return state is None or state != "Z"


def group_alive(pgid: int | None) -> bool:
    """True while some member of the process group runs (a group of zombies is not alive)."""
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False
