"""`spz events tail|replay|schema|dlq`: read the event log, export the event schemas.

`events export` and `events replay --into` are the ledger's (platform code): its CLI plugin adds
the one and provides the other (`provide_replay_into`); this module never imports it.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from .context import check_output, fail, print_json, run_async, stage

events = typer.Typer(name="events", help="The event log: follow it, replay it, export its schemas.",
                     no_args_is_help=True)

# What `replay --into FILE [--until]` runs: rebuilding the ledger's projections is the ledger's
# own code, so its CLI plugin provides it; None while no plugin has.
ReplayInto = Callable[[Path, Optional[str]], None]
_replay_into: ReplayInto | None = None


def provide_replay_into(command: ReplayInto) -> None:
    """Called by the ledger's CLI plugin (services/ledger/cli.py) when it registers."""
    global _replay_into
    _replay_into = command


def parse_since(value: str | None, flag: str = "--since") -> tuple[int | None, datetime | None]:
    """`--since 42` is a stream sequence; `--since 2026-11-30T10:00` (or a date) is a time (UTC if naive)."""
    if value is None or value == "":
        return None, None
    if value.isdigit():
        return int(value), None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{value!r}: give a sequence number (42) or an ISO time (2026-11-30T10:00:00Z)",
                                 param_hint=flag)
    return None, t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _filter(stored: Any, type_: str | None, subject: str | None) -> bool:
    if type_ and stored.envelope is not None:
        name = stored.envelope.event_name
        if type_ not in (name, stored.envelope.type, name.replace("_", "")) and \
                type_.lower().replace("_", "") != name.replace("_", ""):
            return False
    if subject and subject not in stored.subject and (stored.envelope is None or subject not in stored.envelope.subject):
        return False
    return True


def _line(stored: Any) -> str:
    env = stored.envelope
    if env is None:
        return f"{stored.seq:>8}  {stored.timestamp:%Y-%m-%d %H:%M:%S}  [{stored.status}] {stored.reason}"
    keys = ", ".join(f"{k}={v}" for k, v in list(env.data_dict().items())[:4] if not isinstance(v, (dict, list)))
    return f"{stored.seq:>8}  {env.time:%Y-%m-%d %H:%M:%S}  {env.event_name:<26} {env.subject:<28} {keys}"


def _emit(stored: Any, output: str) -> None:
    if output == "json":
        if stored.envelope is not None:
            doc = json.loads(stored.envelope.to_json())
            doc["sequence"] = str(stored.seq)  # CloudEvents extension: the stream sequence
            typer.echo(json.dumps(doc))
        else:
            typer.echo(json.dumps({"sequence": str(stored.seq), "status": stored.status, "reason": stored.reason}))
    else:
        typer.echo(_line(stored))


@events.command("tail")
def tail_command(
    type_: Optional[str] = typer.Option(None, "--type", help="Only this event type (task_submitted, TaskSubmitted, or the full type)."),
    subject: Optional[str] = typer.Option(None, "--subject", help="Only events whose subject contains this (e.g. cluster/mycluster)."),
    since: Optional[str] = typer.Option(None, "--since", help="Start at a sequence or time instead of new events only."),
    output: str = typer.Option("table", "-o", "--output", help="table, or json (CloudEvents, one per line)."),
) -> None:
    """Follow the log live (Ctrl-C to stop)."""
    check_output(output)
    seq, t = parse_since(since)

    async def run() -> None:
        from skypurza.events.bus import stored_from_msg

        from .control import connect_bus

        bus = await connect_bus(stage(), "events-tail")
        try:
            async for msg in bus.follow(start_seq=seq, start_time=t, new_only=seq is None and t is None):
                stored = stored_from_msg(msg)
                if _filter(stored, type_, subject):
                    _emit(stored, output)
        finally:
            await bus.close()

    try:
        run_async(run())
    except KeyboardInterrupt:  # the way to stop following: 130, as every command stopped by Ctrl-C
        raise typer.Exit(130)


@events.command("replay")
def replay_command(
    since: Optional[str] = typer.Option(None, "--since", help="From this sequence or time (default: the start)."),
    until: Optional[str] = typer.Option(None, "--until", help="Up to this sequence or time (inclusive)."),
    into: Optional[Path] = typer.Option(None, "--into", help="Rebuild the ledger's projections into this new DuckDB file instead of printing."),
    type_: Optional[str] = typer.Option(None, "--type", help="Only this event type."),
    subject: Optional[str] = typer.Option(None, "--subject", help="Only events whose subject contains this."),
    output: str = typer.Option("table", "-o", "--output", help="table, or json (CloudEvents, one per line)."),
) -> None:
    """Print the log from a point to its current end, or rebuild projections with --into."""
    check_output(output)
    seq, t = parse_since(since)
    useq, ut = parse_since(until, "--until")
    if into is not None:
        if _replay_into is None:
            from .context import error_line
            from .plugins import not_installed

            raise error_line(not_installed("events replay --into"), 1)
        _replay_into(into, until)
        return

    async def run() -> int:
        from .control import connect_bus

        bus = await connect_bus(stage(), "events-replay")
        n = 0
        try:
            async for stored in bus.replay(start_seq=seq, start_time=t, until_seq=useq, until_time=ut):
                if _filter(stored, type_, subject):
                    _emit(stored, output)
                    n += 1
        finally:
            await bus.close()
        return n

    run_async(run())


@events.command("schema")
def schema_command(
    type_: Optional[str] = typer.Argument(None, metavar="[TYPE]", help="One event type (default: all)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Write to this file instead of stdout."),
    list_: bool = typer.Option(False, "--list", help="Only list the event types."),
) -> None:
    """JSON Schema of each event (its CloudEvents envelope with the typed `data`)."""
    from skypurza.events.schemas import event_schemas

    schemas = event_schemas()
    if list_:
        for name in schemas:
            typer.echo(name)
        return
    if type_:
        match = {k: v for k, v in schemas.items() if type_ in (k, k.split(".")[-2]) or
                 k.split(".")[-2].replace("_", "") == type_.lower().replace("_", "")}
        if not match:
            raise fail(f"unknown event type {type_!r}; `spz events schema --list` shows them")
        schemas = match
    text = json.dumps(schemas if not type_ else next(iter(schemas.values())), indent=2)
    if out:
        out.write_text(text + "\n")
        typer.echo(f"wrote {len(schemas)} schema(s) to {out}")
    else:
        typer.echo(text)


@events.command("dlq")
def dlq_command(
    service: Optional[str] = typer.Option(None, "--service", help="Only what this service parked."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Dead letters: events a service could not apply (parked so it goes on), with who parked
    each, the error's type and message, and the event itself (its type here; all of it in -o json)."""
    check_output(output)

    async def run() -> list[dict[str, Any]]:
        from skypurza.events.service import dead_letters

        from .control import connect_bus

        bus = await connect_bus(stage(), "events-dlq")
        try:
            return await dead_letters(bus, service)
        finally:
            await bus.close()

    rows = run_async(run())
    if output == "json":
        print_json(rows)
        return
    for r in rows:
        event = r.get("event_type") or "(unreadable)"
        typer.echo(f"{r['stream_seq']:>8}  {r['service'] or '?':<12} {event}  {r['subject'] or ''}\n"
                   f"{'':>8}  {r['error'] or ''}")
    if not rows:
        typer.echo("No dead letters.")


def register(app: typer.Typer) -> None:
    app.add_typer(events, name="events")
