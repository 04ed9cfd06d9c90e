"""Checkpoint buckets on a node: the bucket's files in place before setup, changes sent back.

A file mount `{name: B, store: s3}` (mode MOUNT, the default, or MOUNT_CACHED) is a bucket
the job keeps across recoveries. SkyPilot mounts it with a FUSE file system; here "mount" is
emulated by syncing, which needs nothing installed on the node:
- before setup, every object of the bucket is downloaded to the mount path (an empty bucket is
  fine; a bucket that does not exist yet is created);
- while the job runs, files that changed (size or modification time) are uploaded every
  SKYPURZA_CHECKPOINT_SYNC_S seconds (default 30), and files deleted since are deleted;
- when the run phase ends on this node (any exit code, a cancel included), a last upload.
A node that dies between two uploads loses at most one interval of writes: save checkpoints
more often than that (or write them to a temporary name and rename, as most frameworks do).
Mode COPY is download only. A named bucket with a local `source` starts from that source when
the bucket is empty.

Where buckets live: S3 on AWS nodes; on `local` nodes S3 when AWS is configured in the
environment, else a directory per bucket under the stage's state directory
(SKYPURZA_BUCKET_STORE=s3|dir forces one) — the rule the recovery service creates them by.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Protocol

from skypurza.events import naming
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.awsconfig import aws_config_files, aws_configured

from .mounts import remote_path
from .settings import AgentSettings

log = logging.getLogger("skypurza.agent.storage")

SYNCED_MODES = ("MOUNT", "MOUNT_CACHED")


class StorageError(Exception):
    pass


@dataclass(frozen=True)
class BucketMount:
    name: str
    dest: Path
    mode: str = "MOUNT"
    seed: Path | None = None  # local source for an empty bucket

    @property
    def writes_back(self) -> bool:
        return self.mode in SYNCED_MODES


def bucket_mounts(file_mounts: dict[str, Any] | None, home: Path) -> list[BucketMount]:
    """The file mounts that are checkpoint buckets (a storage mapping with store s3 and a name,
    whose source is absent, the bucket itself, or a local path to start from)."""
    out = []
    for dst, value in (file_mounts or {}).items():
        if not isinstance(value, dict) or str(value.get("store") or "").lower() != "s3" or not value.get("name"):
            continue
        name = str(value["name"])
        source = value.get("source")
        seed: Path | None = None
        if isinstance(source, str) and "://" not in source:
            seed = Path(os.path.expanduser(source))
        elif source is not None and source not in (f"s3://{name}", f"s3://{name}/"):
            continue  # another bucket's contents copied in: a plain file mount
        out.append(BucketMount(name, remote_path(dst, home), str(value.get("mode") or "MOUNT").upper(), seed))
    return out


def without(file_mounts: dict[str, Any] | None, buckets: list[BucketMount], home: Path) -> dict[str, Any]:
    taken = {b.dest for b in buckets}
    return {dst: v for dst, v in (file_mounts or {}).items() if remote_path(dst, home) not in taken}


# ---------------------------------------------------------------------------------- stores

class Store(Protocol):
    def ensure(self, bucket: str) -> None: ...
    def keys(self, bucket: str) -> list[str]: ...
    def get(self, bucket: str, key: str, path: Path) -> None: ...
    def put(self, bucket: str, key: str, path: Path) -> None: ...
    def delete(self, bucket: str, key: str) -> None: ...


class DirStore:
    """A bucket as a directory (local nodes without AWS: every node of this machine shares it)."""

    def __init__(self, root: Path):
        self.root = root

    def ensure(self, bucket: str) -> None:
        (self.root / bucket).mkdir(parents=True, exist_ok=True)

    def keys(self, bucket: str) -> list[str]:
        base = self.root / bucket
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()) if base.is_dir() else []

    def get(self, bucket: str, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.root / bucket / key, path)

    def put(self, bucket: str, key: str, path: Path) -> None:
        target = self.root / bucket / key
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        shutil.copy2(path, tmp)
        os.replace(tmp, target)  # readers never see half a checkpoint

    def delete(self, bucket: str, key: str) -> None:
        (self.root / bucket / key).unlink(missing_ok=True)


class S3Store:
    def __init__(self, client: Any = None):
        if client is None:
            import boto3
            from botocore.config import Config

            region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
            client = boto3.client("s3", region_name=region, config=Config(s3={"addressing_style": "path"}))
        self.s3 = client

    def ensure(self, bucket: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.s3.head_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                raise
            region = self.s3.meta.region_name
            params: dict[str, Any] = {"Bucket": bucket}
            if region and region != "us-east-1":
                params["CreateBucketConfiguration"] = {"LocationConstraint": region}
            self.s3.create_bucket(**params)

    def keys(self, bucket: str) -> list[str]:
        out: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            out += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
        return out

    def get(self, bucket: str, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.s3.download_file(bucket, key, str(path))

    def put(self, bucket: str, key: str, path: Path) -> None:
        self.s3.upload_file(str(path), bucket, key)

    def delete(self, bucket: str, key: str) -> None:
        self.s3.delete_object(Bucket=bucket, Key=key)


def store_kind(infra: str, env: dict[str, str] | None = None, aws_files: tuple[Path, ...] | None = None) -> str:
    """Where buckets live: the rule of recovery's `buckets.store_kind` (events/awsconfig.py)."""
    env = dict(os.environ) if env is None else env
    forced = (env.get("SKYPURZA_BUCKET_STORE") or "").lower()
    if forced in ("s3", "dir"):
        return forced
    if infra == "aws":
        return "s3"  # the instance profile's credentials are not in the environment
    if aws_files is None:
        aws_files = tuple(p for p in aws_config_files(env, Path.home()) if p.is_file())
    return "s3" if aws_configured(env, aws_files) else "dir"


