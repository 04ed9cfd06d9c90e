"""What a cache keyed on code records of it, and checks before it serves: each module file's
(path, mtime_ns, size), as Python's own bytecode cache does. Stdlib only: the cold CLI's caches
use it (cli/helpcache.py, the top-level help text; events/taskspec/schemacache.py, the task
models' validators).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any


def module_stamps(select: Callable[[str], bool] | None = None) -> list[list[Any]]:
    """[file, mtime_ns, size] of each loaded module (whose name `select` accepts), sorted."""
    out = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and (select is None or select(name)):
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append([path, st.st_mtime_ns, st.st_size])
    return sorted(out)


def unchanged(stamps: Any) -> bool:
    """Every recorded file still has its mtime and size (False for no stamps or a malformed one)."""
    if not isinstance(stamps, list) or not stamps:
        return False
    for entry in stamps:
        try:
            path, mtime, size = entry
            st = os.stat(path)
        except (OSError, TypeError, ValueError):
            return False
        if (st.st_mtime_ns, st.st_size) != (mtime, size):
            return False
    return True
