"""Lines of rich markup printed without importing rich when rich would print them as plain text
(issue 21: rich.console is ~40 ms of a cold `spz check-yaml`, which prints a few short lines).

A `Lines` printer takes each line twice: as the markup rich would print, and as the user's pieces
it interpolates (already escaped for rich). When the stream is one rich writes no styles to (not a
terminal, nothing forcing one) and every piece is text rich prints as it is, the line goes
straight to the stream: the very bytes `Console(highlight=False, soft_wrap=True).print(markup)`
writes (tests/test_cli_fastpath.py compares them over a corpus). Anything else — a terminal,
FORCE_COLOR/TTY_COMPATIBLE, a piece with markup, a backslash, non-ASCII or control characters,
or something rich could read as an `:emoji:` code — goes through rich's console, created then.
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from typing import Any, TextIO

_STYLE_TAG = re.compile(r"\[/?[a-z ]*\]")  # the fixed tags our own lines use: [red], [/bold green] ...
# rich's emoji codes with no letter in them; any code with a letter is refused outright
_NUMERIC_EMOJI = frozenset({"100", "1234", "+1", "-1", "__1"})
_COLON_PAIR = re.compile(r"(?=:([^\s:]*):)")  # every pair of colons with no space between (overlapping)


def plain_piece(text: str) -> bool:
    """A piece of a line rich prints unchanged: printable ASCII without markup or escapes."""
    return text.isascii() and text.isprintable() and not any(c in text for c in "[]\\")


def no_emoji_code(line: str) -> bool:
    """True when rich's emoji replacement cannot change `line` (every `:name:` it might read is
    no emoji name: a name with a letter may be one, so it is refused; so are the numeric ones)."""
    for m in _COLON_PAIR.finditer(line):
        name = m.group(1)
        if name in _NUMERIC_EMOJI or any(c.isalpha() for c in name):
            return False
    return True


def rich_is_plain(stream: TextIO, environ: Any = os.environ) -> bool:
    """True when a rich Console on `stream` writes no styles: not a terminal (rich's
    `Console.is_terminal` false), not Jupyter or IDLE. Conservative: any variable that can
    force a terminal, set to anything, counts as a terminal."""
    if "TTY_COMPATIBLE" in environ and environ["TTY_COMPATIBLE"] != "0":
        return False
    if environ.get("TTY_COMPATIBLE") != "0" and "FORCE_COLOR" in environ:
        return False
    if hasattr(builtins, "get_ipython") or getattr(sys.stdin, "__module__", "").startswith("idlelib"):
        return False
    try:
        return environ.get("TTY_COMPATIBLE") == "0" or not stream.isatty()
    except (AttributeError, ValueError):
        return False


class Lines:
    """Prints lines of markup on stdout (or stderr) as `Console(highlight=False, soft_wrap=True)`."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Any = None
        self._plain: bool | None = None

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self._stderr else sys.stdout

    def print(self, markup: str, *pieces: str) -> None:
        """`markup`: the line as rich markup, with `pieces` (the user's text in it) escaped."""
        if self._plain is None:
            self._plain = rich_is_plain(self.stream)
        if self._plain and all(plain_piece(p) for p in pieces):
            text = _STYLE_TAG.sub("", markup)
            if no_emoji_code(text):
                self._write(text + "\n")
                return
        self.console().print(markup)

    def console(self) -> Any:
        """rich's console, created on first use (both write straight to the stream and flush: the
        lines stay in order)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(highlight=False, soft_wrap=True, stderr=self._stderr)
        return self._console

    def _write(self, text: str) -> None:
        stream = self.stream
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:  # what rich's console does (Console.on_broken_pipe)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            raise SystemExit(1) from None


def escape(text: str) -> str:
    """rich.markup.escape, imported only when the text has something to escape."""
    if plain_piece(text):
        return text
    from rich.markup import escape as rich_escape

    return rich_escape(text)
