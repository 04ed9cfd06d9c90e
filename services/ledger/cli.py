"""The accounting commands of `spz`, a CLI plugin of the platform: `spz cost-report`,
`spz ledger billing|settle|settlements`, `spz events export`, what `spz events replay --into`
does, and the ledger's part of `spz audit` (the open command, cli/cmd_audit.py).

This module is platform code (the ledger's accounting: billing, showback, settlement, export,
replay): the open CLI never imports it. It joins `spz` through the `skypurza.cli_plugins`
entry point (pyproject.toml), which `cli/plugins.py` loads; without it the open broker's CLI
still runs and says these commands are not installed (docs/DESIGN.md, *Open and platform*).

Queries go to the ledger service over NATS request-reply (`skypurza.events.ledger_queries`): the
projections file has one writer, the ledger. Replay and export read the log themselves.
"""

from __future__ import annotations

import csv
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from skypurza.cli.bounds import DAYS
from skypurza.cli.context import check_output, fail, print_json, run_async, stage

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

    from skypurza.cli.console import console as make_console
    from rich.table import Table

    table = Table(title=f"billing ({result.mode.value})")
    for col in ("TRES", "count", "weight", "value", "role"):
        table.add_column(col, justify="left" if col in ("TRES", "role") else "right")
    for term in result.terms:
        table.add_row(term.key, str(term.count), format(term.weight, "f"), format(term.value, "f"), term.role)
    console = make_console()
    console.print(table)
    console.print(f"billing (exact)        {_decimal_literal(result.billing)}")
    console.print(f"billing (Slurm double) {result.billing_double!r}")
    console.print(f"billing_int (stored)   {result.billing_int}")


# ---------------------------------------------------------------- helpers


async def _bus(source: str) -> Any:
    from skypurza.cli.control import connect_bus

    return await connect_bus(stage(), source)


class _NoLedger(Exception):
    """No ledger subscribed to its query subjects."""


def _ask(source: str, call: Any) -> Any:
    """Run `call(bus)` against the ledger; a missing ledger is an error message, not a traceback."""

    async def run() -> Any:
        bus = await _bus(source)
        try:
            return await call(bus)
        except Exception as exc:
            # NATS is there and answered: nobody serves the ledger's queries (it is not a lost plane).
            if type(exc).__name__ == "NoRespondersError":
                raise _NoLedger() from None
            raise
        finally:
            await bus.close()

    try:
        return run_async(run())
    except _NoLedger:
        from skypurza.events import naming

        from skypurza.cli.health import why_not_answering

        why = why_not_answering(naming.services_health_file(stage()), "ledger")
        raise fail(why or "the ledger service is not running; start it with `spz api start`")
    except (TimeoutError, OSError) as exc:
        raise fail(f"the ledger did not answer ({type(exc).__name__}); is it running? (`spz api status`)")
    except RuntimeError as exc:  # the ledger's own error message (bad period, bad --by ...)
        raise fail(str(exc))
    except Exception as exc:
        if type(exc).__name__ in ("NoRespondersError", "TimeoutError"):
            raise fail("the ledger service is not running; start it with `spz api start`")
        raise


def _since(value: str | None, days: int | None) -> str | None:
    if days is not None:
        return (datetime.now(timezone.utc) - timedelta(days=days)).isoformat()
    return value or None


# ---------------------------------------------------------------- cost-report


