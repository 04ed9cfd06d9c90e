"""The `spz` script: a cached top-level help (cli/helpcache.py) before typer is imported, else
the CLI (cli/main.py), recording a top-level help it renders for the next run."""

from __future__ import annotations

import sys

# cli/helpcache.py HELP_ARGS, without importing it (and its hashlib) for every other command
HELP_ARGS = ((), ("--help",), ("-h",))


def main() -> None:
    if tuple(sys.argv[1:]) not in HELP_ARGS:
        from .main import app

        app()
        return
    from .helpcache import run_recorded, serve

    serve(sys.argv[1:])  # exits when it printed
    from .main import app

    run_recorded(app)
