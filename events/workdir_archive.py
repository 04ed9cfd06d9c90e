"""A workdir as one deterministic archive, and unpacking one safely on a node.

`pack(root, out)` writes what a sync of `root` copies (the `.skyignore` / `.gitignore` rules of
events/syncignore.py, the same the agent applies to a local copy) as a gzipped tar whose bytes
depend only on the tree's names, contents and executable bits: entries sorted, mtimes 0,
owners 0/root-less, modes 0755/0644, gzip header without name or time. Its sha256 is therefore
the workdir's content address (events/uploads.py): an unchanged workdir has the same digest.

A symlink is kept when it points inside the tree (relative, not climbing out), and left out
otherwise (`Packed.skipped` says which): on the node it would point at something else.
FIFOs, sockets and devices are left out too.

`unpack(archive, dest)` is for an archive from outside (the object store): before anything is
written every member is checked — a regular file, a directory or a symlink; a relative path
without `..`; a symlink target inside the tree; at most `max_bytes` of content and
`max_entries` entries — and one bad member refuses the whole archive (`UnsafeArchive`). Then
each member is written with tarfile's `data` filter, which also refuses a path that an earlier
symlink would lead out of `dest`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import stat
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable

from . import syncignore

MAX_ENTRIES = 200_000  # files, directories and links of one archive
_HAS_DATA_FILTER = hasattr(tarfile, "data_filter")  # PEP 706: Python 3.11.4 and later


class ArchiveError(Exception):
    """The tree cannot be packed (unreadable, too large): the message says why."""


class TooLarge(ArchiveError):
    def __init__(self, total: int, limit: int) -> None:
        super().__init__(f"{total:,} bytes, more than the limit of {limit:,}")
        self.total = total
        self.limit = limit


class UnsafeArchive(Exception):
    """An archive that would write outside its destination, or is not what a pack makes."""


@dataclass
class Packed:
    digest: str  # sha256:<hex> of the archive's bytes
    size: int  # bytes of the archive
    content_bytes: int  # bytes of the files in it
    entries: int
    skipped: list[str] = field(default_factory=list)  # what was left out, and why


@dataclass(frozen=True)
class _Entry:
    rel: str  # posix path relative to the root
    kind: str  # "dir" | "file" | "link"
    size: int = 0
    executable: bool = False
    target: str = ""


def _inside(rel_dir: str, target: str) -> bool:
    """Does a symlink in `rel_dir` pointing at `target` stay inside the tree (lexically)?"""
    if not target or target.startswith("/"):
        return False
    joined = posixpath.normpath(posixpath.join(rel_dir, target))
    return joined != ".." and not joined.startswith("../")


def scan(root: Path, max_bytes: int, max_entries: int = MAX_ENTRIES) -> tuple[list[_Entry], list[str]]:
    """The entries a sync of `root` copies, sorted; TooLarge past `max_bytes` of file content."""
    root = Path(root)
    ignore = syncignore.ignore_for(root)
    entries: list[_Entry] = []
    skipped: list[str] = []
    total = 0
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            names = sorted(os.listdir(d))
        except OSError as exc:
            raise ArchiveError(f"cannot read {d}: {exc.strerror or exc}") from None
        ignored = ignore(str(d), names)
        subdirs = []
        for n in names:
            if n in ignored:
                continue
            p = d / n
            rel = p.relative_to(root).as_posix()
            try:
                st = p.lstat()
            except OSError as exc:
                raise ArchiveError(f"cannot read {p}: {exc.strerror or exc}") from None
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(p)
                if _inside(posixpath.dirname(rel), target):
                    entries.append(_Entry(rel, "link", target=target))
                else:
                    skipped.append(f"{rel} -> {target} (a symlink pointing outside the workdir)")
            elif stat.S_ISDIR(st.st_mode):
                entries.append(_Entry(rel, "dir"))
                subdirs.append(p)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size  # past the bound the walk goes on, to say the whole size
                entries.append(_Entry(rel, "file", size=st.st_size, executable=bool(st.st_mode & 0o111)))
            else:
                skipped.append(f"{rel} (not a regular file, directory or symlink)")
            if len(entries) > max_entries:
                raise ArchiveError(f"more than {max_entries:,} files and directories")
        stack.extend(reversed(subdirs))
    if total > max_bytes:
        raise TooLarge(total, max_bytes)
    entries.sort(key=lambda e: e.rel)
    return entries, skipped


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `out`."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.sha.update(b)
        self.size += len(b)
        self.out.write(b)
        return len(b)


def _info(e: _Entry) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(e.rel)
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    if e.kind == "dir":
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755
    elif e.kind == "link":
        ti.type, ti.mode, ti.linkname = tarfile.SYMTYPE, 0o777, e.target
    else:
        ti.type, ti.mode, ti.size = tarfile.REGTYPE, 0o755 if e.executable else 0o644, e.size
    return ti


def pack(root: Path, out: BinaryIO, max_bytes: int, *,
         progress: Callable[[int, int], None] | None = None) -> Packed:
    """Write `root`'s archive to `out`; its digest, sizes and what was left out.
    `progress(done, total)` is told the file bytes packed so far."""
    entries, skipped = scan(root, max_bytes)
    total = sum(e.size for e in entries)
    sink = _Hashing(out)
    done = 0
    with gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for e in entries:
            ti = _info(e)
            if e.kind != "file":
                tar.addfile(ti)
                continue
            try:
                with open(root / e.rel, "rb") as f:
                    # The size read at scan time: a file that changes meanwhile is an error, not a
                    # silently different archive.
                    if os.fstat(f.fileno()).st_size != e.size:
                        raise ArchiveError(f"{root / e.rel} changed while it was packed; try again")
                    tar.addfile(ti, f)
            except OSError as exc:
                raise ArchiveError(f"cannot read {root / e.rel}: {exc.strerror or exc}") from None
            done += e.size
            if progress is not None:
                progress(done, total)
    return Packed(digest="sha256:" + sink.sha.hexdigest(), size=sink.size, content_bytes=total,
                  entries=len(entries), skipped=skipped)


def check_members(members: list[tarfile.TarInfo], max_bytes: int, max_entries: int = MAX_ENTRIES) -> None:
    """UnsafeArchive unless every member is one a pack makes and stays inside the tree."""
    if len(members) > max_entries:
        raise UnsafeArchive(f"{len(members):,} entries, more than {max_entries:,}")
    total = 0
    for m in members:
        name = m.name
        parts = name.split("/")
        if not name or name.startswith("/") or "\\" in name or ".." in parts or any(p == "" for p in parts[:-1]):
            raise UnsafeArchive(f"entry {name!r}: not a relative path inside the workdir")
        if m.issym():
            if not _inside(posixpath.dirname(name), m.linkname):
                raise UnsafeArchive(f"symlink {name!r} -> {m.linkname!r} points outside the workdir")
        elif m.isreg():
            total += m.size
            if total > max_bytes:
                raise UnsafeArchive(f"more than {max_bytes:,} bytes of files")
        elif not m.isdir():
            raise UnsafeArchive(f"entry {name!r}: only files, directories and symlinks are accepted")


def unpack(archive: Path, dest: Path, max_bytes: int) -> int:
    """Write the archive's members under `dest` (made if missing); the number of entries."""
    dest = Path(dest)
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            members = tar.getmembers()
            check_members(members, max_bytes)
            dest.mkdir(parents=True, exist_ok=True)
            real = os.path.realpath(dest)
            for m in members:
                # No member may be written through a symlink that leads out (one in the archive,
                # or one already at the destination): checked on the disk, as it is now.
                parent = os.path.realpath(os.path.join(real, posixpath.dirname(m.name)))
                if parent != real and not parent.startswith(real + os.sep):
                    raise UnsafeArchive(f"entry {m.name!r} would be written outside {dest}")
                if m.issym():
                    target = os.path.realpath(os.path.join(parent, m.linkname))
                    if target != real and not target.startswith(real + os.sep):
                        raise UnsafeArchive(f"symlink {m.name!r} -> {m.linkname!r} points outside {dest}")
                existing = os.path.join(real, m.name)
                if os.path.islink(existing) or (m.issym() and os.path.isfile(existing)):
                    os.unlink(existing)  # replaced, never followed
                if _HAS_DATA_FILTER:
                    tar.extract(m, real, filter="data")
                else:  # Python 3.11.0-3.11.3: the checks above, and the filter's modes by hand
                    m.mode &= 0o755
                    m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
                    tar.extract(m, real)
                if m.isreg():  # the archive's times are all 0: a file gets the time it arrived
                    os.utime(existing)
            return len(members)
    except getattr(tarfile, "FilterError", UnsafeArchive) as exc:
        raise UnsafeArchive(str(exc)) from None
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise UnsafeArchive(f"not a readable archive: {exc}") from None
