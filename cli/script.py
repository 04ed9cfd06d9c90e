"""The `spz` script: a cached top-level help (cli/helpcache.py) before typer is imported; an
allowlisted command handed to the stage's warm CLI worker when one answers (cli/workerclient.py:
Python's start-up and a few ms instead of every import, SKYPURZA_CLI_WORKER=0 turns it off);
else the CLI (cli/main.py) in this process, recording a top-level help it renders for the next run."""

from __future__ import annotations

import sys

# cli/helpcache.py HELP_ARGS, without importing it (and its hashlib) for every other command
HELP_ARGS = ((), ("--help",), ("-h",))


def main() -> None:
    if tuple(sys.argv[1:]) not in HELP_ARGS:
        from .workerclient import run

        run(sys.argv[1:])  # returns only when no warm worker ran it (cli/workerclient.py)
        from .fastpath import serve as run_plain

        run_plain(sys.argv[1:])  # a plain `check-yaml FILE...` without typer; returns otherwise
        from .main import app

        app()
        return
    from .helpcache import run_recorded, serve

    serve(sys.argv[1:])  # exits when it printed
    from .main import app

    run_recorded(app)