def cost_report_command(
    by: str = typer.Option("team", "--by", help="Group by user, team, project, cluster, region or day."),
    since: Optional[str] = typer.Option(None, "--since", help="From this date/time or period (2026-11-01, 2026-11, ISO time; UTC)."),
    until: Optional[str] = typer.Option(None, "--until", help="Up to (excluding) this date/time or period."),
    days: Optional[int] = typer.Option(None, "--days", parser=DAYS, help="The last N days (instead of --since)."),
    output: str = typer.Option("table", "-o", "--output", help="table, json or csv."),
    all_: bool = typer.Option(False, "-a", "--all", help="Every cluster on a line of its own, over all time "
                                                         "(as sky cost-report -a: --by cluster, no --days limit)."),
    live: bool = typer.Option(False, "--live", help="The cost so far of the jobs running now (managed jobs: their "
                                                    "cluster's metered cost; jobs on a shared cluster: an estimate)."),
    workspace: Optional[str] = typer.Option(None, "-w", "--workspace",
                                            help="One team's lines only (a workspace is a team: spz teams list). "
                                                 "Through an API server: a team of yours (an admin: any)."),
) -> None:
    """Showback: cost in dollars and Slurm billing units, for live and finished clusters.

    Usage lines count metered intervals by their start in [since, until).

    Late usage of a settled period is a `compensation` line in the period it is booked in.
    """
    check_output(output, ("table", "json", "csv"))
    from skypurza.cli.options import workspace_of

    team = workspace_of(workspace)
    if live:
        if all_ or since is not None or until is not None or days is not None or team is not None:
            raise typer.BadParameter("--live is the jobs running now: leave out --since/--until/--days/-a/-w",
                                     param_hint="--live")
        return _live_report(output)
    if all_:
        if since is not None or days is not None:
            raise typer.BadParameter("-a/--all covers all time: leave out --since/--days", param_hint="-a/--all")
        by = "cluster"
    from skypurza.services.ledger.showback import GROUP_BYS

    if by not in GROUP_BYS:
        raise typer.BadParameter(f"{by!r}; accepted: {', '.join(GROUP_BYS)}", param_hint="--by")
    from skypurza.events import ledger_queries as lq

    from skypurza.cli.transport import api

    t = api()
    if t is not None:  # through the configured API server: its GET /api/v1/cost-report
        from skypurza.cli.via_api_jobs import cost_report

        rep = cost_report(t, by, _since(since, days), until, workspace=team)
    else:
        rep = _ask("cost-report", lambda bus: lq.cost_report(bus, by=by, since=_since(since, days), until=until,
                                                             team=team))
        if team is not None:  # the ledger's cut, said on stderr as through a server: the report prints the same
            rep.pop("team", None)
            typer.echo(f"Team {team} only.", err=True)
    if output == "json":
        print_json(rep)
        return
    if output == "csv":
        w = csv.writer(sys.stdout)
        w.writerow([by, "kind", "for_period", "cost_usd", "cost_micros", "billing_seconds", "billing_minutes", "rows"])
        for line in rep["lines"]:
            w.writerow([line["key"], line["kind"], line["for_period"] or "", line["cost_usd"], line["cost_micros"],
                        line["billing_seconds"], line["billing_minutes"], line["rows"]])
        return
    from skypurza.cli.console import console as make_console
    from rich.table import Table

    from skypurza.services.ledger.showback import format_dollars

    table = Table(title=f"Cost by {by}" + (f" since {rep['since']}" if rep["since"] else "")
                  + (f" until {rep['until']}" if rep["until"] else ""))
    for col, just in ((by.upper(), "left"), ("KIND", "left"), ("FOR PERIOD", "left"), ("COST", "right"),
                      ("BILLING (TRES-min)", "right"), ("INTERVALS", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for line in rep["lines"]:
        table.add_row(line["key"], line["kind"], line["for_period"] or "", format_dollars(line["cost_micros"]),
                      f"{line['billing_minutes']:,}", f"{line['rows']:,}")
    total = rep["total"]
    table.add_row("TOTAL", "", "", format_dollars(total["cost_micros"]), f"{total['billing_minutes']:,}", "",
                  style="bold")
    make_console().print(table)


def _live_report(output: str) -> None:
    from datetime import UTC

    from skypurza.cli.transport import api
    from skypurza.events import status_queries as sq

    from .live import live_lines

    if api() is not None:
        raise fail("--live reads the control plane's bus; the configured API server does not serve it yet "
                   "(unset SKYPURZA_API_SERVER, or run it where the control plane is)")

    async def gather(bus: Any) -> Any:
        import asyncio

        return await asyncio.gather(sq.status(bus), sq.queue(bus, skip_finished=True),
                                    sq.jobs_queue(bus, skip_finished=True))

    clusters, jobs, managed = _ask("cost-report-live", gather)
    rep = live_lines(clusters, jobs, managed, datetime.now(UTC))
    if output == "json":
        print_json(rep)
        return
    cols = ["job", "kind", "cluster", "user", "team", "status", "started_at", "rate_usd_per_hour", "cost_usd", "estimate"]
    if output == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(cols)
        for line in rep["lines"]:
            w.writerow([line.get(c) if line.get(c) is not None else "" for c in cols])
        return
    if not rep["lines"]:
        typer.echo("No jobs running.")
        return
    from skypurza.cli.tables import print_table

    print_table(["JOB", "KIND", "CLUSTER", "USER", "TEAM", "STATUS", "STARTED", "$/H", "COST SO FAR"],
                [[x["job"], x["kind"], str(x["cluster"]), str(x["user"] or "-"), str(x["team"] or "-"), str(x["status"]),
                  str(x["started_at"] or "-"), x["rate_usd_per_hour"],
                  x["cost_usd"] + (" (estimate)" if x["estimate"] else "")] for x in rep["lines"]])
    typer.echo(f"TOTAL {rep['total']['cost_usd']}")


# ---------------------------------------------------------------- settle


def settle_command(
    period: str = typer.Option(..., "--period", help="The month to close, YYYY-MM (UTC)."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Close a period: the ledger publishes PeriodSettled with the totals per team.

    Usage of the period that arrives later is booked in the next open period, as a compensation.
    """
    check_output(output)
    from skypurza.services.ledger.showback import format_dollars, parse_period

    try:
        parse_period(period)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--period")
    from skypurza.events import ledger_queries as lq

    res = _ask("ledger-settle", lambda bus: lq.settle(bus, period))
    if output == "json":
        print_json(res)
        return
    typer.echo(f"Settled {res['period']} at sequence {res['through_seq']} (event {res['event_id']}):")
    for team, t in sorted(res["teams"].items()):
        typer.echo(f"  {team:<24} {format_dollars(t['cost_micros']):>14}  {t['billing_seconds'] // 60:,} TRES-min")
    typer.echo(f"  {'TOTAL':<24} {format_dollars(res['total_micros']):>14}")


def settlements_command(output: str = typer.Option("table", "-o", "--output", help="table or json.")) -> None:
    """Settled periods and their totals per team."""
    check_output(output)
    from skypurza.events import ledger_queries as lq
    from skypurza.services.ledger.showback import format_dollars

    rows = _ask("ledger-settlements", lq.settlements)
    if output == "json":
        print_json(rows)
        return
    if not rows:
        typer.echo("No settled period.")
    for r in rows:
        typer.echo(f"{r['period']}  settled {r['settled_at']}  through seq {r['through_seq']}  "
                   f"total {format_dollars(r['total_micros'])}")


# ---------------------------------------------------------------- audit


def _audit_live(keep: Optional[Path]) -> dict[str, Any]:
    """The ledger's part of `spz audit` (cli/cmd_audit.py): the ledger replays and compares."""
    from skypurza.events import ledger_queries as lq

    return _ask("audit", lambda bus: lq.audit(bus, keep=str(keep.resolve()) if keep else None))


def _audit_offline(live: Path, replay: Path) -> dict[str, Any]:
    """`spz audit --live A --replay B` for two ledger files nobody writes."""
    from skypurza.services.ledger.replay import audit

    return audit(live, replay)


# ---------------------------------------------------------------- events replay --into / export


def _seq_or_time(value: str | None, flag: str) -> tuple[int | None, datetime | None]:
    from skypurza.cli.cmd_events import parse_since

    return parse_since(value, flag)


def replay_into_command(into: Path, until: Optional[str] = None, overwrite: bool = False) -> None:
    """`spz events replay --into FILE [--until SEQ|TIME]`: rebuild the projections from the log."""
    from skypurza.services.ledger.replay import replay_into

    useq, utime = _seq_or_time(until, "--until")
    if into.exists() and not overwrite:
        raise fail(f"{into} exists; replay builds a new file")

    async def run() -> dict[str, Any]:
        bus = await _bus("events-replay-into")
        try:
            return await replay_into(bus, into, until_seq=useq, until_time=utime, overwrite=overwrite)
        finally:
            await bus.close()

    res = run_async(run())
    typer.echo(f"Replayed {res['records']:,} events (through sequence {res['last_seq']}) into {res['file']} "
               f"in {res['seconds']} s.")


def export_command(
    file: Path = typer.Argument(..., help="Where to write the events."),
    format: str = typer.Option("jsonl", "--format", help="jsonl (CloudEvents, one per line) or parquet."),
    since: Optional[str] = typer.Option(None, "--since", help="From this sequence or time (default: the start)."),
    until: Optional[str] = typer.Option(None, "--until", help="Up to this sequence or time (inclusive)."),
) -> None:
    """Export the event log for auditors and external tools."""
    from skypurza.services.ledger.export import FORMATS, export

    if format not in FORMATS:
        raise typer.BadParameter(f"{format!r}; accepted: {', '.join(FORMATS)}", param_hint="--format")
    sseq, stime = _seq_or_time(since, "--since")
    useq, utime = _seq_or_time(until, "--until")

    async def run() -> dict[str, Any]:
        bus = await _bus("events-export")
        try:
            return await export(bus, format, file, since_seq=sseq, since_time=stime, until_seq=useq, until_time=utime)
        finally:
            await bus.close()

    res = run_async(run())
    typer.echo(f"Exported {res['events']:,} events (sequences {res['first_seq']}..{res['last_seq']}) to {res['file']}.")


def register(app: typer.Typer) -> None:
    """The `skypurza.cli_plugins` entry point: add `cost-report` and the `ledger` sub-app to
    ``app``, the ledger's part of `spz audit`; where ``app`` has the `events` sub-app, add
    `events export` to it and provide `events replay --into`."""
    ledger = typer.Typer(name="ledger", help="Usage, billing and settlement.", no_args_is_help=True)
    ledger.command("billing")(billing_command)
    ledger.command("settle")(settle_command)
    ledger.command("settlements")(settlements_command)
    app.add_typer(ledger, name="ledger")
    app.command("cost-report")(cost_report_command)
    from skypurza.cli import cmd_audit

    cmd_audit.provide_audit("ledger", _audit_live, _audit_offline)
    events_app = next((g.typer_instance for g in app.registered_groups if g.name == "events"), None)
    if events_app is not None:
        from skypurza.cli import cmd_events

        events_app.command("export")(export_command)
        cmd_events.provide_replay_into(replay_into_command)
