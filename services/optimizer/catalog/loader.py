"""Find and load the catalog, fast from a cold process.

Which file: `path` if given; else `$SKYPURZA_CATALOG`; else the user's refreshed catalog
(`spz catalog refresh` writes it under the SkyPurza home); else the file shipped in this
package. One JSON decode and plain tuples: no pandas, no pydantic, no CSV parsing.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import codec
from .model import Catalog

SHIPPED_FILE = Path(__file__).with_name("aws.json")
ENV_PATH = "SKYPURZA_CATALOG"

_cache: dict[tuple[str, int, int], Catalog] = {}


def user_catalog_file(cloud: str = "aws") -> Path:
    """`<SkyPurza home>/catalog/<cloud>.json`: prices are not per stage, so not under a stage."""
    from skypurza.events import naming

    return naming.home_dir() / "catalog" / f"{cloud}.json"


def catalog_path(path: str | os.PathLike[str] | None = None, cloud: str = "aws") -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get(ENV_PATH)
    if env:
        return Path(env)
    user = user_catalog_file(cloud)
    if user.is_file():
        return user
    return SHIPPED_FILE


def load_catalog(path: str | os.PathLike[str] | None = None, *, cloud: str = "aws", use_cache: bool = True) -> Catalog:
    """The catalog to place with (cached per file path and modification time)."""
    p = catalog_path(path, cloud)
    st = p.stat()
    key = (str(p), st.st_mtime_ns, st.st_size)
    if use_cache and key in _cache:
        return _cache[key]
    cat = codec.loads(p.read_bytes())
    if use_cache:
        _cache.clear()
        _cache[key] = cat
    return cat


def shipped_catalog() -> Catalog:
    return load_catalog(SHIPPED_FILE)


def save_catalog(cat: Catalog, path: str | os.PathLike[str] | None = None) -> Path:
    """Write atomically (a reader never sees half a file); default: the user's catalog file."""
    p = Path(path) if path is not None else user_catalog_file(cat.cloud)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    tmp.write_text(codec.dumps(cat))
    os.replace(tmp, p)
    return p
