"""A cold `spz check-yaml FILE...` and `spz launch --dryrun FILE` without typer (issue 21).

Importing typer and building a command's parameters (typer 0.29 makes a pydantic TypeAdapter for
each: launch has 40) is ~0.15 s of a cold check-yaml or dry run that take ~0.2 s without it.
`serve(argv)` runs the command itself when `argv` has a shape typer reads in one obvious way —
the command name, then only the shape's options each followed by a plain value, its flags, and
file names (or a command's words) — and returns (nothing done) for anything else: `--help`,
`--`, any other or glued option (`-ejson`, `--env=X`), a value that starts with `-`, no file, an
`-o` typer would refuse, `launch` without `--dryrun`, sky's `--config`, a shell-completion
request, a `SKYPURZA_STAGE` the group would refuse. Typer then parses it as ever, errors and all.

`parse` is pure and takes its options from `SHAPES`; tests/test_cli_fastpath.py checks each
shape against the click parameters typer builds for the command (names, flags, multiple,
defaults, no environment variable; every launch option the shape leaves out at a default that
changes nothing), so the two cannot drift, and runs a wide set of argument
lists both ways, comparing stdout, stderr and exit codes byte for byte.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Shape:
    """What the shortcut accepts of one command: options taking one value each (flag -> the
    parameter's name), which are lists, the values typer accepts (others: typer reports them),
    the defaults, and the positional parameter (one or more values)."""

    command: str
    options: Mapping[str, str]
    multiple: frozenset[str]
    defaults: Mapping[str, Any]
    argument: str
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    flags: Mapping[str, str] = field(default_factory=dict)  # boolean flags (flag -> name): True when given
    required: frozenset[str] = frozenset()  # flags the shape needs (`launch` is a dry run only with --dryrun)


SHAPES: dict[str, Shape] = {
    "check-yaml": Shape(
        command="check-yaml",
        options={"--env": "env", "-e": "env", "--secret": "secret", "-o": "output", "--output": "output"},
        multiple=frozenset({"env", "secret"}),
        defaults={"env": (), "secret": (), "output": "table"},
        argument="files",
        choices={"output": ("table", "json")},  # cli/checkyaml.py FORMATS
    ),
    # `launch --dryrun [-o FORMAT] FILE|CMD`: every other flag of launch at its default
    "launch": Shape(
        command="launch",
        options={"-o": "output", "--output": "output"},
        multiple=frozenset(),
        defaults={"output": "table", "dryrun": False},
        argument="entrypoint",
        choices={"output": ("table", "json")},  # cli/context.py OUTPUT_FORMATS
        flags={"--dryrun": "dryrun"},
        required=frozenset({"dryrun"}),
    ),
}


def parse(shape: Shape, args: Sequence[str]) -> dict[str, Any] | None:
    """Pure: the parameters typer would pass for `args` (after the command name), or None when
    `args` is not of the plain shape (typer parses those)."""
    values: dict[str, Any] = {k: list(v) if k in shape.multiple else v for k, v in shape.defaults.items()}
    positional: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not token:
            return None  # typer's own reading of an empty argument
        if token in shape.flags:
            values[shape.flags[token]] = True
            i += 1
            continue
        if token.startswith("-"):
            name = shape.options.get(token)
            if name is None or i + 1 >= len(args):
                return None  # --help, --, an unknown or glued option, a missing value
            value = args[i + 1]
            if not value or value.startswith("-"):
                return None
            if name in shape.multiple:
                values[name].append(value)
            else:
                values[name] = value
            i += 2
            continue
        positional.append(token)
        i += 1
    if not positional:
        return None  # typer's "Missing argument" (check-yaml), launch's own message
    if not all(values[name] for name in shape.required):
        return None
    for name, accepted in shape.choices.items():
        if values[name] not in accepted:
            return None  # typer's BadParameter
    values[shape.argument] = positional
    return values


def eligible(environ: Mapping[str, str]) -> bool:
    """Pure: no setting in the environment that typer or the group callback would act on first."""
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in environ):
        return False  # click's shell completion
    stage = environ.get("SKYPURZA_STAGE")
    if stage:  # the group's --stage (its envvar): one it refuses is typer's usage error
        from skypurza.events.naming import check_stage

        try:
            check_stage(stage)
        except ValueError:
            return False
    return True


def serve(argv: Sequence[str]) -> None:
    """Run `argv` (sys.argv[1:]) and exit when it has a shape of SHAPES; otherwise return."""
    if not argv or argv[0] not in SHAPES:
        return
    values = parse(SHAPES[argv[0]], argv[1:])
    if values is None or not eligible(os.environ):
        return
    try:
        code = _run(argv[0], values)
    except KeyboardInterrupt:
        code = 130  # what typer's main makes of it
    except Exception as exc:  # cli/main.py's last line of defence, as the typer path has it
        typer = sys.modules.get("typer")
        if typer is not None and isinstance(exc, typer.Exit):  # a command's `raise fail(...)`: printed
            sys.exit(exc.exit_code)
        if os.environ.get("SKYPURZA_DEBUG"):
            raise
        from .context import error_line
        from .lostplane import top_level_error

        code, message = top_level_error(exc)
        code = error_line(message, code).exit_code
    sys.exit(code)


def _run(command: str, values: dict[str, Any]) -> int:
    from . import pydplugins

    # A plain task is read without the pydantic models (events/taskspec/plaintask.py), unless a
    # pydantic plug-in is installed: it sees every task validated, as on typer's path.
    plain = pydplugins.none_declared()
    if command == "check-yaml":
        from pathlib import Path

        from .checkyaml import check_yaml

        return check_yaml([Path(f) for f in values["files"]], values["env"], values["secret"], values["output"],
                          plain=plain)
    if command == "launch" and plain:
        from .launchdry import plain_dryrun

        code = plain_dryrun(values["entrypoint"], values["output"])
        if code is not None:
            return code
    pydplugins.install()  # no pydantic plug-in installed: no importlib.metadata to find none (cli/pydplugins.py)
    if command == "launch":
        from skypurza.events.taskspec.overrides import CliOverrides

        from .launchdry import launch_dryrun

        # no resource or task flag given: cli/options.py overrides_of of their defaults (a test checks it)
        return launch_dryrun(values["entrypoint"], CliOverrides(), values["output"])
    raise AssertionError(command)
