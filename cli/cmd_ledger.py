"""`spz ledger ...`: ledger commands. `billing` computes Slurm billing for one allocation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from decimal import Decimal


def _decimal_literal(value: Decimal) -> str:
    """A JSON number with every digit of the exact value (floats would round long decimals)."""
    text = format(value, "f")
    return text if "." in text else f"{text}.0"


def billing_command(
    tres: str = typer.Option(
        ...,
        "--tres",
        help="Allocated TRES, e.g. cpu=4,mem=8G,node=1,gres/gpu=2,gres/gpu:h100=2,license/NAME=1 "
        "(mem in MiB, or with a suffix as Slurm writes it: 8192M, 8G).",
    ),
    weights: str = typer.Option(
        "",
        "--weights",
        help="TRESBillingWeights, e.g. CPU=1.0,Mem=0.25G,GRES/gpu=2.0,GRES/gpu:h100=4.0 "
        "(empty: Slurm's default, billing = CPUs).",
    ),
    flags: str = typer.Option("", "--flags", help="PriorityFlags, e.g. MAX_TRES or MAX_TRES_GRES."),
    output: str = typer.Option("table", "-o", "--output", help="json or table."),
) -> None:
    """Slurm billing of one allocation: the exact value and the integer Slurm stores."""
    from skypurza.services.ledger import billing as bl

    if output not in ("json", "table"):
        raise typer.BadParameter(f"{output!r}; accepted: json, table", param_hint="-o/--output")
    try:
        parsed_weights = bl.parse_weights(weights)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--weights") from exc
    try:
        parsed_tres = bl.parse_tres(tres)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tres") from exc
    try:
        mode = bl.billing_mode(flags)
        result = bl.billing(parsed_weights, parsed_tres, mode)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--flags") from exc

    for untyped, typed in bl.double_counted_gres(parsed_weights):
        typer.echo(
            f"warning: both {untyped} and {typed} are weighted; Slurm records a GPU under both, "
            f"so each is billed twice",
            err=True,
        )

    if output == "json":
        typer.echo(f'{{"billing": {_decimal_literal(result.billing)}, "billing_int": {result.billing_int}}}')
        return

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"billing ({result.mode.value})")
    for col in ("TRES", "count", "weight", "value", "role"):
        table.add_column(col, justify="left" if col in ("TRES", "role") else "right")
    for term in result.terms:
        table.add_row(term.key, str(term.count), format(term.weight, "f"), format(term.value, "f"), term.role)
    console = Console()
    console.print(table)
    console.print(f"billing (exact)        {_decimal_literal(result.billing)}")
    console.print(f"billing (Slurm double) {result.billing_double!r}")
    console.print(f"billing_int (stored)   {result.billing_int}")


def register(app: typer.Typer) -> None:
    """Add the `ledger` sub-app to ``app``."""
    ledger = typer.Typer(name="ledger", help="Usage, billing and settlement.", no_args_is_help=True)
    ledger.command("billing")(billing_command)
    app.add_typer(ledger, name="ledger")
