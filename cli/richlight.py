"""typer's help renderer without the two rich modules it imports and `spz` never uses.

Why: `typer.rich_utils` (imported to print any `--help` or usage error) imports `rich.markdown`
(markdown_it, pygments) and `rich.traceback` (rich.pretty, attrs) at its top: ~150-200 ms of
every `spz --help`, for `rich_markup_mode="markdown"` (ours is "rich") and for pretty
tracebacks (ours are off: `pretty_exceptions_enable=False`). `install()` lets `typer.rich_utils`
import with stand-ins for `Markdown` and `Traceback` that import the real class the first time
one is used, so nothing changes if typer ever does use them. Only `typer.rich_utils` sees the
stand-ins: the real `rich.markdown` and `rich.traceback` stay importable by anyone, untouched
(the same trick as events/natslight.py plays on nats-py's aiohttp).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

TARGET = "typer.rich_utils"
DEFERRED = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}


class _Deferred(type):
    """A stand-in class: calling it, or reading any attribute of it, is the real class's."""

    def _real(cls) -> Any:
        return getattr(importlib.import_module(cls._module), cls.__name__)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._real()(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:  # Traceback.from_exception, ...
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(cls._real(), name)


def _stand_in(module: str, name: str) -> types.ModuleType:
    stub = types.ModuleType(module)
    setattr(stub, name, _Deferred(name, (), {"_module": module}))
    return stub


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename ...: the real loader's
        return getattr(self.real, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stubs = {m: _stand_in(m, n) for m, n in DEFERRED.items() if m not in sys.modules}
        sys.modules.update(stubs)
        try:
            self.real.exec_module(module)
        finally:
            for m, stub in stubs.items():
                if sys.modules.get(m) is stub:
                    del sys.modules[m]


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # once: the real finders locate it
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Before typer's help renderer is first imported; a no-op once it is, or when it is pending."""
    if TARGET in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
