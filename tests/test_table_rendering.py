"""`spz status`/`queue`/`jobs queue` tables (issue 21): plain cells skip rich's per-cell layout
(cli/tables.py `render_table`) and print the very bytes rich's table prints, piped and on a
terminal; anything rich would treat differently (markup, wide characters, a table wider than
the terminal) is left to rich."""

from __future__ import annotations

import io
import random

from rich.console import Console

from skypurza.cli.tables import _rich_table, plain_widths, render_table

ALPHABET = "abcXYZ019 -_.:/()*+%$#@!?<>=~'\"{}|"
HEADERS = ("NAME", "LAUNCHED", "RESOURCES", "STATUS", "$/H", "X")


def _console(terminal: bool, width: int) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, highlight=False, force_terminal=terminal,
                   color_system="standard" if terminal else None), buf


def _both(columns, rows, terminal: bool, width: int) -> tuple[str, str, bool]:
    fast, fast_buf = _console(terminal, width)
    plain = render_table(fast, columns, rows)
    slow, slow_buf = _console(terminal, width)
    slow.print(_rich_table(columns, rows))
    return fast_buf.getvalue(), slow_buf.getvalue(), plain


def test_the_plain_path_prints_what_rich_prints_piped_and_on_a_terminal() -> None:
    rnd = random.Random(21)
    took_plain = 0
    for _ in range(300):
        columns = [rnd.choice(HEADERS) for _ in range(rnd.randint(1, 6))]
        rows = [["".join(rnd.choice(ALPHABET) for _ in range(rnd.choice([0, 1, 3, 8, 20]))) for _ in columns]
                for _ in range(rnd.randint(0, 8))]
        for terminal, width in ((False, 100_000), (True, 80), (True, 200)):
            fast, slow, plain = _both(columns, rows, terminal, width)
            assert fast == slow, (columns, rows, terminal, width)
            took_plain += plain
    assert took_plain > 600  # the plain path really ran (most tables fit)


def test_cells_rich_would_change_are_left_to_rich() -> None:
    for cell in ("[bold]x[/bold]", "a :thumbs_up: b", "日本", "tab\there", "é"):
        assert plain_widths(("A",), [(cell,)]) is None, cell
        fast, slow, plain = _both(("A", "B"), [(cell, "x"), ("y", "z")], False, 100_000)
        assert not plain and fast == slow
    assert plain_widths(("A", "B"), [("20:04:05", "x"), ("", "longer")]) == [8, 6]  # a time is no emoji code
    wide = [("x" * 50, "y" * 50)]
    fast, slow, plain = _both(("A", "B"), wide, True, 80)  # wider than the terminal: rich wraps it
    assert not plain and fast == slow


def test_thousands_of_rows_take_the_plain_path() -> None:
    rows = [(f"c{i}", "2026-12-01 20:04:05", "1x local (cpus=1)", "UP", "0.0000") for i in range(2000)]
    fast, slow, plain = _both(("NAME", "LAUNCHED", "RESOURCES", "STATUS", "$/H"), rows, False, 100_000)
    assert plain and fast == slow and fast.count("\n") == 2001
