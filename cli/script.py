"""The `spz` script: a cached top-level help (cli/helpcache.py) before typer is imported, else
the CLI (cli/main.py), recording a top-level help it renders for the next run."""

from __future__ import annotations

import sys

from .helpcache import HELP_ARGS, run_recorded, serve


def main() -> None:
    argv = sys.argv[1:]
    serve(argv)  # exits when it printed
    from .main import app

    if tuple(argv) in HELP_ARGS:
        run_recorded(app)
    else:
        app()
