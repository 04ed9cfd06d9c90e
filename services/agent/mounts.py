"""Putting a job's workdir and file mounts in place on a node.

SkyPilot syncs the workdir to `~/sky_workdir` and each file mount to its destination. Here:
- a local path is copied (on `local` nodes the path is on this machine; on a cloud node the
  agent takes it from the object store when the CLI sent it — fetch.py, events/uploads.py —
  else it must exist on the node, e.g. a shared file system);
- `s3://bucket/prefix` is downloaded with boto3 (a prefix becomes a directory);
- a git workdir `{url, ref}` is cloned;
- a storage mapping `{source: ...}` or `{name: bucket}` is read as its source or as s3://<name>.
`~` in a destination is the node's home (on `local`, each node's own directory).

A directory is copied without what its `.skyignore` (else its `.gitignore` files) exclude, as
SkyPilot syncs it (syncignore.py). On `local` nodes a destination outside the node's home
(`/data`) would write into this machine's real file system as the invoking user: it is refused
unless the user allowed it (`SKYPURZA_LOCAL_HOST_PATHS=1` where the control plane runs).
An object store other than S3 (`store: gcs`, `azure`, `r2`, ...) is refused by name.

`plan()` is pure; `apply_step()` does the copying (the agent runs it in a thread).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


SKY_WORKDIR = "sky_workdir"


class SyncError(Exception):
    pass


HOST_PATHS_ENV = "SKYPURZA_LOCAL_HOST_PATHS"
SUPPORTED_STORES = ("s3",)


def host_paths_allowed(environ: dict[str, str] | os._Environ) -> bool:  # type: ignore[type-arg]
    return environ.get(HOST_PATHS_ENV, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Step:
    kind: str  # "copy", "s3", "git"
    source: str
    dest: Path
    ref: str | None = None


def remote_path(dst: str, home: Path) -> Path:
    """A destination as the node sees it: `~/x` and relative paths live in the node's home."""
    if dst == "~" or dst.startswith("~/"):
        return home / dst[2:] if dst != "~" else home
    p = Path(dst)
    return p if p.is_absolute() else home / p


def plan(workdir: Any, file_mounts: dict[str, Any] | None, home: Path, *, confined: bool = False) -> list[Step]:
    """The copy steps for a task's workdir and file mounts (task values already substituted).

    `confined` (a `local` node without the user's consent): a destination outside `home` is
    refused (SyncError), before anything is copied."""
    if confined:
        for dst in (file_mounts or {}):
            dest = remote_path(dst, home)
            if not _inside(dest, home):
                raise SyncError(
                    f"file mount {dst}: on the local infra this would write into this machine's own file "
                    f"system ({dest}) as you; use a destination under ~ (each local node has its own home), "
                    f"or allow it with {HOST_PATHS_ENV}=1 where the control plane runs (spz api restart)")
    steps: list[Step] = []
    if isinstance(workdir, str):
        steps.append(_step(workdir, home / SKY_WORKDIR))
    elif isinstance(workdir, dict) and workdir.get("url"):
        steps.append(Step("git", str(workdir["url"]), home / SKY_WORKDIR, workdir.get("ref")))
    for dst, src in (file_mounts or {}).items():
        dest = remote_path(dst, home)
        if isinstance(src, str):
            steps.append(_step(src, dest))
        elif isinstance(src, dict):
            source = src.get("source")
            if isinstance(source, list):
                for item in source:
                    steps.append(_step(str(item), dest / Path(str(item).rstrip("/")).name))
            elif isinstance(source, str):
                steps.append(_step(source, dest))
            elif src.get("name"):
                store = str(src.get("store") or "s3").lower()
                if store not in SUPPORTED_STORES:
                    steps.append(Step("unsupported", f"store: {store} (bucket {src['name']})", dest))
                else:
                    steps.append(Step("s3", f"s3://{src['name']}", dest))
    return steps


def _inside(path: Path, home: Path) -> bool:
    p, h = os.path.normpath(path), os.path.normpath(home)
    return p == h or p.startswith(h + os.sep)


def _step(source: str, dest: Path) -> Step:
    if source.startswith("s3://"):
        return Step("s3", source, dest)
    if "://" in source:
        return Step("unsupported", source, dest)
    return Step("copy", os.path.expanduser(source), dest)


def apply_step(step: Step) -> None:
    if step.kind == "copy":
        _copy(Path(step.source), step.dest)
    elif step.kind == "s3":
        _s3(step.source, step.dest)
    elif step.kind == "git":
        _git(step.source, step.ref, step.dest)
    else:
        raise SyncError("not supported yet; use a local path, an s3:// bucket (store: s3) or a git workdir")


def _copy(src: Path, dest: Path) -> None:
    if not src.exists():
        raise SyncError(f"{src} does not exist on this node")
    try:
        if src.is_dir():
            from . import syncignore  # pathspec: only a copied directory needs it (issue 21: light start)

            shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True, ignore=syncignore.ignore_for(src))
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
    except OSError as exc:
        raise SyncError(f"cannot copy {src} to {dest}: {exc.strerror or exc}") from None


def _s3(url: str, dest: Path) -> None:
    try:
        import boto3
    except ImportError:  # pragma: no cover - boto3 is a dependency
        raise SyncError("boto3 is not installed on this node") from None
    bucket, _, prefix = url[len("s3://"):].partition("/")
    try:
        s3 = boto3.client("s3")
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        if not keys:
            raise SyncError(f"{url}: no such object or prefix")
        if keys == [prefix] and prefix:
            dest.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, prefix, str(dest))
            return
        base = prefix.rstrip("/") + "/" if prefix else ""
        for k in keys:
            if k.endswith("/"):
                continue
            target = dest / k[len(base):]
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, k, str(target))
    except SyncError:
        raise
    except Exception as exc:
        raise SyncError(f"{url}: {type(exc).__name__}: {exc}") from None


def _git(url: str, ref: str | None, dest: Path) -> None:
    if dest.exists() and any(dest.iterdir()):
        shutil.rmtree(dest)
    cmd = ["git", "clone", "--quiet", url, str(dest)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SyncError(f"git clone {url} failed: {res.stderr.strip()[-500:]}")
    if ref:
        res = subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", ref], capture_output=True, text=True,
                             timeout=120)
        if res.returncode != 0:
            raise SyncError(f"git checkout {ref} failed: {res.stderr.strip()[-500:]}")
