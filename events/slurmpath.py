"""Where SkyPilot's Slurm config is (`~/.slurm/config`; SKYPURZA_SLURM_CONFIG moves it), in a
module light enough for a cold command to ask whether there is one at all before it imports the
parser (events/slurm_config.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DEFAULT_CONFIG = "~/.slurm/config"  # SkyPilot's


def slurm_config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(os.path.expanduser(env.get("SKYPURZA_SLURM_CONFIG") or DEFAULT_CONFIG))
