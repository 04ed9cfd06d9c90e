"""The one way the CLI prints a table (`spz status`, `spz queue`, `spz jobs queue`): rich, no
box, bold headers, no highlighting (a terminal's colours must not change a name's meaning), and
one line instead when there is nothing to show."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Iterable, Sequence


def parse_time(value: Any) -> datetime | None:
    """A time as the ledger's rows and the log's folds give it (ISO 8601, maybe with Z), or None."""
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None


def print_table(columns: Sequence[str], rows: Iterable[Sequence[str]], *, title: str | None = None) -> None:
    from .console import console as make_console

    console = make_console()
    if title is not None:
        console.print(title)
    render_table(console, columns, rows)


def render_table(console: Any, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> bool:
    """Print the table on a rich `console`; True when it took the plain path.

    The plain path writes the same bytes as rich's table (tests/test_table_rendering.py) for a
    fraction of the cost: rich lays out every cell (~1 ms a row: 5 s of `spz status` at 5,000
    clusters), a plain cell needs none. Markup, wide characters, or a table wider than the
    terminal (rich wraps it): rich prints it."""
    rows = [tuple(row) for row in rows]
    widths = plain_widths(columns, rows)
    if widths is None or sum(w + 2 for w in widths) > console.width:
        console.print(_rich_table(columns, rows))
        return False
    console.print(_rich_table(columns, [], widths))  # the header, styled as rich styles it
    console.file.write("".join(plain_line(row, widths) for row in rows))
    console.file.flush()
    return True


def _rich_table(columns: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int] | None = None) -> Any:
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for i, col in enumerate(columns):
        table.add_column(col, width=None if widths is None else widths[i])
    for row in rows:
        table.add_row(*row)
    return table


def _plain(cell: str) -> bool:
    """A cell rich prints as it is: printable ASCII (one column a character), no markup, no emoji code."""
    return cell.isascii() and cell.isprintable() and "[" not in cell and _EMOJI_CODE.search(cell) is None


_EMOJI_CODE = re.compile(r":[^\s:]*[A-Za-z][^\s:]*:")  # rich's `:name:`; "20:04:05" is not one


def plain_widths(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int] | None:
    """Each column's width when every header and cell is plain (`_plain`), else None."""
    widths = [len(c) for c in columns]
    if not all(_plain(c) for c in columns):
        return None
    for row in rows:
        if len(row) != len(widths):
            return None
        for i, cell in enumerate(row):
            if not isinstance(cell, str) or not _plain(cell):
                return None
            if len(cell) > widths[i]:
                widths[i] = len(cell)
    return widths


def plain_line(row: Sequence[str], widths: Sequence[int]) -> str:
    """One row as rich's box-less table prints it: each cell padded by one space each side."""
    return "".join(f" {cell:<{w}} " for cell, w in zip(row, widths)) + "\n"


def print_line(text: str) -> None:
    """One line where a table would be ("No existing clusters.")."""
    from .console import console as make_console

    make_console().print(text)


def since(t: datetime | None, now: datetime) -> str:
    if t is None:
        return "-"
    secs = int((now - t).total_seconds())
    if secs < 60:
        return f"{secs}s ago"
    if secs < 3600:
        return f"{secs // 60}m ago"
    if secs < 86400:
        return f"{secs // 3600}h ago"
    return f"{secs // 86400}d ago"


def duration(start: datetime | None, end: datetime | None, now: datetime) -> str:
    if start is None:
        return "-"
    secs = int(((end or now) - start).total_seconds())
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m}m {s}s" if h else (f"{m}m {s}s" if m else f"{s}s")
