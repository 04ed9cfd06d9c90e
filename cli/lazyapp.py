"""`spz` imports only the command that runs (issue 21): the root group loads a command's module
the first time the command is asked for, and lists every command in `spz --help` from a table.

Why: each command module pulls in its own helpers (verbs, renderers, fan-out, ...), and the
platform plugins' modules and the entry-point scan come on top; importing all of them cost every
command ~100 ms before it did anything. Now `spz launch` imports cli/cmd_launch.py and what it
needs, and nothing of `jobs`, `events`, `api` or the plugins.

- `COMMANDS` (cli/commandtable.py) names each open command, the module whose `register(app)` adds
  it, and the first paragraph of its help: what `spz --help` lists without importing the module.
  tests/test_cli_lazy.py builds every command and checks the table against them, and that the
  lazy `spz --help` is byte for byte the eager one, so the table cannot drift.
- The platform plugins (cli/plugins.py) load only where they matter: for a name the table does
  not know (their commands, or a typo that gets "No such command"), for `spz --help`, and for
  the commands they extend (`events`: export and replay --into; `audit`: the ledger's part).
- The order of `spz --help` is typer's: the commands, then the sub-apps (groups); the open ones
  in table order, the plugins' after them in the order they registered.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, ClassVar

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from .commandtable import COMMANDS, Listed

if TYPE_CHECKING:
    from typer._click import Command, Context


class Catalog:
    """The commands of one typer app: which module adds each, which are loaded, and the click
    command built for each name (once). Modules are registered on the app itself, each at most
    once (a module's `register` adds to its own sub-apps: a second call would add them twice)."""

    def __init__(self, table: tuple[Listed, ...] = COMMANDS) -> None:
        self.table = {e.name: e for e in table}
        self._app: typer.Typer | None = None
        self._registered: set[str] = set()
        self._plugins: tuple[list[str], list[str]] | None = None  # their commands, their groups
        self._built: dict[str, Command] = {}

    def bind(self, app: typer.Typer) -> type[LazyGroup]:
        """The group class for `app` (its `cls`)."""
        self._app = app
        return type("SpzGroup", (LazyGroup,), {"catalog": self})

    @property
    def app(self) -> typer.Typer:
        assert self._app is not None, "Catalog.bind(app) first"
        return self._app

    # -------------------------------------------------------------------------------- loading

    def register(self, module: str) -> None:
        """Import cli/<module>.py and let it add its commands to the app (once)."""
        if module in self._registered:
            return
        self._registered.add(module)
        importlib.import_module(f"{__package__}.{module}").register(self.app)

    def load_plugins(self) -> tuple[list[str], list[str]]:
        """Load the platform plugins (once), after the open commands they extend; the names of
        the commands and of the groups they added, in the order they registered them."""
        if self._plugins is None:
            from . import plugins

            for entry in self.table.values():
                if entry.plugins:
                    self.register(entry.module)
            app = self.app
            commands_before, groups_before = len(app.registered_commands), len(app.registered_groups)
            self._plugins = ([], [])  # set before loading: a plugin asking for a command does not recurse
            from .cmd_events import events

            plugins.load(app, events)
            self._plugins[0].extend(_command_name(c) for c in app.registered_commands[commands_before:])
            self._plugins[1].extend(g.name or "" for g in app.registered_groups[groups_before:])
        return self._plugins

    def load_all(self) -> None:
        """Every command built: docs, completion and the tests that walk the whole tree."""
        for name in self.names():
            self.build(name)

    # ------------------------------------------------------------------------------- building

    def names(self) -> list[str]:
        """Every command name in the order `spz --help` lists them (typer's: commands, then
        groups), the plugins' included."""
        plugin_commands, plugin_groups = self.load_plugins()
        ours = list(self.table.values())
        return ([e.name for e in ours if not e.group] + plugin_commands
                + [e.name for e in ours if e.group] + plugin_groups)

    def build(self, name: str) -> Command | None:
        """The click command for `name` (built once), or None: no such command."""
        if name in self._built:
            return self._built[name]
        entry = self.table.get(name)
        if entry is None or entry.plugins:
            self.load_plugins()
        if entry is not None:
            self.register(entry.module)
        command = _build(self.app, name)
        if command is not None:
            self._built[name] = command
        return command

    def listed(self, name: str) -> Command | None:
        """What `spz --help` needs of `name`: the built command where there is one, else a
        stand-in with the table's help (nothing imported)."""
        if name in self._built or name not in self.table:
            return self.build(name)
        entry = self.table[name]
        return TyperCommand(name, help=entry.help, hidden=entry.hidden)


def _command_name(info: Any) -> str:
    return info.name or typer.main.get_command_name(info.callback.__name__)


def _build(app: typer.Typer, name: str) -> Command | None:
    """Typer's own build of one registered command or group of `app` (the latest of that name
    wins, as in typer's dict of commands)."""
    for info in reversed(app.registered_groups):
        if info.name == name:
            return typer.main.get_group_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                                  rich_markup_mode=app.rich_markup_mode,
                                                  suggest_commands=app.suggest_commands)
    for command in reversed(app.registered_commands):
        if _command_name(command) == name:
            return typer.main.get_command_from_info(command, pretty_exceptions_short=app.pretty_exceptions_short,
                                                    rich_markup_mode=app.rich_markup_mode)
    return None


class _Commands(MutableMapping[str, "Command"]):
    """The group's `commands`: every name known, a command built when it is read."""

    def __init__(self, catalog: Catalog, eager: dict[str, Command]) -> None:
        self.catalog = catalog
        self.catalog._built.update(eager)  # registered before the group was built (tests add some)

    def __getitem__(self, name: str) -> Command:
        command = self.catalog.build(name)
        if command is None:
            raise KeyError(name)
        return command

    def __setitem__(self, name: str, command: Command) -> None:
        self.catalog._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self.catalog._built[name]

    def __iter__(self) -> Iterator[str]:
        names = self.catalog.names()
        return iter(names + [n for n in self.catalog._built if n not in names])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class LazyGroup(TyperGroup):
    """typer's group whose commands are built on first use (`Catalog`)."""

    catalog: ClassVar[Catalog]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands(self.catalog, dict(self.commands))
        self._listing = False

    def list_commands(self, ctx: Context | None) -> list[str]:
        return list(self.commands)

    def get_command(self, ctx: Context | None, cmd_name: str) -> Command | None:
        if self._listing:
            return self.catalog.listed(cmd_name)
        return self.commands.get(cmd_name)

    def format_help(self, ctx: Context, formatter: Any) -> None:
        # The listing reads each command's name, help and hidden flag: the table has them.
        self._listing = True
        try:
            return super().format_help(ctx, formatter)
        finally:
            self._listing = False
