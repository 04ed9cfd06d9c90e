"""`spz api start|stop|restart|status|logs|serve`: the control plane."""

from __future__ import annotations

import time
from typing import Optional

import typer

from .bounds import TAIL_LINES, BoundedInt
from .context import check_output, fail, print_json, stage

api = typer.Typer(name="api", help="The embedded control plane (nats-server + services) on this machine.",
                  no_args_is_help=True)


TCP_PORT = BoundedInt(1, 65535, "a TCP port")
_LOOPBACK = ("localhost", "127.0.0.1")


def _check_bind(host: str | None, deploy: bool, basic_auth: bool) -> None:
    """sky's --host/--deploy/--enable-basic-auth: spz's control plane has no authentication yet,
    so it listens on this machine's loopback only; anything else is refused, saying why."""
    why = ("spz's control plane has no authentication yet, so it listens on 127.0.0.1 only; for a team, run "
           "compose.yaml and point SKYPURZA_NATS_URL at it (docs/DESIGN.md)")
    if deploy:
        raise fail(f"--deploy is not supported: {why}", 2)
    if basic_auth:
        raise fail(f"--enable-basic-auth is not supported yet: {why}", 2)
    if host is None or host in _LOOPBACK:
        return
    if host == "::1":
        from .options import unused

        unused("--host ::1", "the control plane listens on the IPv4 loopback, 127.0.0.1")
        return
    if host in ("0.0.0.0", "::"):
        raise fail(f"--host {host} is not supported: {why}", 2)
    raise typer.BadParameter(f"{host!r} is not one of 0.0.0.0, localhost, 127.0.0.1, ::, ::1", param_hint="--host")


@api.command("start")
def api_start(
    services: str = typer.Option("all", help="Comma-separated services to run (optimizer, provisioner, status, recovery; platform ones such as ledger) or 'all'."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
    host: Optional[str] = typer.Option(None, "--host", metavar="[localhost|127.0.0.1|::1|0.0.0.0|::]",
                                       help="Where the control plane listens: this machine only (127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", parser=TCP_PORT,
                                       help="The NATS port of this stage, kept for its next starts too."),
    foreground: bool = typer.Option(False, "--foreground", help="Run the supervisor in this process, its log on "
                                    "stdout (for systemd or Kubernetes); Ctrl-C or SIGTERM stops it."),
    deploy: bool = typer.Option(False, "--deploy", help="Not supported: the control plane listens on 127.0.0.1 "
                                                        "only (a team runs compose.yaml)."),
    enable_basic_auth: bool = typer.Option(False, "--enable-basic-auth", help="Not supported yet."),
) -> None:
    """Start the control plane in the background: a supervisor that runs nats-server (JetStream,
    127.0.0.1) and the services and restarts them with back-off. A no-op when running; concurrent
    starts wait for the first (a lock in the stage's state directory) and use what it started."""
    check_output(output)
    from .control import ControlPlane, ControlPlaneError

    _check_bind(host, deploy, enable_basic_auth)
    plane = ControlPlane(stage())
    try:
        if port is not None:
            current = plane.status()
            if current["running"] and current.get("nats_url") and not str(current["nats_url"]).endswith(f":{port}"):
                raise fail(f"the control plane already runs at {current['nats_url']}; spz api stop, then start it "
                           f"with --port {port}")
            plane.use_port(port)
        if foreground:
            import os

            argv = plane.foreground_argv(services=services)
            typer.echo(f"Running the control plane of stage {stage()} in the foreground (port {argv[argv.index('--port') + 1]}); "
                       f"the services' logs: {plane.logs_dir}", err=True)
            os.execv(argv[0], argv)  # the supervisor takes this process's place
        st = plane.start(services=services)
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
    services: str = typer.Option("all", help="Comma-separated services to run (optimizer, provisioner, status, recovery; platform ones such as ledger) or 'all'."),
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
def api_status(
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
    all_status: bool = typer.Option(False, "-a", "--all-status", help="sky's finished requests (spz has no "
                                                                      "request queue)."),
    limit: Optional[str] = typer.Option(None, "-l", "--limit", help="sky's request count (spz has no request queue)."),
    cluster: Optional[str] = typer.Option(None, "-c", "--cluster", help="sky's requests of a cluster (spz: see "
                                                                        "spz events tail)."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Also each process's command line."),
) -> None:
    """Say what runs where: the NATS URL, the processes, the state directory, and each service's
    health (running, restarting, or failing with its last error). Exit 1 when not running."""
    check_output(output)
    if all_status or limit is not None or cluster is not None:
        from .options import unused

        unused("-a/-l/-c", "spz has no API request queue: each command is its own request, and what it asked for "
                           "is in the event log (spz events tail)")
    from .control import ControlPlane

    st = ControlPlane(stage()).status()
    if output == "json":
        print_json(st)
        if not st["running"]:
            raise typer.Exit(1)
        return
    from .console import console as make_console
    from rich.table import Table

    c = make_console()
    c.print(f"stage [bold]{st['stage']}[/bold] ({st['mode']}): "
            f"{'[green]running[/green]' if st['running'] else '[yellow]not running[/yellow]'}")
    c.print(f"NATS: {st['nats_url'] or '-'}    state: {st['state_dir']}")
    if st["processes"]:
        t = Table("process", "pid", "alive", "log")
        for p in st["processes"]:
            t.add_row(p["name"], str(p["pid"]), "yes" if p["alive"] else "no", p.get("log") or "")
        c.print(t)
        if verbose:
            for p in st["processes"]:
                c.print(f"{p['name']}: {_cmdline(p['pid'])}", soft_wrap=True)
    if st.get("services"):
        _services_table(c, st["services"])
    if not st["running"]:
        raise typer.Exit(1)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip() or "-"
    except OSError:
        return "-"


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
    server_logs: bool = typer.Option(False, "--server-logs", help="The server's log: the services' (the default)."),
    log_path: Optional[str] = typer.Option(None, "-l", "--log-path", help="Print this log file instead."),
) -> None:
    """Print the control plane's logs."""
    from pathlib import Path

    from .control import ControlPlane

    cp = ControlPlane(stage())
    if process not in ("services", "nats-server", "supervisor"):
        raise fail(f"--process {process!r}: expected services, nats-server or supervisor", 2)
    if server_logs and process != "services":
        raise fail("--server-logs is the services' log: leave out --process", 2)
    path = Path(log_path).expanduser() if log_path else cp.logs_dir / f"{process}.log"
    if log_path and not path.is_file():
        raise fail(f"-l/--log-path {log_path}: no such file")
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
    services: str = typer.Option("all", help="Comma-separated: optimizer, provisioner, status, recovery, platform ones (ledger), or all."),
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


SKYSERVE_HELP = (
    "SkyServe (`sky serve up|status|down|logs|update`) is not supported by spz yet: a task's `service:` "
    "section is checked (spz check-yaml) but not served. To run the control plane's services in the foreground "
    "(what `spz serve` did before), use spz api serve.")


def skyserve_command(ctx: typer.Context) -> None:
    """SkyServe is not supported yet (this is sky's `serve`); `spz api serve` runs the services."""
    raise fail(SKYSERVE_HELP)


def register(app: typer.Typer) -> None:
    api.command("serve")(serve_command)
    app.add_typer(api, name="api")
    # `sky serve ...` typed as `spz serve ...` gets a plain answer, never "unexpected extra argument".
    app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                help="SkyServe is not supported yet (`spz api serve` runs the control plane's services).")(
        skyserve_command)
