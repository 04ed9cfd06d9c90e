"""What `spz check-yaml` does once its arguments are parsed: validate each file, print its
result, return the exit code.

Parsed by typer (cli/cmd_taskspec.py) or, in a cold process whose arguments have a shape typer
would read the same way, by cli/fastpath.py: this module imports neither typer nor rich (its
lines go through cli/plainout.py, which hands rich only what rich would print differently).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

FORMATS = ("table", "json")


def _problem_dict(p: Any) -> dict[str, Any]:
    out = {"line": p.line, "column": p.column, "path": p.path, "message": p.message}
    if p.document is not None:
        out["document"] = p.document
    return out


def check_yaml(files: list[Path], env: list[str], secret: list[str], output: str, *, plain: bool = False) -> int:
    """`spz check-yaml` once its arguments are parsed (by typer, or by cli/fastpath.py for a
    cold process): print each file's result, return the exit code. Imports no typer or rich
    (cli/plainout.py prints through rich only what rich would print differently). `plain`: a file
    that holds one plain task with nothing to warn about is found valid without the pydantic
    models (events/taskspec/plaintask.py `plain_without_warnings`); the models load the rest."""
    from skypurza.events.taskspec.errors import Problem, TaskSpecError
    from skypurza.events.taskspec.plaintask import plain_without_warnings

    from .plainout import Lines, escape

    console = Lines()
    try:
        envs = secrets = {}
        if env or secret:  # --env/--secret: values fill the tasks' envs and secrets (the models' loader)
            from skypurza.events.taskspec.overrides import parse_var_flags

            envs = parse_var_flags(env, os.environ, "--env")
            secrets = parse_var_flags(secret, os.environ, "--secret")
    except TaskSpecError as exc:
        for p in exc.problems:
            path, message = escape(p.path), escape(p.message)
            console.print(f"[red]error[/red] {path}: {message}", path, message)
        return 1

    all_valid = True
    for path in files:
        shown = str(path)
        errors: list[Problem] = []
        warnings: list[Problem] = []
        count = 0
        try:
            if plain and not envs and not secrets and plain_without_warnings(path):
                count = 1
            else:
                loaded = _models_loader(plain)(path, env_overrides=envs, secret_overrides=secrets, filename=shown)
                warnings, count = loaded.warnings, len(loaded.tasks)
        except TaskSpecError as exc:
            errors = exc.problems
        except Exception as exc:  # a bug of ours must still not hide the other files' results
            errors = [Problem(shown, None, None, "", f"internal error while checking this file: {exc!r}")]
        all_valid = all_valid and not errors
        if output == "json":
            _echo(json.dumps({"file": shown, "valid": not errors, "errors": [_problem_dict(p) for p in errors],
                              "warnings": [_problem_dict(p) for p in warnings]}))
            continue
        name = escape(shown)
        if errors:
            noun = "problem" if len(errors) == 1 else "problems"
            console.print(f"[bold red]✗[/bold red] {name}: {len(errors)} {noun}", name)
        else:
            noun = "task" if count == 1 else "tasks"
            console.print(f"[bold green]✓[/bold green] {name}: valid ({count} {noun})", name)
        for p, style, label in [(p, "red", "error") for p in errors] + [(p, "yellow", "warning") for p in warnings]:
            where, key, message = escape(p.location()), escape(p.path), escape(p.message)
            path_part = f" [cyan]{key}[/cyan]:" if p.path else ""
            console.print(f"  {where}:{path_part} [{style}]{label}:[/{style}] {message}", where, key, message)
    return 0 if all_valid else 1


def _models_loader(plain: bool) -> Any:
    """The models' load_tasks; from the shortcut (`plain`), pydantic's plug-in lookup spared first,
    as cli/fastpath.py does for every other path to the models."""
    if plain:
        from . import pydplugins

        pydplugins.install()
    from skypurza.events.taskspec.loader import load_tasks

    return load_tasks


def _echo(line: str) -> None:
    """typer.echo of one line of ASCII (JSON): click writes it and flushes; a closed pipe is exit 1
    without a word, as click's standalone mode ends it."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1) from None
