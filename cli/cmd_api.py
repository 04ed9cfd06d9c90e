"""`spz api start|stop|status|logs` and `spz serve`: the control plane."""

from __future__ import annotations

import time
from typing import Optional

import typer

from .bounds import TAIL_LINES
from .context import check_output, fail, print_json, stage

api = typer.Typer(name="api", help="The embedded control plane (nats-server + services) on this machine.",
                  no_args_is_help=True)


@api.command("start")
def api_start(
    services: str = typer.Option("all", help="Comma-separated services to run (optimizer, provisioner, ledger, recovery) or 'all'."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Start the control plane in the background: a supervisor that runs nats-server (JetStream,
    127.0.0.1) and the services and restarts them with back-off. A no-op when running; concurrent
    starts wait for the first (a lock in the stage's state directory) and use what it started."""
    check_output(output)
    from .control import ControlPlane, ControlPlaneError

    try:
        st = ControlPlane(stage()).start(services=services)
    except (ControlPlaneError, FileNotFoundError, RuntimeError, TimeoutError) as exc:
        raise fail(str(exc))
    if output == "json":
        print_json(st)
        return
    if st.get("mode") == "external":
        typer.echo(f"Using the NATS at {st['nats_url']} (SKYPURZA_NATS_URL / config); nothing to start.")
    elif st.get("already_running"):
        typer.echo(f"Control plane already running for stage {st['stage']} at {st['nats_url']}.")
    else:
        typer.echo(f"Control plane started for stage {st['stage']} at {st['nats_url']} (state in {st['state_dir']}).")


@api.command("stop")
def api_stop(output: str = typer.Option("table", "-o", "--output", help="table or json.")) -> None:
    """Stop every process of the stage's control plane (supervisor, services, nats-server; recorded
    or not) and return when they are gone. Clusters (and their agents) are not touched."""
    check_output(output)
    from .control import ControlPlane, ControlPlaneError

    try:
        res = ControlPlane(stage()).stop()
    except ControlPlaneError as exc:
        raise fail(str(exc))
    if output == "json":
        print_json(res)
    elif res["stopped"]:
        typer.echo("Stopped: " + ", ".join(f"{p['name']} (pid {p['pid']})" for p in res["stopped"]))
    else:
        typer.echo("Nothing was running.")


@api.command("restart")
def api_restart(
    services: str = typer.Option("all", help="Comma-separated services to run (optimizer, provisioner, ledger, recovery) or 'all'."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Stop every process of the stage's control plane, then start it again (same port, same store)."""
    check_output(output)
    from .control import ControlPlane, ControlPlaneError

    try:
        st = ControlPlane(stage()).restart(services=services)
    except (ControlPlaneError, FileNotFoundError, RuntimeError, TimeoutError) as exc:
        raise fail(str(exc))
    if output == "json":
        print_json(st)
    else:
        typer.echo(f"Control plane restarted for stage {st['stage']} at {st['nats_url']}.")


@api.command("status")
def api_status(output: str = typer.Option("table", "-o", "--output", help="table or json.")) -> None:
    """Say what runs where: the NATS URL, the processes, the state directory, and each service's
    health (running, restarting, or failing with its last error). Exit 1 when not running."""
    check_output(output)
    from .control import ControlPlane

    st = ControlPlane(stage()).status()
    if output == "json":
        print_json(st)
        if not st["running"]:
            raise typer.Exit(1)
        return
    from rich.console import Console
    from rich.table import Table

    c = Console(highlight=False)
    c.print(f"stage [bold]{st['stage']}[/bold] ({st['mode']}): "
            f"{'[green]running[/green]' if st['running'] else '[yellow]not running[/yellow]'}")
    c.print(f"NATS: {st['nats_url'] or '-'}    state: {st['state_dir']}")
    if st["processes"]:
        t = Table("process", "pid", "alive", "log")
        for p in st["processes"]:
            t.add_row(p["name"], str(p["pid"]), "yes" if p["alive"] else "no", p.get("log") or "")
        c.print(t)
    if st.get("services"):
        _services_table(c, st["services"])
    if not st["running"]:
        raise typer.Exit(1)


_STATE_STYLE = {"running": "green", "restarting": "yellow", "failing": "bold red", "down": "red"}


def _services_table(c, services: list) -> None:
    """Each service's health as the services process's supervisor recorded it (cli/health.py)."""
    from rich.markup import escape
    from rich.table import Table

    t = Table("service", "state", "restarts", "since (UTC)", "last error")
    for s in services:
        style = _STATE_STYLE.get(s["state"], "")
        state = f"[{style}]{s['state']}[/{style}]" if style else s["state"]
        since = (s.get("since") or "")[:19].replace("T", " ")  # UTC, to the second
        t.add_row(s["name"], state, str(s["restarts"]), since, escape(s.get("last_error") or ""))
    c.print(t)
    for s in services:  # in full, not wrapped into a narrow cell
        if s["state"] != "running" and s.get("last_error"):
            c.print(f"{s['name']} is {s['state']}: {escape(s['last_error'])}", soft_wrap=True)


@api.command("logs")
def api_logs(
    follow: bool = typer.Option(False, "--follow/--no-follow", "-f", help="Keep printing new lines."),
    tail: int = typer.Option(100, "--tail", parser=TAIL_LINES, help="Lines to show from the end (0: all)."),
    process: str = typer.Option("services", "--process", help="services, nats-server or supervisor."),
) -> None:
    """Print the control plane's logs."""
    from .control import ControlPlane

    cp = ControlPlane(stage())
    if process not in ("services", "nats-server", "supervisor"):
        raise fail(f"--process {process!r}: expected services, nats-server or supervisor", 2)
    path = cp.logs_dir / f"{process}.log"
    if not path.exists():
        raise fail(f"no log at {path}: has the control plane been started (spz api start)?")
    lines = path.read_text(errors="replace").splitlines()
    for line in (lines[-tail:] if tail else lines):
        typer.echo(line)
    if follow:
        with open(path, errors="replace") as f:
            f.seek(0, 2)
            while True:
                line = f.readline()
                if line:
                    typer.echo(line.rstrip("\n"))
                else:
                    time.sleep(0.2)


def serve_command(
    services: str = typer.Option("all", help="Comma-separated: optimizer, provisioner, ledger, recovery, or all."),
    nats_url: Optional[str] = typer.Option(None, "--nats-url", envvar="SKYPURZA_NATS_URL",
                                           help="NATS to connect to (default: the embedded one)."),
) -> None:
    """Run a subset of the services in this process, in the foreground (how a container runs one)."""
    import asyncio
    import logging
    import signal

    from .serve import parse_services, serve

    try:
        names = parse_services(services)
    except ValueError as exc:
        raise fail(str(exc), 2)
    st = stage()
    url = nats_url or _embedded_nats_only(st)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(url, st, names, stop, explicit=services != "all")

    asyncio.run(run())


def _embedded_nats_only(st: str) -> str:
    from .control import ControlPlane

    cp = ControlPlane(st)
    state = cp.read_state()
    if state and state.get("nats_url"):
        return state["nats_url"]
    raise fail("no NATS to connect to: pass --nats-url (or SKYPURZA_NATS_URL), or run `spz api start` first")


def register(app: typer.Typer) -> None:
    app.add_typer(api, name="api")
    app.command("serve")(serve_command)
