"""A job's output as a terminal shows it: carriage returns and partial lines (issue 12 §6).

The agent sends a phase's output in chunks that say how they ended (procs.Chunk): a line
("\n"), a carriage return ("\r": a progress bar's state, which the next piece overwrites) or
nothing (a partial line sent after a pause; its rest follows). `Render` turns them back into
what a terminal would show, per source (a node's phase):
- a completed line is printed once, with its `(head, rank=0)`-style prefix: the partial pieces
  before it joined, and for a line that ends a progress bar ("…\r100%\n") the last state;
- on a terminal, the current state of an unfinished line is shown in the command's status line
  and replaced by the next state, as tqdm and pip draw it; completed lines print above it;
- when the output is not a terminal (a pipe, a file, `history`), only completed lines are
  written: a 10,000-step progress bar is one line, its final state.

`Render` is pure (it returns what to show); `show` hands it to the command's printers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, int, str]  # (cluster/job, rank, phase)


@dataclass
class _Open:
    pending: str = ""  # partial pieces since the last line end
    state: str = ""  # the last carriage-return state (what a terminal shows now)
    last: Any = None  # the last chunk seen (its source, for the prefix)


@dataclass(frozen=True)
class Line:
    """A completed line to print."""

    text: str


@dataclass(frozen=True)
class Live:
    """The unfinished line of a source, as a terminal shows it now ("" when none is open)."""

    text: str


@dataclass
class Render:
    """Chunks in, what to show out. `fmt(line, text)` gives a chunk's text its prefix."""

    fmt: Callable[[Any, str], str]
    _open: dict[Key, _Open] = field(default_factory=dict)
    _live_key: Key | None = None

    def feed(self, line: Any) -> list[Line | Live]:
        key: Key = (line.where, line.rank, line.stream)
        end = getattr(line, "end", "\n")
        o = self._open.setdefault(key, _Open())
        o.last = line
        out: list[Line | Live] = []
        if end == "\n":
            text = o.pending + line.line
            if not text and o.state:
                text = o.state  # "…\r100%\r\n": the bar's last state is the line
            del self._open[key]
            out.append(Line(self.fmt(line, text)))
            if self._live_key == key:
                self._live_key = None
                out.insert(0, Live(""))
        elif end == "\r":
            o.state, o.pending = o.pending + line.line, ""
            self._live_key = key
            out.append(Live(self.fmt(line, o.state)))
        else:  # a partial line
            o.pending += line.line
            self._live_key = key
            out.append(Live(self.fmt(line, o.pending)))
        return out

    def close(self) -> list[Line | Live]:
        """The output ended: what was left unfinished, as lines."""
        out: list[Line | Live] = [Live("")] if self._live_key is not None else []
        for o in self._open.values():
            text = o.pending or o.state
            if text:
                out.append(Line(self.fmt(o.last, text)))
        self._open.clear()
        self._live_key = None
        return out


def show(actions: list[Line | Live], print_line: Callable[[str], None],
         progress: Callable[[str], None] | None = None) -> None:
    """Completed lines through `print_line`; the live line, on a terminal, through `progress`
    (the command's status line, so it never fights the spinner for the cursor), else nowhere."""
    for a in actions:
        if isinstance(a, Line):
            print_line(a.text)
        elif progress is not None and a.text:
            progress(a.text)


def with_text(line: Any, text: str) -> Any:
    """A copy of a LogLine with other text (for the prefixing `format_line`)."""
    return dataclasses.replace(line, line=text)
