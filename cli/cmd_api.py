"""`spz api start|stop|restart|status|logs|serve|compose-secrets`: the control plane, and a compose
deployment's bus secrets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from .bounds import TAIL_LINES, BoundedInt
from .context import check_output, fail, print_json, stage

api = typer.Typer(name="api", help="The API server and the embedded control plane (nats-server, services) "
                                   "on this machine; log in to a team's server.",
                  no_args_is_help=True)


TCP_PORT = BoundedInt(1, 65535, "a TCP port")
_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::")
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


def console_url(api_url: str | None) -> str | None:
    """Where the web console of the API server at `api_url` is (pure; docs/console.md)."""
    return f"{api_url.rstrip('/')}/console/" if api_url else None


def bind_host(host: str | None, deploy: bool, basic_auth: bool) -> str:
    """Where the API server listens (pure): loopback by default; another address only with
    --deploy, which turns auth on (tokens only) and, as sky's, listens on 0.0.0.0 unless told."""
    if basic_auth:
        raise fail("--enable-basic-auth is not supported: a deployment takes tokens "
                   "(spz api start --deploy; docs/team.md)", 2)
    if host is not None and host not in _HOSTS:
        raise typer.BadParameter(f"{host!r} is not one of {', '.join(_HOSTS)}", param_hint="--host")
    if host is None:
        return "0.0.0.0" if deploy else "127.0.0.1"
    if host not in _LOOPBACK and not deploy:
        raise fail(f"--host {host} needs --deploy: without it the API server has no authentication (a caller on "
                   "this machine is the OS user), so it listens on this machine only", 2)
    return "127.0.0.1" if host == "localhost" else host


