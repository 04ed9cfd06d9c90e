"""A status line on stderr: a rich spinner on a terminal, plain lines otherwise (CI logs, pipes)."""

from __future__ import annotations

import sys
from typing import Any


class StatusLine:
    def __init__(self, quiet: bool = False) -> None:
        from .console import console as make_console

        self.console = make_console(stderr=True)
        # The spinner redirects stdout above itself: only when both go to the same terminal.
        self.live = self.console.is_terminal and sys.stdout.isatty() and not quiet
        self.quiet = quiet
        self._status: Any = None
        self._last = ""

    def __enter__(self) -> "StatusLine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def update(self, text: str) -> None:
        if self.quiet or text == self._last:
            return
        self._last = text
        if self.live:
            if self._status is None:
                self._status = self.console.status(text)
                self._status.start()
            else:
                self._status.update(text)
        else:
            self.console.print(f"[dim]… {text}[/dim]")

    def note(self, text: str) -> None:
        """A line that stays (above the spinner on a terminal)."""
        if not self.quiet:
            self.console.print(text)

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def echo_out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def echo_err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
