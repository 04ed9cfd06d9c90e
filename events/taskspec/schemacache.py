"""Task-model validators kept between processes, so a cold `spz check-yaml` or dry run builds none
(issue 21).

The task models are `defer_build` (_base.py): the first task validated in a process builds the
tree under `Task` — pydantic generating ~300 fields' core schema in Python, 30-50 ms, the largest
single cost of a cold check-yaml. The result only changes with the code, so `Strict.model_rebuild`
and `Open.model_rebuild` (the hook pydantic's deferred build goes through) ask `load` first, and
`store` what a real build made: the core schema with its validator and serializer, pickled
(pydantic-core pickles a validator as its schema and config and rebuilds it in Rust, ~5 ms).

The cached schema is used only while everything that shaped it is unchanged: the file records
each module file of ours loaded at the build (the task models, `events/limits.py`, whatever else
was loaded by then) and of the libraries that generate schemas (pydantic, pydantic-core,
annotated_types, typing_extensions, typing_inspection), with its mtime and size — as Python's own bytecode cache does — and the key
names the Python, pydantic and pydantic-core versions, the model and the file that defines it, so
two installs of spz for one user (a virtualenv and a checkout, two virtualenvs) never take each
other's entries: the stamps of one install say nothing of the other's files. An edit, an upgrade
or a checkout builds again. A model with a pydantic plug-in, computed fields or deprecated fields is
never cached (their build does more than the schema), nor one built with a forced rebuild.

A pickle runs code when read, so only a file that this user owns and nobody else may write, in
a directory the same holds of, is read; it is written 0600 through a temporary file and an
atomic rename (two processes storing at once leave one whole file). Anything unusual (a file
that cannot be read or unpickled, a stale entry, a read-only home) builds as pydantic would,
and `SKYPURZA_SCHEMA_CACHE=0` turns the cache off. The schemas' callables are classes and
module-level functions for this reason (_base.py `_RejectNull`, `_Pick`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import stat
import sys
from pathlib import Path
from typing import Any

from skypurza.events.filestamps import module_stamps, unchanged

_LIBRARIES = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection")
# Every module of ours loaded when the validator was built: the models' own, whatever they import,
# and any model subclassing ours from elsewhere (an edit to one that had no say only costs a build).
_OURS = ("skypurza",)
MAX_CACHE_BYTES = 16 << 20  # a task model's schema pickles to ~50 kB; a bigger file is not ours
FORMAT = 1

# What the last install or build of each model did, by qualified name: "cache" or "built"
# (tests assert the cached path is the one taken).
source: dict[str, str] = {}


def enabled(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get("SKYPURZA_SCHEMA_CACHE", "1") != "0"


def cache_file(model: type) -> Path:
    from skypurza.events import naming

    import pydantic
    import pydantic_core

    defined_in = getattr(sys.modules.get(model.__module__), "__file__", None) or ""
    key = "\0".join((str(FORMAT), sys.version, pydantic.VERSION, pydantic_core.__version__, defined_in,
                     model.__module__, model.__qualname__))
    return naming.schema_cache_file(hashlib.sha256(key.encode()).hexdigest()[:32])


def _tracked(name: str) -> bool:
    return name.split(".")[0] in _LIBRARIES or any(name == p or name.startswith(p + ".") for p in _OURS)


def cacheable(model: Any) -> bool:
    """A model whose build is its core schema, validator and serializer and nothing more."""
    from pydantic_core import SchemaSerializer, SchemaValidator

    if getattr(model, "__pydantic_decorators__", None) is None or model.__pydantic_decorators__.computed_fields:
        return False
    if any(f.deprecation_message is not None for f in model.__pydantic_fields__.values()):
        return False
    return (type(getattr(model, "__pydantic_validator__", None)) is SchemaValidator
            and type(getattr(model, "__pydantic_serializer__", None)) is SchemaSerializer)


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def load(model: Any) -> bool:
    """Install `model`'s validator and serializer from the cache; False (nothing changed) when
    there is no usable entry."""
    if not enabled() or model.__dict__.get("__pydantic_complete__", False):
        return False
    if not model.__pydantic_fields_complete__ or model.__pydantic_decorators__.computed_fields:
        return False
    path = cache_file(model)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and _private(st) and st.st_size <= MAX_CACHE_BYTES
                and _private(os.stat(path.parent))):
            return False
        with os.fdopen(fd, "rb", closefd=False) as f:
            entry = pickle.load(f)
        files, schema, validator, serializer = entry
        if not unchanged(files):
            return False
        from pydantic_core import SchemaSerializer, SchemaValidator

        if type(validator) is not SchemaValidator or type(serializer) is not SchemaSerializer:
            return False
    except Exception:  # noqa: BLE001 - a truncated, foreign or old file: build as pydantic would
        return False
    finally:
        os.close(fd)
    if _has_plugins():
        return False
    # What pydantic's complete_model_class sets for such a model (cacheable), in its order.
    model.__pydantic_core_schema__ = schema
    model.__pydantic_validator__ = validator
    model.__pydantic_serializer__ = serializer
    model.__pydantic_complete__ = True
    source[model.__qualname__] = "cache"
    return True


def _has_plugins() -> bool:
    # With a pydantic plug-in installed, pydantic wraps every validator; a cached bare one would
    # bypass it. (cli/pydplugins.py makes this lookup cheap where none is installed.)
    from pydantic.plugin._loader import get_plugins

    return any(True for _ in get_plugins())


def store(model: Any) -> None:
    """Keep what a real build of `model` made, for the next process (best effort)."""
    source[model.__qualname__] = "built"
    if not enabled() or not cacheable(model) or _has_plugins():
        return
    path = cache_file(model)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(os.stat(path.parent)):
            return
        blob = pickle.dumps((module_stamps(_tracked), model.__pydantic_core_schema__, model.__pydantic_validator__,
                             model.__pydantic_serializer__), protocol=pickle.HIGHEST_PROTOCOL)
        if len(blob) > MAX_CACHE_BYTES:
            return
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)  # atomic: a process reading at the same time sees the old file or the new
    except Exception:  # noqa: BLE001 - unpicklable, a read-only home: only the next process is slower
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
