"""Where platform code joins `spz`: CLI plugins and services, found through entry-point groups.

The open broker's CLI imports no platform code (docs/DESIGN.md, *Open and platform*). A platform
package that has commands declares a callable `register(app)` in the `skypurza.cli_plugins`
entry-point group (pyproject.toml `[project.entry-points]`); `load` calls each one with the app,
and it adds its typer sub-app and commands (the ledger's: `cost-report`, `ledger ...`,
`events export`, what `events replay --into` runs, and its part of `spz audit`).

Platform services join `spz api serve` the same way: a class in the `skypurza.services` group
(`service_entry_points`, read by cli/serve.py and cli/contracts.py).

With no plugin installed the CLI runs as it is, and a platform command says that it is not
installed (exit 1) rather than click's "No such command". A plugin that is declared but fails to
load is not hidden: one warning line names it and its error, its commands say so, and
`SKYPURZA_DEBUG=1` raises it with its traceback.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

import typer

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = "skypurza.cli_plugins"
# Platform services (a class built with no arguments, with a ServiceContract or LoopContract)
# join `spz api serve` through this group: name = "module:Class" (cli/serve.py).
SERVICES_GROUP = "skypurza.services"
# Set (to anything but "" or "0"), no plugin is loaded: the open broker's CLI alone, as it runs
# where no platform package is installed. It skips loading and nothing else.
SKIP_ENV = "SKYPURZA_NO_PLUGINS"

# The commands platform plugins add, so that one missing is answered by name (the names only:
# nothing here imports them). Top-level commands, and those of the `events` sub-app.
PLATFORM_COMMANDS = ("cost-report", "ledger", "health")
PLATFORM_EVENTS_COMMANDS = ("export",)

# Plugins that are declared but raised while loading: name -> "Type: message".
_failed: dict[str, str] = {}


def declared() -> list[EntryPoint]:
    """The plugins to load, by name (the order their commands join in); none under SKIP_ENV."""
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return []
    from importlib.metadata import entry_points  # scans every installed distribution: not under SKIP_ENV

    return sorted(entry_points(group=GROUP), key=lambda ep: ep.name)


def service_entry_points() -> dict[str, str]:
    """Platform services by name -> "module:Class" (nothing imported); none under SKIP_ENV."""
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return {}
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in sorted(entry_points(group=SERVICES_GROUP), key=lambda ep: ep.name)}


def load(app: typer.Typer, events_app: typer.Typer) -> list[str]:
    """Register every declared plugin on `app`, then answer the platform commands still missing.
    Returns the names of the plugins that loaded."""
    loaded: list[str] = []
    for ep in declared():
        try:
            register = ep.load()
            register(app)
        except Exception as exc:
            if os.environ.get("SKYPURZA_DEBUG"):
                raise
            _failed[ep.name] = f"{type(exc).__name__}: {exc}"
            typer.echo(f"warning: the spz plugin {ep.name!r} ({ep.value}) failed to load: {_failed[ep.name]}; "
                       "its commands are not available (SKYPURZA_DEBUG=1 shows the traceback)", err=True)
        else:
            loaded.append(ep.name)
    _answer_missing(app, PLATFORM_COMMANDS, "")
    _answer_missing(events_app, PLATFORM_EVENTS_COMMANDS, "events ")
    return loaded


def failed() -> dict[str, str]:
    """The plugins that were declared but failed to load: name -> "Type: message"."""
    return dict(_failed)


def not_installed(command: str) -> str:
    """What a platform command says when no plugin provides it."""
    if _failed:
        why = "; ".join(f"{name}: {error}" for name, error in sorted(_failed.items()))
        return f"`spz {command}` is not available: its plugin failed to load ({why})"
    return (f"`spz {command}` is part of SkyPurza's accounting platform, which is not installed here "
            f"(no `{GROUP}` entry point provides it); the open broker runs without it")


def _registered(app: typer.Typer) -> set[str]:
    return {c.name for c in app.registered_commands if c.name} | {g.name for g in app.registered_groups if g.name}


def _answer_missing(app: typer.Typer, names: tuple[str, ...], prefix: str) -> None:
    for name in sorted(set(names) - _registered(app)):
        app.command(name, hidden=True, add_help_option=False,
                    context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                      "help_option_names": []})(_missing_command(prefix + name))


def _missing_command(command: str) -> Callable[[typer.Context], None]:
    def missing(ctx: typer.Context) -> None:
        from .context import error_line

        raise error_line(not_installed(command), 1)

    missing.__doc__ = f"Not installed: `spz {command}` (a platform command)."
    return missing
