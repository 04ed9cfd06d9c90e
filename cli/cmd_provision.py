"""`spz reconcile [--terminate-orphans] [-o json]`: compare the clouds with the event log now.

`refresh_command(terminate_orphans)` is also what `spz status --refresh` calls. It runs one
reconciliation pass in this process (same settings as the provisioner service: environment and
config file), so it works whether or not the services are up; every orphan it finds is recorded
in the log as an OrphanFound event.
"""

from __future__ import annotations

from typing import Any, Optional

import typer

from .context import check_output, fail, print_json, run_async, stage


def refresh_command(terminate_orphans: bool = False, infras: list[str] | None = None) -> dict[str, Any]:
    """One reconciliation pass for the current stage; returns the report as plain data:
    {"checked": {infra: [regions]}, "live_clusters": [...], "orphans": [{instance_id, cluster,
    region, zone, state, instance_type, launched_at, terminated}], "vanished": {cluster: [ids]},
    "ended": [clusters whose every node was gone: ClusterTerminated published], "cleanup_failed":
    [resources the sweep of `--terminate-orphans` could not release], "errors": {infra: message}}."""
    return run_async(_refresh(stage(), terminate_orphans, infras))


async def _refresh(stage_name: str, terminate: bool, infras: list[str] | None) -> dict[str, Any]:
    from skypurza.services.provisioner.backends import Backends
    from skypurza.services.provisioner.cleanup import RetryPolicy
    from skypurza.services.provisioner.reconcile import reconcile, refresh_infras
    from skypurza.services.provisioner.settings import ProvisionerSettings
    from skypurza.services.provisioner.state import live_clusters

    from .control import connect_bus

    bus = await connect_bus(stage_name, source="reconcile")
    settings = ProvisionerSettings.load()
    url = bus.nc.connected_url.geturl() if bus.nc.connected_url else ""
    backends = Backends(settings, stage=stage_name, nats_url=url)
    try:
        if infras is None:
            infras = refresh_infras(await live_clusters(bus), settings)
        policy = RetryPolicy(attempts=max(1, settings.cleanup_attempts), backoff_s=max(0.0, settings.cleanup_backoff_s))
        report = await reconcile(bus, backends, terminate=terminate, grace_s=settings.reconcile_grace_s,
                                 infras=infras, cleanup_policy=policy)
        return report.to_dict()
    finally:
        await backends.close()
        await bus.close()


def reconcile_cmd(
    terminate_orphans: bool = typer.Option(False, "--terminate-orphans",
                                           help="Terminate the orphans found (only nodes tagged with this stage)."),
    infra: Optional[list[str]] = typer.Option(None, "--infra", help="Only these infras (repeatable)."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Compare what the clouds hold for this stage with the live clusters in the event log."""
    check_output(output)
    try:
        report = refresh_command(terminate_orphans, infra or None)
    except Exception as exc:
        raise fail(f"reconciliation failed: {exc}")
    if output == "json":
        print_json(report)
    else:
        _print_table(report)
    if report["errors"]:
        raise typer.Exit(1)


def _print_table(report: dict[str, Any]) -> None:
    from .console import console as make_console
    from rich.table import Table

    console = make_console()
    checked = ", ".join(f"{i} ({', '.join(r) or 'all'})" for i, r in report["checked"].items()) or "nothing"
    console.print(f"Checked: {checked}; live clusters: {len(report['live_clusters'])}")
    if report["orphans"]:
        table = Table("INSTANCE", "CLUSTER TAG", "WHERE", "TYPE", "STATE", "LAUNCHED", "ACTION")
        for o in report["orphans"]:
            table.add_row(o["instance_id"], o["cluster"] or "-", o["zone"] or o["region"] or "-",
                          o["instance_type"] or "-", o["state"], o["launched_at"] or "-",
                          "terminated" if o["terminated"] else "reported")
        console.print(table)
    else:
        console.print("No orphans.")
    for cluster, ids in report["vanished"].items():
        console.print(f"[yellow]Cluster {cluster}: node(s) gone from the cloud: {', '.join(ids)}[/yellow]")
    for cluster in report.get("ended", []):
        console.print(f"[yellow]Cluster {cluster}: every node is gone; it is now TERMINATED (vanished).[/yellow]")
    for what in report.get("cleanup_failed", []):
        console.print(f"[yellow]Not released (retried in the background): {what}[/yellow]")
    for infra, error in report["errors"].items():
        console.print(f"[red]{infra}: {error}[/red]")


def register(app: typer.Typer) -> None:
    app.command("reconcile", hidden=True)(reconcile_cmd)
