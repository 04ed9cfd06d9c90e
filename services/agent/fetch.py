"""A cloud node's copy of an uploaded workdir or file-mount source (events/uploads.py).

The object is downloaded by its digest into the agent's scratch directory, its sha256 checked
against the digest the task names (a different object under that name is refused), then a
directory archive is unpacked into the destination by events/workdir_archive.py's checks (no
absolute paths, no `..`, no symlink leading out, bounded size) and a file is moved into place.
Everything here is input from outside the node: any failure is a SyncError naming what.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

from skypurza.events import uploads as up
from skypurza.events import workdir_archive as wa
from skypurza.events.limits import MAX_UPLOAD_BYTES
from skypurza.events.payloads import UploadRef

from .mounts import SyncError

# An archive is its files plus a header or two per entry: bounded accordingly.
MAX_ARCHIVE_BYTES = MAX_UPLOAD_BYTES + 2048 * wa.MAX_ENTRIES


async def put_in_place(bus: Any, ref: UploadRef, dest: Path, scratch: Path) -> None:
    scratch.mkdir(parents=True, exist_ok=True)
    # Jobs of one node prepare at once: each download has a file of its own.
    part = scratch / f"{ref.digest.replace(':', '-')}-{uuid.uuid4().hex[:12]}.part"
    try:
        await up.fetch(bus, ref, part, max_bytes=MAX_ARCHIVE_BYTES if ref.kind == "dir" else MAX_UPLOAD_BYTES)
        if ref.kind == "dir":
            await asyncio.to_thread(wa.unpack, part, dest, MAX_UPLOAD_BYTES)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(part, 0o644)
            os.replace(part, dest)  # a symlink already at dest is replaced, never followed
    except up.UploadError as exc:
        raise SyncError(str(exc)) from None
    except wa.UnsafeArchive as exc:
        raise SyncError(f"object {ref.digest} refused: {exc}") from None
    except OSError as exc:
        raise SyncError(f"cannot write {dest}: {exc.strerror or exc}") from None
    finally:
        part.unlink(missing_ok=True)
