"""Local workdirs and file-mount sources, sent to cloud nodes through the bus's object store.

A node that is not this machine cannot read the user's `~/proj`. At submit the CLI packs each
local source (a directory: events/workdir_archive.py, by the sync's ignore rules; a file: its
bytes), names the object by the content's sha256 (`naming.upload_object`) in the stage's object
store (`naming.objects_bucket`), sends it only when no object of that name is there, and the
task carries `uploads: {path: UploadRef}` (events/payloads.py). The agent of a cloud node
downloads by digest, checks the sha256 of what it got, and unpacks (services/agent/fetch.py).

Old objects: the bucket's streams keep an object `OBJECT_TTL_S` (30 days) after it was last
sent; a submit that finds its object older than half of that sends it again, so any job
submitted in the last 15 days finds its workdir for at least 15 more (a managed job's recovery
included). The same content sent by anyone is one object.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable

from . import naming
from .payloads import UploadRef

if TYPE_CHECKING:  # nats is imported where used: importing this module stays cheap
    from nats.js import api

OBJECT_TTL_S = 30 * 24 * 3600
REFRESH_AFTER_S = OBJECT_TTL_S // 2
CHUNK_BYTES = 128 * 1024

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


class UploadError(Exception):
    """An object cannot be sent or fetched, or is not what its digest says: the message says why."""


def local_sources(public: dict[str, Any]) -> list[str]:
    """Pure: the local paths a task's public form names (workdir, file-mount sources), in order,
    as `localise` made them (absolute); URLs and git workdirs are not local."""
    out: list[str] = []

    def add(value: Any) -> None:
        if isinstance(value, str) and "://" not in value and value.startswith("/") and value not in out:
            out.append(value)

    add(public.get("workdir"))
    for src in (public.get("file_mounts") or {}).values():
        add(src.get("source") if isinstance(src, dict) else src)
    return out


def may_run_elsewhere(request_clouds: list[str | None], enabled_infras: frozenset[str]) -> bool:
    """Pure: may a task with these resource alternatives (their `cloud`, None when unnamed) be
    placed on a node that is not this machine? `enabled_infras` is what placement may use for
    a task that names none (the optimizer's rule)."""
    clouds = [(c or "").strip().lower() or None for c in request_clouds] or [None]
    for c in clouds:
        if c is None and any(i != "local" for i in enabled_infras):
            return True
        if c is not None and c != "local":
            return True
    return False


# ------------------------------------------------------------------------- the object store

async def object_store(bus: Any) -> Any:
    """The stage's object store (made on first use)."""
    import nats.js.errors

    bucket = naming.objects_bucket(bus.stage)
    try:
        return await bus.js.object_store(bucket)
    except (nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
        return await bus.js.create_object_store(bucket, config=object_store_config(
            bus.stage, bus.settings.replicas if hasattr(bus, "settings") else 1))


def object_store_config(stage: str, replicas: int) -> api.ObjectStoreConfig:
    """Pure: the stage's object store, as `object_store` makes it and a
    deployment's node set-up does (infra/busconfig.py `stream_definitions`): one definition."""
    from nats.js import api

    return api.ObjectStoreConfig(bucket=naming.objects_bucket(stage), ttl=OBJECT_TTL_S,
                                 description="uploaded workdirs and file-mount sources, by sha256",
                                 replicas=replicas)


async def object_info(obs: Any, digest: str) -> Any | None:
    import nats.js.errors

    try:
        return await obs.get_info(naming.upload_object(digest))
    except nats.js.errors.NotFoundError:
        return None


def is_fresh(info: Any, size: int, now: dt.datetime) -> bool:
    """Pure: an object of the right size, sent less than REFRESH_AFTER_S ago (else send it again)."""
    if info is None or info.deleted or info.size != size or not info.mtime:
        return False
    try:
        sent = dt.datetime.fromisoformat(str(info.mtime).replace("Z", "+00:00"))
    except ValueError:
        return False
    if sent.tzinfo is None:
        sent = sent.replace(tzinfo=dt.timezone.utc)
    return (now - sent).total_seconds() < REFRESH_AFTER_S


class _Reading(io.RawIOBase):
    """A file read in chunks for nats-py's put, telling `progress` how far it is."""

    def __init__(self, f: BinaryIO, total: int, progress: Progress | None) -> None:
        self.f, self.total, self.progress, self.done = f, total, progress, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:  # type: ignore[override]
        n = self.f.readinto(b)  # type: ignore[attr-defined]
        self.done += n or 0
        if self.progress is not None and n:
            self.progress(self.done, self.total)
        return n or 0


@dataclass(frozen=True)
class Sent:
    ref: UploadRef
    uploaded: bool  # False: the object was there already


async def send_file(bus: Any, path: Path, ref: UploadRef, *, now: dt.datetime,
                    progress: Progress | None = None) -> Sent:
    """Put `path` (whose sha256 is `ref.digest`) in the object store unless a copy fresh at `now`
    is there."""
    import nats.errors
    from nats.js import api

    try:
        obs = await object_store(bus)
        if is_fresh(await object_info(obs, ref.digest), ref.size, now):
            return Sent(ref, False)
        name = naming.upload_object(ref.digest)
        with open(path, "rb") as f:
            await obs.put(name, _Reading(f, ref.size, progress),
                          meta=api.ObjectMeta(name=name, options=api.ObjectMetaOptions(max_chunk_size=CHUNK_BYTES)))
    except nats.errors.Error as exc:
        raise UploadError(f"the object store did not take it: {type(exc).__name__}: {exc}") from None
    return Sent(ref, True)


def file_ref(path: Path, max_bytes: int) -> UploadRef:
    """The UploadRef of one file (its own bytes are the object)."""
    size = path.stat().st_size
    if size > max_bytes:
        from .workdir_archive import TooLarge

        raise TooLarge(size, max_bytes)
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1024 * 1024), b""):
            sha.update(block)
    return UploadRef(digest="sha256:" + sha.hexdigest(), kind="file", size=size)


