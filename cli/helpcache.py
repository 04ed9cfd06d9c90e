"""A cold top-level `spz --help` (and `spz` alone) without typer: the text typer rendered the
last time, for the same everything it depends on (issue 21).

Importing typer, click and rich's help renderer is most of a cold `--help` (~0.1-0.2 s of
~0.3 s). The top-level help only changes with the code, the plugins installed, and how the
terminal looks, so the first run renders it with typer as ever, recording what was written and
the exit code; a later run with the same `help_key` writes the recorded bytes back and exits.

The key covers what the rendering reads: the arguments (`spz` alone exits 2), the version, the directories on sys.path (installing or
removing a plugin changes them), the program name, the streams (which are terminals, their sizes and encodings) and the
environment variables rich, typer and click consult (width, colour: COLUMNS, TERM, NO_COLOR,
FORCE_COLOR, ...) plus every SKYPURZA_ variable. The cached text also lists every module file
that rendered it (ours, the plugins', typer's and rich's) with its mtime and size: one changed
(an edited help text, an upgrade) renders again. Anything unusual (a stream written as bytes, a
cache file that cannot be read) falls back to typer and caches nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

from skypurza.events.filestamps import module_stamps, unchanged

HELP_ARGS = ((), ("--help",), ("-h",))
# Variables that change what rich/typer/click print (width, colour, encoding, markup).
_ENV_NAMES = ("COLUMNS", "LINES", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "PY_COLORS", "CLICOLOR",
              "CLICOLOR_FORCE", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "TERMINAL_WIDTH", "GITHUB_ACTIONS",
              "JUPYTER_COLUMNS", "JUPYTER_LINES", "PYTHONIOENCODING", "PYTHONUTF8", "LANG", "LC_ALL", "LC_CTYPE")
_ENV_PREFIXES = ("SKYPURZA_", "_TYPER", "TYPER_", "DATABRICKS_")
_MAX_CACHED = 1 << 20  # a cache file bigger than this is not ours


def help_key(version: str, env: dict[str, str], facts: list[Any]) -> str:
    """Pure: the cache key of the help text for these inputs (see the module's docstring)."""
    seen = sorted((k, v) for k, v in env.items() if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES))
    blob = json.dumps([version, seen, facts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _stream_facts() -> list[Any]:
    out: list[Any] = []
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            tty = os.isatty(fd)
            size = tuple(os.get_terminal_size(fd)) if tty else None
        except (AttributeError, OSError, ValueError):
            fd, tty, size = None, False, None
        out.append([fd, tty, size, getattr(stream, "encoding", None)])
    return out


def _place_facts() -> list[Any]:
    paths = []
    for p in sys.path:
        try:
            paths.append((p, os.stat(p or ".").st_mtime_ns))
        except OSError:
            paths.append((p, None))
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return [paths, sys.argv[0], getattr(spec, "name", None), sys.version]


def current_key(argv: list[str]) -> str:
    from skypurza import __version__

    # argv: `spz` alone exits 2 where `spz --help` exits 0, with the same text
    return help_key(__version__, dict(os.environ), [list(argv), _place_facts(), _stream_facts()])


class _Recorder:
    """A stream that passes everything through and keeps a copy of the text written."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.text: list[str] = []
        self.clean = True

    def write(self, s: str) -> int:
        try:
            n = self._stream.write(s)  # click probes with write(b""): the text stream's TypeError
        except OSError:  # a broken pipe (`spz --help | head`): what was recorded is cut short
            self.clean = False
            raise
        if isinstance(s, str):
            self.text.append(s)
        elif s:  # bytes a stream took: not replayable as text
            self.clean = False
        return n

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self.clean = False
            raise

    def __getattr__(self, name: str) -> Any:
        if name == "buffer":  # bytes written past the text layer: cannot be replayed faithfully
            self.clean = False
        return getattr(self._stream, name)


def _cache_file(argv: list[str]) -> Any:
    from skypurza.events import naming

    return naming.help_cache_file(current_key(argv))


def serve(argv: list[str]) -> None:
    """For a top-level help: write the cached text and exit; otherwise return (nothing done)."""
    if tuple(argv) not in HELP_ARGS:
        return
    try:
        path = _cache_file(argv)
        if path.stat().st_size > _MAX_CACHED:
            return
        doc = json.loads(path.read_text(encoding="utf-8"))
        out, err, code = doc["out"], doc["err"], doc["code"]
        if not (isinstance(out, str) and isinstance(err, str) and isinstance(code, int)) \
                or not unchanged(doc.get("files")):
            return
    except (OSError, ValueError, KeyError, TypeError):
        return  # no cache yet, or not one we can read: typer renders it
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
        if err:
            sys.stderr.write(err)
            sys.stderr.flush()
    except BrokenPipeError:  # `spz --help | head`: what click does, exit 1 without a word
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
        raise SystemExit(1) from None
    raise SystemExit(code)


def run_recorded(app: Any) -> None:
    """Run `app` (a top-level help) with its output recorded, then store what it printed."""
    argv = sys.argv[1:]
    out, err = _Recorder(sys.stdout), _Recorder(sys.stderr)
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    code: Any = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code
        raise
    finally:
        # Stored only when typer ended as usual: click swaps the streams out on a broken pipe
        # (`spz --help | head`), and the text written then is cut short.
        whole = sys.stdout is out and sys.stderr is err and _flushed(out._stream) and _flushed(err._stream)
        sys.stdout, sys.stderr = out._stream, err._stream
        if whole and out.clean and err.clean and isinstance(0 if code is None else code, int):
            _store(argv, "".join(out.text), "".join(err.text), 0 if code is None else code, module_stamps())


def _flushed(stream: Any) -> bool:
    try:
        stream.flush()
    except (OSError, ValueError):
        return False
    return True


def _store(argv: list[str], out: str, err: str, code: int, files: list[list[Any]]) -> None:
    try:
        path = _cache_file(argv)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"out": out, "err": err, "code": code, "files": files}), encoding="utf-8")
        os.replace(tmp, path)  # atomic: a concurrent `spz --help` reads the old file or the new
    except OSError:
        pass  # a read-only home: the help was printed, only the next one is slower
