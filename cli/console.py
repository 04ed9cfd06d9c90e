"""The one way the CLI makes a rich Console: never cut when the output is not a terminal.

rich sizes a console to the terminal, and to 80 columns when there is none, cutting wider table
cells with "…": `spz status | grep`, `spz gpus list A100 > f` and CI logs lost what was cut. When
the stream is not a terminal (and COLUMNS does not say otherwise), the console is as wide as any
line can be, so a table is as wide as its content and nothing is cut or wrapped.
"""

from __future__ import annotations

import os
import sys
from typing import Any

UNBOUNDED_WIDTH = 100_000  # wider than any line a table of ours can make


def console(*, stderr: bool = False, **kw: Any) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if "width" not in kw and not _is_terminal(stream) and not os.environ.get("COLUMNS"):
        kw["width"] = UNBOUNDED_WIDTH
    kw.setdefault("highlight", False)
    return Console(stderr=stderr, **kw)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or odd stream
        return False
