"""At submit: send the task's local workdir and file-mount sources to the object store.

Only when the task may run on a node that is not this machine (`may_run_elsewhere`: it names a
cloud, or names none and a cloud is enabled here, by the optimizer's own rule; an existing
cluster: its infra). On `local` the agents copy from this machine's paths as before, so a
local-only user never packs or sends anything.

Each source is packed (events/workdir_archive.py) into a temporary file, named by its sha256
and sent unless the object store has it already (events/uploads.py); the task goes out with
`uploads` naming the digest of each path. Larger than `limits.MAX_UPLOAD_BYTES`: refused with
the path, the size, the limit and how to leave files out. Long packs and uploads say how far
they are on stderr.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from skypurza.events import uploads as up
from skypurza.events.clock import SYSTEM_CLOCK
from skypurza.events.limits import MAX_UPLOAD_BYTES, MIB

from .submit import SubmitError

if TYPE_CHECKING:
    from skypurza.events import workdir_archive as wa

PROGRESS_FROM_BYTES = 8 * MIB  # smaller sources go by without a word
PROGRESS_EVERY_S = 1.0

Say = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def task_may_run_elsewhere(task: Any, env: Any = None) -> bool:
    """Whether a new placement of `task` may pick a node that is not this machine."""
    clouds = [r.cloud for r in task.resource_requests()]
    try:
        from skypurza.services.optimizer.settings import OptimizerSettings
        from skypurza.services.optimizer.world import enabled_infras_here

        enabled = enabled_infras_here(OptimizerSettings.load(env))
    except Exception:  # noqa: BLE001 -- unreadable settings: assume a cloud may be used (sending is safe)
        enabled = frozenset({"aws"})
    return up.may_run_elsewhere(clouds, enabled)


def _labels(public: dict[str, Any]) -> dict[str, str]:
    """Each local source's name for messages: `workdir` or `file_mounts.DST`."""
    out: dict[str, str] = {}
    if isinstance(public.get("workdir"), str):
        out[public["workdir"]] = "workdir"
    for dst, src in (public.get("file_mounts") or {}).items():
        value = src.get("source") if isinstance(src, dict) else src
        if isinstance(value, str):
            out.setdefault(value, f"file_mounts.{dst}")
    return out


class _Meter:
    """Progress lines on stderr for one long step, at most one a second."""

    def __init__(self, what: str, say: Say) -> None:
        self.what, self.say, self.last = what, say, 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if total < PROGRESS_FROM_BYTES or (now - self.last < PROGRESS_EVERY_S and done < total):
            return
        self.last = now
        self.say(f"{self.what}: {done / MIB:,.0f} of {total / MIB:,.0f} MiB ({done * 100 // max(total, 1)}%)")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}".replace(".0 ", " ")
    return f"{n:,} bytes"


def _too_large(label: str, path: str, exc: wa.TooLarge) -> SubmitError:
    where = path if label == "workdir" else str(Path(path).parent if Path(path).is_file() else path)
    return SubmitError(
        f"{label} {path}: {_size(exc.total)} of files to send to the nodes, more than the limit of "
        f"{_size(exc.limit)} (the files, after .skyignore / .gitignore). Leave out what the job does not need with a .skyignore in {where} "
        "(gitignore syntax, e.g. 'data/' or '*.ckpt'), and put data sets in a bucket (file_mounts: s3://...)")


async def send_local_sources(bus: Any, public: dict[str, Any], *, max_bytes: int = MAX_UPLOAD_BYTES,
                             say: Say = _stderr) -> dict[str, Any]:
    """`public` with `uploads` for every local source, each sent unless the store has it."""
    from skypurza.events import workdir_archive as wa  # pathspec and tarfile: only when there is something to pack

    labels = _labels(public)
    refs: dict[str, dict[str, Any]] = {}
    for path in up.local_sources(public):
        label = labels.get(path, "file mount")
        p = Path(path)
        if not p.exists():
            continue  # a path kept as a $SECRET template: the node reads it itself (docs/agent.md)
        try:
            if p.is_dir():
                with tempfile.NamedTemporaryFile(prefix="spz-upload-", suffix=".tar.gz") as tmp:
                    packed = wa.pack(p, tmp, max_bytes, progress=_Meter(f"Packing {label} {path}", say))
                    tmp.flush()
                    for note in packed.skipped[:10]:
                        say(f"{label}: left out {note}")
                    ref = up.UploadRef(digest=packed.digest, kind="dir", size=packed.size)
                    sent = await up.send_file(bus, Path(tmp.name), ref, now=SYSTEM_CLOCK.now(),
                                         progress=_Meter(f"Uploading {label}", say))
            else:
                ref = up.file_ref(p, max_bytes)
                sent = await up.send_file(bus, p, ref, now=SYSTEM_CLOCK.now(),
                                         progress=_Meter(f"Uploading {label}", say))
        except wa.TooLarge as exc:
            raise _too_large(label, path, exc) from None
        except (wa.ArchiveError, up.UploadError, OSError) as exc:
            raise SubmitError(f"{label} {path}: cannot send it to the nodes: {exc}") from None
        if sent.uploaded and ref.size >= PROGRESS_FROM_BYTES:
            say(f"Uploaded {label} {path} ({ref.size / MIB:,.1f} MiB, {ref.digest[:19]}).")
        refs[path] = ref.to_dict()
    if not refs:
        return public
    return {**public, "uploads": refs}


async def for_submit(bus: Any, task: Any, public: dict[str, Any], *, cluster_infra: str | None = None,
                     say: Say = _stderr) -> dict[str, Any]:
    """`public` as it should be published: with `uploads` when a node elsewhere may run it (a new
    placement: `task_may_run_elsewhere`; a job on an existing cluster: that cluster's infra)."""
    if not up.local_sources(public):
        return public
    elsewhere = (cluster_infra not in ("local", "")) if cluster_infra is not None else task_may_run_elsewhere(task)
    if not elsewhere:
        return public
    return await send_local_sources(bus, public, say=say)
