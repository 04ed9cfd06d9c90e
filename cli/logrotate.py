"""The control plane's logs kept bounded (cli/supervisor.py): nats-server's, the services', the
API server's and the CLI worker's output goes to one file each under the stage's logs directory,
and a deployment runs for months. When a file passes its limit it is copied to `<name>.1` (the
one older file kept, replaced) and cut to nothing in place: the child keeps writing to the file
it holds open, which it opened for appending, so its next line lands at the new start.

What a child writes between the copy and the cut (microseconds) is lost; no child is restarted
and no descriptor changes hands, which a rename would need. So a log takes at most twice its
limit on disk.

    SKYPURZA_LOG_MAX_MB=64    # per log file (config: logs.max_mb); 1 to 100000
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_MAX_MB = 64
CHECK_EVERY_S = 2.0  # how often the supervisor looks at the sizes


def max_bytes(env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> int:
    """The limit per log file, from SKYPURZA_LOG_MAX_MB or config.yaml's `logs.max_mb` (checked:
    one line naming the variable when out of range)."""
    from skypurza.events.settings import Sources

    src = Sources.load(env, config, tolerate_broken_config=True)
    return src.integer("SKYPURZA_LOG_MAX_MB", DEFAULT_MAX_MB, low=1, high=100_000, key="logs.max_mb") << 20


def older(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def rotate_if_large(path: Path, limit: int) -> bool:
    """Copy `path` to `<path>.1` and cut it to nothing when it is larger than `limit` bytes;
    True when it did. A file that is not there, or cannot be copied, is left as it is."""
    try:
        if path.stat().st_size <= limit:
            return False
        tmp = path.with_name(path.name + ".1.tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, older(path))
        os.truncate(path, 0)
    except OSError:
        return False
    return True
