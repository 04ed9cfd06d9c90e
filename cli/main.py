"""`spz`: the SkyPurza command line, with the verbs of `sky`.

Each command module adds its commands through `register(app)`, and only the module of the command
that runs is imported (cli/lazyapp.py; `spz --help` lists them from cli/commandtable.py); heavy
imports (pydantic models, the catalog, nats) happen inside the commands so that `spz --help` and
`spz launch --dryrun` start fast. The command modules are the open broker's and are always
there: one that fails to import is an error, never skipped. Platform commands (the ledger's
accounting) join last, as CLI plugins through an entry-point group (cli/plugins.py), loaded
where they matter (their commands, `--help`, `events`, `audit`); the CLI runs without them.
"""

from __future__ import annotations

from typing import Optional

if __name__ == "__main__":  # `python -m skypurza.cli.main --help`: the cached text, before typer loads
    import sys

    from .workerclient import run as _run_in_worker

    _run_in_worker(sys.argv[1:])  # a warm worker's child runs it, or this returns (cli/workerclient.py)
    if sys.argv[1:] in ([], ["--help"], ["-h"]):  # cli/helpcache.py HELP_ARGS
        from .helpcache import serve

        serve(sys.argv[1:])
    else:  # a plain `check-yaml FILE...`: run without typer (cli/fastpath.py); returns otherwise
        from .fastpath import serve as run_plain

        run_plain(sys.argv[1:])

from . import richlight  # noqa: E402

richlight.install()  # before typer's help renderer loads: ~150 ms of every --help (cli/richlight.py)

import typer  # noqa: E402

from . import lazyapp, options
from .context import settings

options.quiet_flag_types()  # `--help` prints no `<bool>` on the flags


class _App(typer.Typer):
    """The app, with a last line of defence: an exception no command handled is one line on
    stderr and an exit code (cli/lostplane.py `top_level_error`), never a traceback.
    SKYPURZA_DEBUG=1 shows the traceback."""

    def __call__(self, *args: object, **kwargs: object) -> object:
        if not args and "args" not in kwargs:  # the `spz` script: sky's --config is read, not refused
            import sys

            sys.argv[1:], taken = options.strip_sky_config(sys.argv[1:])
            if taken:
                options.unused("--config", "spz reads its settings from the environment and "
                                           "~/.skypurza/config.yaml (docs/cli.md, SkyPilot migration)")
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            import os

            if os.environ.get("SKYPURZA_DEBUG"):
                raise
            from .context import error_line
            from .lostplane import top_level_error

            code, message = top_level_error(exc)
            raise SystemExit(error_line(message, code).exit_code) from None


catalog = lazyapp.Catalog()  # every command, loaded when first asked for (cli/commandtable.py)

app = _App(
    name="spz",
    help="SkyPurza: run SkyPilot task YAMLs on the cheapest place with capacity; an event-sourced control plane.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.info.cls = catalog.bind(app)


def _version(value: bool) -> None:
    if value:
        from skypurza import __version__

        typer.echo(f"spz {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    stage: Optional[str] = typer.Option(None, "--stage", envvar="SKYPURZA_STAGE",
                                        help="Namespace of streams, state and cloud resources (default: dev)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    if stage:
        from skypurza.events.naming import check_stage

        try:
            settings.stage = check_stage(stage)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--stage")


def load_all() -> typer.Typer:
    """Every command module and plugin registered on the app (docs, tests that walk the tree)."""
    catalog.load_all()
    return app


if __name__ == "__main__":
    if sys.argv[1:] in ([], ["--help"], ["-h"]):
        from .helpcache import run_recorded

        run_recorded(app)  # recorded for the next one
    else:
        app()