async def fetch(bus: Any, ref: UploadRef, dest: Path, *, max_bytes: int, timeout_s: float | None = None) -> None:
    """Download `ref` into the file `dest`, refusing anything that is not exactly its digest:
    an object larger than it says or than `max_bytes`, a link to another object, different bytes
    (UploadError). Never waits for ever: `timeout_s` (default from the size)."""
    import nats.errors

    if ref.size > max_bytes:
        raise UploadError(f"object {ref.digest} is {ref.size:,} bytes, more than {max_bytes:,}")
    try:
        obs = await object_store(bus)
        info = await object_info(obs, ref.digest)
    except nats.errors.Error as exc:
        raise UploadError(f"object {ref.digest}: the object store does not answer: {type(exc).__name__}") from None
    if info is None:
        raise UploadError(f"object {ref.digest} is not in the object store {naming.objects_bucket(bus.stage)} "
                          f"(kept {OBJECT_TTL_S // 86400} days after it was sent): launch the task again")
    if info.is_link() or info.size != ref.size:
        raise UploadError(f"object {ref.digest} is not what the task sent (size {info.size} for {ref.size}, "
                          f"or a link)")
    sink = _Bounded(dest, ref.size)
    timeout = timeout_s if timeout_s is not None else 120 + ref.size / (512 * 1024)
    try:
        with sink:
            await asyncio.wait_for(obs.get(naming.upload_object(ref.digest), writeinto=sink), timeout)
    except asyncio.TimeoutError:
        raise UploadError(f"object {ref.digest}: not fetched within {timeout:.0f} s") from None
    except (nats.errors.Error, OSError, _Overflow) as exc:
        raise UploadError(f"object {ref.digest}: {type(exc).__name__}: {exc}") from None
    got = "sha256:" + sink.sha.hexdigest()
    if got != ref.digest or sink.size != ref.size:
        raise UploadError(f"object {ref.digest}: its content does not match its digest (got {got}, "
                          f"{sink.size:,} bytes): refused")


class _Overflow(Exception):
    pass


class _Bounded(io.RawIOBase):
    """The file an object is written into: hashed as it arrives, and never past `limit` bytes."""

    def __init__(self, path: Path, limit: int) -> None:
        self.f = open(path, "wb")
        self.limit = limit
        self.size = 0
        self.sha = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:  # type: ignore[override]
        self.size += len(b)
        if self.size > self.limit:
            raise _Overflow(f"more bytes than the {self.limit:,} it claims")
        self.sha.update(b)
        self.f.write(b)
        return len(b)

    def close(self) -> None:
        if not self.f.closed:
            self.f.close()
        super().close()
