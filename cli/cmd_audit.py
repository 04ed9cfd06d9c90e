"""`spz audit`: every projection compared with a fresh replay of the log, table by table.

The status projection's audit is open code (the status service replays the log into a fresh
file and compares, services/status/service.py); a platform package with a projection of its own
(the ledger) provides its part through `provide_audit` when its CLI plugin registers, so this
module never imports it. The answer says which projection, and which of its tables, differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from .context import check_output, fail, print_json, run_async, stage

STATUS = "status"


@dataclass(frozen=True)
class Audit:
    """One projection's audit: live (its service replays and compares) and offline (two files)."""

    live: Callable[[Optional[Path]], dict[str, Any]]  # keep -> result (raises typer.Exit when it cannot)
    offline: Callable[[Path, Path], dict[str, Any]]


_provided: dict[str, Audit] = {}


def provide_audit(projection: str, live: Callable[[Optional[Path]], dict[str, Any]],
                  offline: Callable[[Path, Path], dict[str, Any]]) -> None:
    """Called by a platform CLI plugin (the ledger's) when it registers."""
    _provided[projection] = Audit(live, offline)


def _status_live(keep: Optional[Path]) -> dict[str, Any]:
    from skypurza.events import naming, status_queries

    from .control import connect_bus
    from .health import why_not_answering

    async def run() -> dict[str, Any]:
        bus = await connect_bus(stage(), "audit")
        try:
            return await status_queries.audit(bus, keep=str(keep.resolve()) if keep else None)
        finally:
            await bus.close()

    try:
        return run_async(run())
    except RuntimeError as exc:  # the service's own error message
        raise fail(str(exc))
    except Exception as exc:
        if type(exc).__name__ in ("NoRespondersError", "TimeoutError") or isinstance(exc, (TimeoutError, OSError)):
            why = why_not_answering(naming.services_health_file(stage()), STATUS)
            raise fail(why or "the status service is not running; start it with `spz api start`")
        raise


def _status_offline(live: Path, replay: Path) -> dict[str, Any]:
    from skypurza.events.projection.replay import audit
    from skypurza.services.status.projector import PROJECTION

    return audit(live, replay, PROJECTION)


def audits() -> dict[str, Audit]:
    """The projections to audit: the status one, then those platform plugins provided."""
    return {STATUS: Audit(_status_live, _status_offline), **dict(sorted(_provided.items()))}


def projection_of(file: Path) -> str:
    """Which projection a file holds (its checkpoint row names it)."""
    import duckdb

    con = duckdb.connect(str(file), read_only=True)
    try:
        rows = con.execute("SELECT projection FROM checkpoint").fetchall()
    finally:
        con.close()
    if len(rows) != 1:
        raise ValueError(f"{file} has {len(rows)} checkpoint rows: not a projection file")
    return str(rows[0][0])


def combine(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One answer for several projections: `ok`, `differing` as "projection.table", `tables`
    (each entry names its projection) and each projection's own result."""
    tables = [{"projection": p, **t} for p, r in results.items() for t in r["tables"]]
    return {"ok": all(r["ok"] for r in results.values()),
            "differing": [f"{p}.{t}" for p, r in results.items() for t in r["differing"]],
            "tables": tables, "projections": results}


def audit_command(
    live: Optional[Path] = typer.Option(None, "--live",
                                        help="Compare this projections file (of a stopped service) ..."),
    replay: Optional[Path] = typer.Option(None, "--replay",
                                          help="... with this one (e.g. from `spz events replay --into`)."),
    keep: Optional[Path] = typer.Option(None, "--keep", help="Keep each fresh replay, in this file (one projection) "
                                                              "or beside it, named after the projection."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Compare the live projections (status, and accounting where installed) with a fresh replay
    of the log, table by table.

    Row counts and content checksums; exits with 1 when they differ.
    """
    check_output(output)
    if (live is None) != (replay is None):
        raise typer.BadParameter("give both --live and --replay, or neither (then each service audits itself)")
    known = audits()
    if live is not None and replay is not None:
        for f in (live, replay):
            if not f.exists():
                raise fail(f"{f} does not exist")
        try:
            projection = projection_of(live)
            if projection not in known:
                raise fail(f"{live} holds the {projection!r} projection, which no installed package audits")
            results = {projection: known[projection].offline(live, replay)}
        except typer.Exit:
            raise
        except Exception as exc:  # e.g. the file is open by a running service
            raise fail(f"cannot read the files: {exc}")
    else:
        results = {}
        for name, a in known.items():
            where = keep if keep is None or len(known) == 1 else keep.with_name(f"{keep.stem}.{name}{keep.suffix}")
            results[name] = a.live(where)
    res = combine(results)
    if output == "json":
        print_json(res)
    else:
        for name, r in results.items():
            typer.echo(f"{name}:")
            for t in r["tables"]:
                mark = "ok  " if t["equal"] else "DIFF"
                typer.echo(f"{mark} {t['table']:<18} live {t['live_rows']:>10,} rows  "
                           f"replay {t['replay_rows']:>10,} rows")
                for side in ("only_live", "only_replay"):
                    for row in t.get(side) or []:
                        typer.echo(f"       {side}: {row}")
        typer.echo("The projections match the log." if res["ok"] else
                   f"The projections differ from the log in: {', '.join(res['differing'])}")
    if not res["ok"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("audit")(audit_command)
