"""Where a task's YAML text comes from: a file (read bounded, refused when it is not a regular
file) or the text itself, and whether a command-line entrypoint names a task file.

No pydantic here: the plain dry run (plaintask.py) reads files through this module too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from skypurza.events.limits import MAX_YAML_FILE_BYTES

from .errors import Problem, TaskSpecError


def is_yaml_entrypoint(entrypoint: str) -> bool:
    """A single argument naming a .yaml/.yml file is a task file; anything else is a command."""
    return entrypoint.strip().lower().endswith((".yaml", ".yml")) and "\n" not in entrypoint


def read_source(path_or_text: str | os.PathLike[str], filename: str | None) -> tuple[str, str | None]:
    """The YAML text and the name problems show for it; TaskSpecError when a file cannot be read."""
    # A str is a path when it names a YAML file (existing or not: "file not found" helps more
    # than parsing the name as YAML) or any existing file; otherwise it is the YAML text itself.
    if isinstance(path_or_text, os.PathLike) or (
        isinstance(path_or_text, str) and "\n" not in path_or_text
        and (path_or_text.lower().endswith((".yaml", ".yml")) or os.path.isfile(path_or_text))
    ):
        path = Path(path_or_text)
        shown = filename or str(path)
        try:
            return _read_file(path), shown
        except _NotReadable as exc:
            raise TaskSpecError([Problem(shown, None, None, "", str(exc))]) from None
        except FileNotFoundError:
            raise TaskSpecError([Problem(shown, None, None, "", "file not found")]) from None
        except UnicodeDecodeError as exc:
            raise TaskSpecError([Problem(shown, None, None, "", f"not UTF-8 text: {exc.reason}")]) from None
        except OSError as exc:
            raise TaskSpecError([Problem(shown, None, None, "", f"cannot read: {exc.strerror or exc}")]) from None
    if len(path_or_text) > MAX_YAML_FILE_BYTES:
        raise TaskSpecError([Problem(filename, None, None, "",
                                     f"the task is {len(path_or_text):,} characters; at most {MAX_YAML_FILE_BYTES:,}")])
    return str(path_or_text), filename


class _NotReadable(Exception):
    pass


def _read_file(path: Path) -> str:
    """A regular file's text, at most MAX_YAML_FILE_BYTES. Opened without blocking, so that a named
    pipe (or a device) is refused at once instead of waiting for a writer that never comes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a named pipe" if stat.S_ISFIFO(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
            raise _NotReadable(f"not a regular file ({kind}): give a task YAML file")
        if st.st_size > MAX_YAML_FILE_BYTES:
            raise _NotReadable(f"the file is {st.st_size:,} bytes; a task file may have at most "
                               f"{MAX_YAML_FILE_BYTES:,} ({MAX_YAML_FILE_BYTES // 2**20} MiB)")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            data = f.read(MAX_YAML_FILE_BYTES + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > MAX_YAML_FILE_BYTES:  # it grew while we read it
        raise _NotReadable(f"the file has more than {MAX_YAML_FILE_BYTES:,} bytes; a task file may have at most that")
    return data.decode("utf-8")
