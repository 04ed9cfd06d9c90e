"""What a process that did not exit was doing, for a test's failure message: its signal masks (a
SIGINT blocked or ignored by inheritance reads differently from one handled and stuck) and each
thread's state and kernel wait channel, from /proc (Linux)."""

from __future__ import annotations

from pathlib import Path


def process_report(pid: int) -> str:
    proc = Path(f"/proc/{pid}")
    try:
        status = {k: v.strip() for k, _, v in (line.partition(":") for line in (proc / "status").read_text().splitlines())}
    except OSError as exc:
        return f"pid {pid}: no /proc entry ({exc})"
    parts = [f"pid {pid} {status.get('State', '?')}", *(f"{k}={status.get(k, '?')}" for k in ("SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd"))]
    for task in sorted((proc / "task").glob("*")):
        try:
            wchan = (task / "wchan").read_text().strip() or "-"
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        parts.append(f"thread {task.name}: {state} {wchan}")
    return "; ".join(parts)
