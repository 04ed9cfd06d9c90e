"""The one way the CLI prints a table (`spz status`, `spz queue`, `spz jobs queue`): rich, no
box, bold headers, no highlighting (a terminal's colours must not change a name's meaning), and
one line instead when there is nothing to show."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Sequence


def parse_time(value: Any) -> datetime | None:
    """A time as the ledger's rows and the log's folds give it (ISO 8601, maybe with Z), or None."""
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None


def print_table(columns: Sequence[str], rows: Iterable[Sequence[str]], *, title: str | None = None) -> None:
    from .console import console as make_console
    from rich.table import Table

    console = make_console()
    if title is not None:
        console.print(title)
    table = Table(box=None, header_style="bold")
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def print_line(text: str) -> None:
    """One line where a table would be ("No existing clusters.")."""
    from .console import console as make_console

    make_console().print(text)
