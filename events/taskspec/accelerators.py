"""Canonical accelerator names: `a100` -> `A100`, as SkyPilot's catalog spells them.

An accelerator we do not know stays valid (SkyPilot accepts it too); we only normalise the
spelling of known ones and offer a "did you mean" for near misses.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from functools import lru_cache

# Forms that are not catalog names and must not get a "did you mean": TPU slice names
# (tpu-v4-8), GPU memory requests (80GB+, 48GB).
_NOT_A_CATALOG_NAME = re.compile(r"^(tpu-.*|\d+(\.\d+)?[kmgtp]i?b?\+?)$", re.IGNORECASE)


@lru_cache(maxsize=1)
def catalog() -> dict[str, tuple[str, ...]]:
    """Canonical name -> clouds that offer it (from the packaged accelerators.json)."""
    data = json.loads(_packaged("accelerators.json"))["accelerators"]
    return {name: tuple(clouds) for name, clouds in data.items()}


def _packaged(name: str) -> str:
    """A data file next to this module; through importlib.resources only where it is not a plain
    file (a zipped install): importing importlib.resources is ~5 ms of every cold check-yaml."""
    try:
        with open(os.path.join(os.path.dirname(__file__), name), encoding="utf-8") as f:
            return f.read()
    except OSError:
        from importlib import resources

        return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _by_lower() -> dict[str, str]:
    return {name.lower(): name for name in catalog()}


def canonical_name(name: str) -> str:
    """The catalog's spelling of `name` (case-insensitive match), or `name` unchanged."""
    return _by_lower().get(name.lower(), name)


def is_known(name: str) -> bool:
    return name.lower() in _by_lower()


_MEMORY_SUFFIX = re.compile(r"^(.+)-(\d+)GB$", re.IGNORECASE)


def suggest(name: str) -> list[str]:
    """Close catalog names for an unknown accelerator name (empty when it is known or not a name)."""
    if is_known(name) or _NOT_A_CATALOG_NAME.match(name):
        return []
    lowered = _by_lower()
    matches = [lowered[m] for m in difflib.get_close_matches(name.lower(), list(lowered), n=2, cutoff=0.75)]
    # "A100-40GB": the catalog names the base variant without its memory (A100 is the 40 GB one).
    sized = _MEMORY_SUFFIX.match(name)
    if sized and sized[1].lower() in lowered:
        matches = [lowered[sized[1].lower()], *(m for m in matches if m.lower() != sized[1].lower())][:2]
    return matches
