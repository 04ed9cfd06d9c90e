"""`spz alerts list [-o json] [--all]`: the alerts firing now (or, with --all, every alert and when
it ended), a CLI plugin of the platform (the `skypurza.cli_plugins` entry point).

It reads the alert events back from the log (AlertRaised, AlertResolved, AlertDelivered on the
`alert` aggregate), so it answers while the alerts service is down too; what it shows is what the
service decided, never judged again here.
"""

from __future__ import annotations

from typing import Any

import typer

from skypurza.cli.context import check_output, fail, print_json, run_async, stage

MAX_SHOWN = 10_000  # alerts kept for --all (the newest)

app = typer.Typer(help="Built-in alerts: what fires now, and their history (docs/observability.md#alerts).",
                  no_args_is_help=True)


def history(events: list[Any]) -> list[dict[str, Any]]:
    """Pure: one row per (key, occurrence), oldest first, from the alert events in log order."""
    from skypurza.events.alert_events import AlertDelivered, AlertRaised, AlertResolved

    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for ev in events:
        k = (getattr(ev, "key", ""), getattr(ev, "occurrence", 1))
        if isinstance(ev, AlertRaised):
            rows.setdefault(k, {"key": ev.key, "kind": ev.kind, "subject": ev.subject, "severity": ev.severity,
                                "summary": ev.summary, "occurrence": ev.occurrence,
                                "raised_at": ev.raised_at.isoformat(), "resolved_at": None, "state": "firing",
                                "evidence": ev.evidence, "deliveries": []})
            while len(rows) > MAX_SHOWN:
                rows.pop(next(iter(rows)))
        elif isinstance(ev, AlertResolved) and k in rows:
            rows[k].update(state="resolved", resolved_at=ev.resolved_at.isoformat(), reason=ev.reason)
        elif isinstance(ev, AlertDelivered) and k in rows:
            rows[k]["deliveries"].append({"what": ev.what, "webhook": ev.webhook_id, "outcome": ev.outcome,
                                          "attempts": ev.attempts, "error": ev.error, "at": ev.at.isoformat()})
    return list(rows.values())


@app.command("list")
def list_command(
    all_: bool = typer.Option(False, "--all", "-a", help="Every alert, resolved ones too (oldest first)."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """The alerts firing now: idle clusters without autostop, jobs pending too long, managed jobs
    recovered too often, dead letters, orphaned nodes, unhealthy GPUs."""
    check_output(output)

    async def read() -> list[Any]:
        from skypurza.cli.control import connect_bus
        from skypurza.events import naming

        bus = await connect_bus(stage(), "alerts")
        try:
            subject = naming.aggregate_events_subject(bus.stage, "alert")
            return [st.event async for st in bus.replay(filter_subject=subject) if st.event is not None]
        finally:
            await bus.close()

    try:
        events = run_async(read())
    except Exception as exc:
        if type(exc).__name__ in ("NoRespondersError", "TimeoutError", "NoStreamResponseError"):
            raise fail("the event log is not answering; is the control plane up? (`spz api status`)")
        raise
    rows = history(events)
    if not all_:
        rows = [r for r in rows if r["state"] == "firing"]
    if output == "json":
        print_json(rows)
        return
    if not rows:
        typer.echo("No alerts." if all_ else "No alerts firing.")
        return
    from skypurza.cli.tables import print_table

    print_table(["SEVERITY", "KIND", "SUBJECT", "SINCE", "STATE", "SUMMARY"],
                [[r["severity"], r["kind"], r["subject"], r["raised_at"],
                  r["state"] if r["state"] == "firing" else f"resolved {r['resolved_at']}", r["summary"]]
                 for r in rows])


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="alerts")
