"""`spz check-yaml FILE...` and `spz schema task`: validate task YAMLs, print the JSON Schema.

Nothing here touches the bus. Imports of the task models and rich happen inside the commands,
so other verbs (and `spz --help`) do not pay for them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import typer

_FORMATS = ("table", "json")


def _problem_dict(p: Any) -> dict[str, Any]:
    out = {"line": p.line, "column": p.column, "path": p.path, "message": p.message}
    if p.document is not None:
        out["document"] = p.document
    return out


def check_yaml_command(
    files: list[Path] = typer.Argument(..., metavar="FILE...", help="Task YAML files to validate."),
    env: list[str] = typer.Option([], "--env", "-e", metavar="NAME[=VALUE]",
                                  help="Value for an env (fills `null` envs and $VARs), as sky launch --env."),
    secret: list[str] = typer.Option([], "--secret", metavar="NAME[=VALUE]", help="Value for a secret, as --env."),
    output: str = typer.Option("table", "-o", "--output", help="table (for people) or json (one object per file)."),
) -> None:
    """Validate task YAMLs as SkyPilot 0.14.1 would: exit 0 when all are valid, 1 otherwise."""
    if output not in _FORMATS:
        raise typer.BadParameter(f"{output!r}; accepted: {', '.join(_FORMATS)}", param_hint="-o/--output")
    from rich.console import Console
    from rich.markup import escape

    from skypurza.events.taskspec.errors import Problem, TaskSpecError
    from skypurza.events.taskspec.loader import load_tasks
    from skypurza.events.taskspec.overrides import parse_var_flags

    console = Console(highlight=False, soft_wrap=True)
    try:
        envs = parse_var_flags(env, os.environ, "--env")
        secrets = parse_var_flags(secret, os.environ, "--secret")
    except TaskSpecError as exc:
        for p in exc.problems:
            console.print(f"[red]error[/red] {escape(p.path)}: {escape(p.message)}")
        raise typer.Exit(1) from None

    all_valid = True
    for path in files:
        shown = str(path)
        errors: list[Problem] = []
        warnings: list[Problem] = []
        count = 0
        try:
            loaded = load_tasks(path, env_overrides=envs, secret_overrides=secrets, filename=shown)
            warnings, count = loaded.warnings, len(loaded.tasks)
        except TaskSpecError as exc:
            errors = exc.problems
        except Exception as exc:  # a bug of ours must still not hide the other files' results
            errors = [Problem(shown, None, None, "", f"internal error while checking this file: {exc!r}")]
        all_valid = all_valid and not errors
        if output == "json":
            typer.echo(json.dumps({"file": shown, "valid": not errors, "errors": [_problem_dict(p) for p in errors],
                                   "warnings": [_problem_dict(p) for p in warnings]}))
            continue
        if errors:
            noun = "problem" if len(errors) == 1 else "problems"
            console.print(f"[bold red]✗[/bold red] {escape(shown)}: {len(errors)} {noun}")
        else:
            noun = "task" if count == 1 else "tasks"
            console.print(f"[bold green]✓[/bold green] {escape(shown)}: valid ({count} {noun})")
        for p, style, label in [(p, "red", "error") for p in errors] + [(p, "yellow", "warning") for p in warnings]:
            path_part = f" [cyan]{escape(p.path)}[/cyan]:" if p.path else ""
            console.print(f"  {escape(p.location())}:{path_part} [{style}]{label}:[/{style}] {escape(p.message)}")
    raise typer.Exit(0 if all_valid else 1)


def schema_task_command(
    output: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE",
                                          help="Write the schema to FILE instead of standard output."),
) -> None:
    """JSON Schema of a task document, for editors (yaml-language-server, VS Code's YAML extension)."""
    from skypurza.events.taskspec.schema import task_json_schema

    text = json.dumps(task_json_schema(), indent=2) + "\n"
    if output is None:
        typer.echo(text, nl=False)
        return
    output.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {output}", err=True)


def register(app: typer.Typer) -> None:
    """Add `check-yaml` and `schema task` to the spz app."""
    app.command("check-yaml")(check_yaml_command)
    schema_app = typer.Typer(help="JSON Schemas of spz inputs, for editors.", no_args_is_help=True)
    schema_app.command("task")(schema_task_command)
    app.add_typer(schema_app, name="schema")
