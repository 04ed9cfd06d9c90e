"""pydantic's plug-in lookup without importlib.metadata where no plug-in is installed (issue 21).

pydantic looks its plug-ins up (the `pydantic` entry-point group) when it builds the first
validator: `pydantic.plugin._loader` imports importlib.metadata and reads every installed
distribution's metadata, ~20-50 ms of a cold `spz check-yaml` that most machines spend finding
none. `declared()` reads only the `entry_points.txt` files themselves, where importlib.metadata
would find them. `install()`, when none declares the group, puts a stand-in for that module in
`sys.modules` whose `get_plugins()` returns no plug-in — what the real one returns then — and
whose every other name is the real module's (imported then, replacing the stand-in). When a
plug-in is declared, or the lookup could see what this scan cannot (a zip or an egg on
sys.path, a finder of distributions besides the standard one), nothing is installed and pydantic
looks them up as ever (tests/test_cli_fastpath.py runs a real plug-in both ways). The same trick
as events/natslight.py and cli/richlight.py play on nats-py and typer.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import re
import sys
import types
from collections.abc import Iterable
from typing import Any

TARGET = "pydantic.plugin._loader"
_GROUP = re.compile(r"^\s*\[\s*pydantic\s*\]", re.MULTILINE)


def declared(paths: Iterable[str]) -> bool | None:
    """True when a distribution on `paths` declares a pydantic plug-in, False when none does,
    None when this scan cannot tell (importlib.metadata could see more)."""
    if any(hasattr(f, "find_distributions") and f is not importlib.machinery.PathFinder for f in sys.meta_path):
        return None
    for entry in paths:
        try:
            children = os.scandir(entry or ".")
        except NotADirectoryError:
            return None  # a zip on sys.path
        except OSError:
            continue  # missing: importlib.metadata finds nothing there either
        with children:
            for child in children:
                name = child.name.lower()
                if name.endswith(".egg"):
                    return None
                if not name.endswith((".dist-info", ".egg-info")):
                    continue
                try:
                    with open(os.path.join(child.path, "entry_points.txt"), encoding="utf-8") as f:
                        text = f.read()
                except (FileNotFoundError, NotADirectoryError):
                    continue  # no entry points (or a one-file egg-info)
                except (OSError, UnicodeDecodeError):
                    return None
                if _GROUP.search(text):
                    return True
    return False


class _StandIn(types.ModuleType):
    """`pydantic.plugin._loader` for a process with no plug-in installed."""

    @staticmethod
    def get_plugins() -> tuple[()]:
        return ()

    def __getattr__(self, name: str) -> Any:  # anything else: the real module, from now on
        if name.startswith("__"):  # the import system's probes (__path__ ...): a plain module's answer
            raise AttributeError(name)
        if sys.modules.get(TARGET) is self:
            del sys.modules[TARGET]
        return getattr(importlib.import_module(TARGET), name)  # also the package's attribute again


_scans: dict[tuple[str, ...], bool | None] = {}


def none_declared() -> bool:
    """True when this scan is sure that no distribution on sys.path declares a pydantic plug-in
    (scanned once per sys.path). A plain task is then read without the models (cli/fastpath.py):
    where a plug-in is installed, it sees every task validated, as it would on typer's path."""
    key = tuple(sys.path)
    if key not in _scans:
        _scans[key] = declared(key)
    return _scans[key] is False


def install() -> bool:
    """The stand-in, when no plug-in is installed and pydantic has not looked yet; True when it did."""
    if TARGET in sys.modules or not none_declared():
        return False
    import pydantic.plugin  # the package (light: its protocol types), so the stand-in is its attribute too

    sys.modules[TARGET] = stand_in = _StandIn(TARGET)
    pydantic.plugin._loader = stand_in  # type: ignore[attr-defined]
    return True
