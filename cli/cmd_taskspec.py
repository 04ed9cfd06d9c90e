"""`spz check-yaml FILE...` and `spz schema task`: validate task YAMLs, print the JSON Schema.

Nothing here touches the bus. Imports of the task models and rich happen inside the commands,
so other verbs (and `spz --help`) do not pay for them; what check-yaml does once its arguments
are parsed is cli/checkyaml.py (also run without typer by cli/fastpath.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def check_yaml_command(
    files: list[Path] = typer.Argument(..., metavar="FILE...", help="Task YAML files to validate."),
    env: list[str] = typer.Option([], "--env", "-e", metavar="NAME[=VALUE]",
                                  help="Value for an env (fills `null` envs and $VARs), as sky launch --env."),
    secret: list[str] = typer.Option([], "--secret", metavar="NAME[=VALUE]", help="Value for a secret, as --env."),
    output: str = typer.Option("table", "-o", "--output", help="table (for people) or json (one object per file)."),
) -> None:
    """Validate task YAMLs as SkyPilot 0.14.1 would: exit 0 when all are valid, 1 otherwise."""
    from .checkyaml import FORMATS, check_yaml

    if output not in FORMATS:
        raise typer.BadParameter(f"{output!r}; accepted: {', '.join(FORMATS)}", param_hint="-o/--output")
    raise typer.Exit(check_yaml(files, env, secret, output))


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
