"""`spz api start|stop|status|logs` and `spz serve`: the control plane."""

from __future__ import annotations

import time
from typing import Optional

import typer

from .context import check_output, fail, print_json, stage

api = typer.Typer(name="api", help="The embedded control plane (nats-server + services) on this machine.",
                  no_args_is_help=True)


@api.command("start")
def api_start(
    services: str = typer.Option("all", help="Comma-separated services to run (optimizer, provisioner, ledger, recovery) or 'all'."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Start nats-server (JetStream, 127.0.0.1) and the services in the background. A no-op when running."""
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
    """Stop the services, then nats-server. Clusters (and their agents) are not touched."""
    check_output(output)
    from .control import ControlPlane

    res = ControlPlane(stage()).stop()
    if output == "json":
        print_json(res)
    elif res["stopped"]:
        typer.echo("Stopped: " + ", ".join(f"{p['name']} (pid {p['pid']})" for p in res["stopped"]))
    else:
        typer.echo("Nothing was running.")


@api.command("status")
def api_status(output: str = typer.Option("table", "-o", "--output", help="table or json.")) -> None:
    """Say what runs where: the NATS URL, the processes, the state directory. Exit 1 when not running."""
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
    if not st["running"]:
        raise typer.Exit(1)


@api.command("logs")
def api_logs(
    follow: bool = typer.Option(False, "--follow/--no-follow", "-f", help="Keep printing new lines."),
    tail: int = typer.Option(100, "--tail", help="Lines to show from the end (0: all)."),
    process: str = typer.Option("services", "--process", help="services or nats-server."),
) -> None:
    """Print the control plane's logs."""
    from .control import ControlPlane

    cp = ControlPlane(stage())
    path = cp.logs_dir / ("nats-server.log" if process == "nats-server" else "services.log")
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