@api.command("start")
def api_start(
    services: str = typer.Option("all", help="Comma-separated services to run (optimizer, provisioner, status, recovery; platform ones such as ledger) or 'all'."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
    host: Optional[str] = typer.Option(None, "--host", metavar="[0.0.0.0|localhost|127.0.0.1|::|::1]",
                                       help="Where the API server listens (default 127.0.0.1; with --deploy "
                                            "0.0.0.0). Another than loopback needs --deploy."),
    port: Optional[int] = typer.Option(None, "--port", parser=TCP_PORT,
                                       help="The API server's port (default: SKYPILOT_API_SERVER_LOCAL_PORT, the "
                                            "stage's last one, or 46580), kept for the stage's next starts."),
    nats_port: Optional[int] = typer.Option(None, "--nats-port", "--bus-port", parser=TCP_PORT,
                                            help="The stage's NATS port, kept for its next starts."),
    bus_host: str = typer.Option("127.0.0.1", "--bus-host", help="Where the bus (nats-server) listens: loopback "
                                 "unless told; another host (0.0.0.0, an interface's address) needs --deploy."),
    bus_advertise: Optional[str] = typer.Option(None, "--bus-advertise", metavar="HOST:PORT",
                                                help="With --deploy: the bus address remote node agents (EC2, "
                                                     "Kubernetes) are given, which they can reach (default: where "
                                                     "the provisioner connects)."),
    foreground: bool = typer.Option(False, "--foreground", help="Run the supervisor in this process, its log on "
                                    "stdout (for systemd or Kubernetes); Ctrl-C or SIGTERM stops it."),
    deploy: bool = typer.Option(False, "--deploy", help="A team deployment: the API server takes tokens only and "
                                "listens on 0.0.0.0 (or --host); the bus takes the deployment's own users only "
                                "(credentials 0600 under the state dir); the first start makes the admin and prints its "
                                "token once (also in <state dir>/admin-token, mode 0600)."),
    enable_basic_auth: bool = typer.Option(False, "--enable-basic-auth", help="Not supported: a deployment "
                                                                              "takes tokens (--deploy)."),
) -> None:
    """Start the control plane in the background: a supervisor that runs nats-server (JetStream,
    127.0.0.1), the services and the API server, and restarts them with back-off; returns when the
    API server answers GET /api/v1/health. A no-op when running; concurrent starts wait for the
    first (a lock in the stage's state directory) and use what it started."""
    check_output(output)
    from .control import ApiSettings, ControlPlane, ControlPlaneError

    from .busaddr import BusAddressError, check_bus_host, parse_advertise

    try:
        bus_bind = check_bus_host(bus_host, deploy)
        if bus_advertise is not None and not deploy:
            raise BusAddressError("--bus-advertise needs --deploy: only a deployment's bus hands remote agents "
                                  "credentials")
        advertised = parse_advertise(bus_advertise) if bus_advertise else ""
    except BusAddressError as exc:
        raise fail(str(exc), 2)
    api_settings = ApiSettings(host=bind_host(host, deploy, enable_basic_auth), port=port, deploy=deploy,
                               bus_host=bus_bind, bus_advertise=advertised)
    plane = ControlPlane(stage())
    try:
        current = plane.status()
        if current["running"] and current["mode"] == "embedded":
            _check_same(current, api_settings, nats_port)
        if nats_port is not None:
            plane.use_port(nats_port)
        if foreground:
            import os

            argv = plane.foreground_argv(services=services, api=api_settings)
            typer.echo(f"Running the control plane of stage {stage()} in the foreground (NATS port "
                       f"{argv[argv.index('--port') + 1]}, API server port {argv[argv.index('--api-port') + 1]}); "
                       f"the services' logs: {plane.logs_dir}", err=True)
            if deploy:
                typer.echo("Make the first admin once it answers: spz api start --deploy (again, from another "
                           "shell) prints its token.", err=True)
            os.execv(argv[0], argv)  # the supervisor takes this process's place
        st = plane.start(services=services, api=api_settings, wait_api=True)
        admin = _first_admin(plane) if deploy and st.get("mode") == "embedded" else None
    except typer.Exit:  # already said (click's Exit is a RuntimeError)
        raise
    except (ControlPlaneError, FileNotFoundError, RuntimeError, TimeoutError) as exc:
        raise fail(str(exc))
    st["console_url"] = console_url(st.get("api_url"))
    if output == "json":
        print_json({**st, **({"admin": admin} if admin else {})})
        return
    if st.get("mode") == "external":
        typer.echo(f"Using the NATS at {st['nats_url']} (SKYPURZA_NATS_URL / config); nothing to start.")
        return
    verb = "already running" if st.get("already_running") else "started"
    typer.echo(f"Control plane {verb} for stage {st['stage']}: API server {st.get('api_url') or '-'}"
               f"{' (deploy: tokens only)' if st.get('api_deploy') else ''}, NATS {st['nats_url']}"
               f"{' (secured: users only)' if st.get('bus_secured') else ''} (state in {st['state_dir']}).")
    if st.get("console_url"):
        typer.echo(f"Web console: {st['console_url']}")
    if admin and admin.get("token"):
        typer.echo(f"The admin's token, shown this once (also in {admin['token_file']}, mode 0600):", err=True)
        typer.echo(admin["token"])
    elif admin:
        typer.echo(admin["note"], err=True)


def _check_same(current: dict, wanted, nats_port: int | None) -> None:
    """A running control plane is used as it is; asking for another host, port or mode is an error."""
    if nats_port is not None and current.get("nats_url") and not str(current["nats_url"]).endswith(f":{nats_port}"):
        raise fail(f"the control plane already runs at {current['nats_url']}; spz api stop, then start it "
                   f"with --nats-port {nats_port}")
    url = current.get("api_url") or ""
    if wanted.port is not None and url and not url.endswith(f":{wanted.port}"):
        raise fail(f"the API server already runs at {url}; spz api stop, then start it with --port {wanted.port}")
    # A plain start uses what runs (a deployment included); asking for a deployment is not a no-op.
    if url and wanted.deploy and not current.get("api_deploy"):
        raise fail("the control plane already runs without --deploy (no authentication); spz api stop, then "
                   "spz api start --deploy")


def _first_admin(plane) -> dict:
    """A deployment's first admin (user `admin` of team `admin`), made once through the identity
    events; its token goes to <state dir>/admin-token (0600) and is returned to be printed once."""
    from skypurza.events import naming

    from .apiclient import write_private
    from .context import run_async

    token_file = naming.admin_token_file(plane.stage)

    async def make() -> dict:
        from skypurza.services.api.directory_io import IdentityError, add_team, add_user, load_directory

        from .control import connect_bus

        bus = await connect_bus(plane.stage, "api")  # on a secured bus: the control user (operator_credentials)
        try:
            directory = await load_directory(bus)
            if "admin" in directory.users:
                return {"user": "admin", "token_file": str(token_file), "created": False}
            if "admin" not in directory.teams:
                try:
                    await add_team(bus, "admin", [], {})
                except IdentityError:
                    pass  # another start made it at this moment
            try:
                issued = await add_user(bus, "admin", "admin", "admin")
            except IdentityError:  # another start made the admin at this moment: its token is its own
                return {"user": "admin", "token_file": str(token_file), "created": False}
            write_private(token_file, issued.token + "\n")
            return {"user": "admin", "token_file": str(token_file), "created": True, "token": issued.token}
        finally:
            await bus.close()

    admin = run_async(make())
    if not admin["created"]:
        admin["note"] = (f"The admin exists; its first token is in {token_file}" if token_file.exists() else
                         "The admin exists and its token file is gone; a new token: spz users token admin")
    return admin


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
    st["metrics_url"] = _metrics_url(st) if st["running"] else None
    st["console_url"] = console_url(st.get("api_url")) if st["running"] else None
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
    c.print(f"API server: {st.get('api_url') or '-'}{' (deploy: tokens only)' if st.get('api_deploy') else ''}    "
            f"NATS: {st['nats_url'] or '-'}{' (secured: users only)' if st.get('bus_secured') else ''}    "
            f"state: {st['state_dir']}")
    if st.get("console_url"):
        c.print(f"web console: {st['console_url']}")
    if st.get("metrics_url"):
        c.print(f"metrics: {st['metrics_url']}")
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


def _metrics_url(st: dict) -> str | None:
    """Where the observability service (platform, when installed) serves /metrics: the URL it recorded."""
    import json

    from skypurza.events import naming

    try:
        return str(json.loads(naming.metrics_endpoint_file(st["stage"]).read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
    process: str = typer.Option("services", "--process", help="services, api-server, nats-server or supervisor."),
    server_logs: bool = typer.Option(False, "--server-logs", help="The server's log: the services' (the default)."),
    log_path: Optional[str] = typer.Option(None, "-l", "--log-path", help="Print this log file instead."),
) -> None:
    """Print the control plane's logs."""
    from pathlib import Path

    from .control import ControlPlane

    cp = ControlPlane(stage())
    if process not in ("services", "api-server", "nats-server", "supervisor"):
        raise fail(f"--process {process!r}: expected services, api-server, nats-server or supervisor", 2)
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
        import os

        with open(path, "rb") as f:
            f.seek(0, 2)
            while True:
                line = f.readline()
                if line:
                    typer.echo(line.decode(errors="replace").rstrip("\n"))
                    continue
                if os.fstat(f.fileno()).st_size < f.tell():  # cut by the supervisor (cli/logrotate.py)
                    f.seek(0)
                    continue
                time.sleep(0.2)


@api.command("compose-secrets")
def api_compose_secrets(
    directory: Optional[Path] = typer.Argument(None, metavar="DIR", show_default=False,
                                               help="Where to write them: next to compose.yaml, which reads "
                                                    "${SKYPURZA_BUS_SECRETS:-./bus-secrets} (default: ./bus-secrets)."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Draw the bus credentials of a compose deployment (compose.yaml) into DIR, once before `docker compose up`.

    One 0600 file per bus user under DIR/bus-users/ (compose hands each container its own only), every user's bcrypt hash, from which each NATS node writes its own authorization block (DIR/nats-node-users.json: no node holds a usable password), and the stage they are for (DIR/stage).

    The stage is spz's (--stage, SKYPURZA_STAGE), the variable compose reads: the nodes and compose's set-up container refuse to start a deployment of another stage.

    Safe to run again (also two at once): passwords already there are kept, the hashes are drawn anew.
    """
    check_output(output)
    import os

    from skypurza.events import naming

    from .busauth import COMPOSE_CONTAINER_UID, ComposeSecretsError, compose_secrets

    root = (directory or Path(naming.COMPOSE_SECRETS_DIR)).expanduser().absolute()
    st = stage()
    try:
        files = compose_secrets(root, st)
    except (ComposeSecretsError, ValueError) as exc:
        raise fail(str(exc))
    # Compose mounts a secret from a file as it is on the host (owner and 0600 kept): the
    # containers' user must own the files, or it cannot read its own. Root-owned files included:
    # the containers do not run as root.
    readable = os.getuid() == COMPOSE_CONTAINER_UID
    if output == "json":
        print_json({"stage": st, "directory": str(root), "node_users_file": str(naming.compose_node_users_file(root)),
                    "stage_file": str(naming.compose_stage_file(root)), "users": {u: str(f) for u, f in files.items()},
                    "container_uid": COMPOSE_CONTAINER_UID, "readable_by_containers": readable})
    else:
        # compose.yaml finds ./bus-secrets by itself (run from its directory); another one by the variable.
        where = "" if root.resolve() == Path(naming.COMPOSE_SECRETS_DIR).resolve() else f"SKYPURZA_BUS_SECRETS={root} "
        typer.echo(f"Bus secrets of stage {st} in {root} ({len(files)} users, passwords kept where they were); "
                   f"start the deployment with: SKYPURZA_STAGE={st} {where}docker compose up -d")
    if not readable:
        typer.echo(f"note: the SkyPurza containers run as uid {COMPOSE_CONTAINER_UID} and read these 0600 files as "
                   f"they are on this host: sudo chown -R {COMPOSE_CONTAINER_UID} {root}", err=True)


@api.command("bus-node", hidden=True)
def api_bus_node(
    config: Path = typer.Option(..., "--nats-config", help="The node's nats-server config (it includes "
                                                           "nats-auth.conf, which this writes beside a copy)."),
    users: Path = typer.Option(..., "--users", help="DIR/nats-node-users.json of spz api compose-secrets."),
    agents: Path = typer.Option(..., "--agents", help="The directory the provisioner writes each remote "
                                                      "cluster's agent user to (SKYPURZA_BUS_AGENTS_DIR)."),
) -> None:
    """Run one compose NATS node: nats-server, its authorization block written from the users'
    hashes and the per-cluster agent users, and reloaded when those change (cli/busnode.py).
    Refuses a stage the users were not drawn for (exit 2)."""
    import sys

    from .busnode import NodeUsersError, main

    try:
        code = main(config, users, agents, stage())
    except (NodeUsersError, ValueError) as exc:
        raise fail(str(exc), 2)
    except OSError as exc:  # no nats-server binary, a work directory it cannot write
        raise fail(f"cannot run the NATS node: {exc}")
    sys.exit(code)


@api.command("compose-setup", hidden=True)
def api_compose_setup(
    nats_url: str = typer.Option(..., "--nats-url", envvar="SKYPURZA_NATS_URL", help="Every NATS node."),
    stage_file: Path = typer.Option(..., "--stage-file", help="The stage the bus secrets were drawn for "
                                                               "(DIR/stage of spz api compose-secrets)."),
) -> None:
    """Make a compose deployment's streams and buckets as the `control` user (SKYPURZA_NATS_CREDS),
    which no service's user may: compose.yaml's one-shot set-up container, before any service.
    Refuses a stage the bus secrets were not drawn for (exit 2)."""
    from skypurza.events.bus import CANNOT_CONNECT, StreamPlacementError
    from skypurza.events.settings import SettingsError

    from .busauth import ComposeSecretsError, compose_set_up, read_control_credentials

    st = stage()
    try:
        compose_set_up(nats_url, st, stage_file, read_control_credentials())
    except ComposeSecretsError as exc:
        raise fail(str(exc), 2)
    except CANNOT_CONNECT as exc:  # control's password refused: secrets drawn after the nodes started
        raise fail(f"cannot set up the bus: {exc}", 2)
    except (SettingsError, StreamPlacementError, OSError, TimeoutError) as exc:
        raise fail(f"cannot set up the bus at {nats_url}: {exc}")
    typer.echo(f"The bus of stage {st} is set up (streams, secrets bucket, uploads store).")


def serve_command(
    services: str = typer.Option("all", help="Comma-separated: optimizer, provisioner, status, recovery, platform ones (ledger), or all."),
    nats_url: Optional[str] = typer.Option(None, "--nats-url", envvar="SKYPURZA_NATS_URL",
                                           help="NATS to connect to (default: the embedded one)."),
) -> None:
    """Run a subset of the services in this process, in the foreground (how a container runs one)."""
    import asyncio
    import logging
    import signal

    from .serve import parse_services, serve, tune_gc

    tune_gc()
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
    from .cmd_apilogin import register_login

    api.command("serve")(serve_command)
    register_login(api)
    app.add_typer(api, name="api")
    # `sky serve ...` typed as `spz serve ...` gets a plain answer, never "unexpected extra argument".
    app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                help="SkyServe is not supported yet (`spz api serve` runs the control plane's services).")(
        skyserve_command)
