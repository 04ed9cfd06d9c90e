"""Checkpoint buckets of managed jobs: which file mounts are buckets, their names, creating them.

A file mount whose value is a storage mapping with `store: s3` and no local `source` is a
bucket the job keeps across recoveries (a training script saves checkpoints there and finds
them again on the next node). Its name is the task's `name`, or, when the task gives none,
one from the naming module that is fixed for the job and mount point. The recovery service
creates the bucket before the first launch; nodes download it before setup and upload what
changes (services/agent/storage.py).

Where buckets live: S3 when AWS is configured (credentials or an endpoint in the
environment), else a directory per bucket under the stage's state directory, which every
`local` node of this machine shares. SKYPURZA_BUCKET_STORE=s3|dir forces one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from skypurza.events import naming
from skypurza.events.awsconfig import aws_config_files, aws_configured
from skypurza.events.payloads import StorageMount, TaskPayload

_SLUG = re.compile(r"[^a-z0-9]+")


def is_checkpoint_mount(value: str | StorageMount) -> bool:
    if not isinstance(value, StorageMount) or not value.is_s3():
        return False
    if value.source is None:
        return True
    # A source that is the bucket itself is still the bucket; a local path or another URL is a copy.
    return bool(value.name) and value.source in (f"s3://{value.name}", f"s3://{value.name}/")


def checkpoint_buckets(task: TaskPayload, stage: str, job_id: int) -> tuple[TaskPayload, dict[str, str]]:
    """(the task with every checkpoint mount named, {mount point: bucket name})."""
    named: dict[str, str] = {}
    out_mounts: dict[str, Any] = {}
    for dst, value in (task.file_mounts or {}).items():
        if isinstance(value, StorageMount) and (
                is_checkpoint_mount(value) or (value.is_s3() and not value.name and _is_local(value.source))):
            name = value.name or default_bucket_name(stage, job_id, dst)
            named[dst] = name
            value = value.edited(name=name)
        out_mounts[dst] = value if isinstance(value, str) else value.to_dict()
    if not named:
        return task, {}
    return task.edited(file_mounts=out_mounts), named


def default_bucket_name(stage: str, job_id: int, mount_point: str) -> str:
    slug = _SLUG.sub("-", mount_point.lower()).strip("-") or "root"
    return naming.bucket(stage, f"job{job_id}-{slug}")


def _is_local(source: Any) -> bool:
    return isinstance(source, str) and "://" not in source


def store_kind(env: dict[str, str] | None = None, aws_files: tuple[Path, ...] | None = None) -> str:
    """`s3` when AWS is configured (events/awsconfig.py: the agent's `storage.store_kind` uses the
    same rule, so the bucket is where the agent syncs), else `dir`; SKYPURZA_BUCKET_STORE forces."""
    env = dict(os.environ) if env is None else env
    forced = (env.get("SKYPURZA_BUCKET_STORE") or "").lower()
    if forced in ("s3", "dir"):
        return forced
    if aws_files is None:
        aws_files = tuple(p for p in aws_config_files(env, Path.home()) if p.is_file())
    return "s3" if aws_configured(env, aws_files) else "dir"


def dir_root(stage: str) -> Path:
    return naming.state_dir(stage) / "buckets"


def ensure_bucket(stage: str, name: str, *, kind: str | None = None, region: str | None = None) -> str:
    """Create the bucket unless it exists (blocking; run it in a thread). Returns where it is."""
    kind = kind or store_kind()
    if kind == "dir":
        path = dir_root(stage) / name
        path.mkdir(parents=True, exist_ok=True)
        return str(path)
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    region = region or os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
    s3 = boto3.client("s3", region_name=region, config=Config(s3={"addressing_style": "path"}))
    params: dict[str, Any] = {"Bucket": name}
    if region != "us-east-1":
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        s3.create_bucket(**params)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
        if exc.response.get("Error", {}).get("Code") == "BucketAlreadyExists":
            s3.head_bucket(Bucket=name)  # someone else's bucket of that name raises here
    return f"s3://{name}"