def store_for(infra: str, stage: str, forced: str | None = None) -> Store:
    """`forced`: the agent's SKYPURZA_BUCKET_STORE, already checked (settings.py)."""
    if (forced or store_kind(infra)) == "s3":
        return S3Store()
    return DirStore(naming.state_dir(stage) / "buckets")


# ---------------------------------------------------------------------------------- syncing

@dataclass
class Syncer:
    """One job's checkpoint buckets on this node."""

    mounts: list[BucketMount]
    store: Store
    # (bucket, key) -> (size, mtime_ns) as last downloaded or uploaded
    known: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)

    def download(self) -> int:
        count = 0
        for m in self.mounts:
            try:
                self.store.ensure(m.name)
                keys = self.store.keys(m.name)
                m.dest.mkdir(parents=True, exist_ok=True)
                for key in keys:
                    path = m.dest / key
                    self.store.get(m.name, key, path)
                    self.known[(m.name, key)] = _stamp(path)
                    count += 1
                if not keys and m.seed is not None and m.seed.exists():
                    _copy_tree(m.seed, m.dest)
            except Exception as exc:
                raise StorageError(f"bucket {m.name} -> {m.dest}: {type(exc).__name__}: {exc}") from None
        return count

    def upload(self) -> int:
        """Send what changed since the last sync; delete what was removed. Returns files sent."""
        sent = 0
        for m in self.mounts:
            if not m.writes_back or not m.dest.is_dir():
                continue
            present: set[str] = set()
            for path, key in _files(m.dest):
                present.add(key)
                stamp = _stamp(path)
                if self.known.get((m.name, key)) == stamp:
                    continue
                self.store.put(m.name, key, path)
                if _stamp(path) == stamp:  # unchanged while it was sent: in sync
                    self.known[(m.name, key)] = stamp
                sent += 1
            for (bucket, key) in [k for k in self.known if k[0] == m.name and k[1] not in present]:
                self.store.delete(bucket, key)
                del self.known[(bucket, key)]
        return sent


def _files(root: Path) -> Iterator[tuple[Path, str]]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.endswith(".part"):
            yield path, path.relative_to(root).as_posix()


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _copy_tree(src: Path, dest: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dest, dirs_exist_ok=True)
    else:
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / src.name)


class Checkpoints:
    """What the agent holds: each running job's syncer and its periodic upload."""

    def __init__(self, infra: str, stage: str, interval: float | None = None, store: str | None = None):
        """`interval` and `store` come from the agent's settings (settings.py); `interval` None:
        SKYPURZA_CHECKPOINT_SYNC_S read and checked the same way."""
        self.infra = infra
        self.stage = stage
        self.interval = interval if interval is not None else AgentSettings.load().checkpoint_sync_s
        self.store = store
        self._jobs: dict[int, tuple[Syncer, asyncio.Task[None] | None]] = {}

    async def attach(self, job_id: int, file_mounts: dict[str, Any], home: Path, *, download: bool = True
                     ) -> dict[str, Any]:
        """Put the job's buckets in place and start sending changes back; returns the other
        file mounts (the agent's copy steps handle those)."""
        mounts = bucket_mounts(file_mounts, home)
        if not mounts or job_id in self._jobs:
            return without(file_mounts, mounts, home)
        syncer = Syncer(mounts, store_for(self.infra, self.stage, self.store))
        if download:
            n = await asyncio.to_thread(syncer.download)
            log.info("job %s: %d file(s) from %s", job_id, n, ", ".join(m.name for m in mounts))
        loop = asyncio.create_task(self._loop(syncer)) if any(m.writes_back for m in mounts) else None
        self._jobs[job_id] = (syncer, loop)
        return without(file_mounts, mounts, home)

    async def detach(self, job_id: int) -> None:
        """The last upload of a job's buckets (after its run phase ended on this node)."""
        entry = self._jobs.pop(job_id, None)
        if entry is None:
            return
        syncer, loop = entry
        if loop is not None:
            await stop_tasks(loop)
        try:
            await asyncio.to_thread(syncer.upload)
        except Exception as exc:
            log.warning("job %s: final checkpoint upload failed: %s", job_id, exc)

    async def _loop(self, syncer: Syncer) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.to_thread(syncer.upload)
            except Exception as exc:  # the next pass tries again
                log.warning("checkpoint upload failed: %s", exc)
