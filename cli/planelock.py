"""The exclusive lock that serialises start, stop and restart of one stage's control plane.

An `flock` on a file in the stage's state directory: the kernel drops it when its holder dies,
so a crashed `spz` never leaves the stage locked. A second starter waits for the first, then sees
the control plane the first one started and uses it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class LockTimeout(Exception):
    pass


@contextmanager
def exclusive(path: Path, timeout: float, what: str = "the control plane") -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _holder(fd)
                    raise LockTimeout(
                        f"another spz (pid {holder or '?'}) has been starting or stopping {what} for over "
                        f"{timeout:.0f}s (lock {path}); try again, or see spz api logs") from None
                time.sleep(0.02)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip()
    except OSError:
        return ""
