"""The embedded control plane: a real nats-server and the services, started on first use.

`spz api start` (or any command that needs the bus) starts one process in its own session, the
stage's supervisor (`cli/supervisor.py`), which runs and restarts with back-off:
- `nats-server` with JetStream on 127.0.0.1, store under `~/.skypurza/<stage>/jetstream`,
  on a port chosen once and kept in `nats.port` (agents of local clusters reconnect to it
  after a restart);
- one `python -m skypurza.cli.serve` process running the services;
- the API server (`python -m skypurza.services.api`) on 127.0.0.1:46580 by default; its host,
  port and whether it is a deployment (`--deploy`: tokens only) are kept in
  `api-server.json` (`ApiSettings`), so a start on first use or a restart serves the same way.

Start, stop and restart hold an exclusive lock on `control.lock` in the stage's state directory
(`cli/planelock.py`): a second starter waits for the first and uses what it started, and before a
start every process of a previous control plane of the stage — recorded in `api.json` or not —
is stopped (`cli/planeprocs.py` finds them by their command lines), so one store directory is
never opened by two servers. With SKYPURZA_NATS_URL (or `nats_url` in the config file) nothing
is started: the CLI talks to that NATS.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skypurza.events import naming
from skypurza.events.config import load_config
from skypurza.events.natsserver import free_port, port_open
from skypurza.events.processes import pid_alive

from . import health, planelock, planeprocs


class ControlPlaneError(Exception):
    pass


# How long a starter waits for the lock (another start may be waiting for services to be ready).
LOCK_TIMEOUT_S = 90.0
READY_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 20.0
LOOPBACK_HOST = "127.0.0.1"


@dataclass(frozen=True)
class ApiSettings:
    """How the stage's API server listens: `spz api start --host/--port/--deploy`."""

    host: str = LOOPBACK_HOST
    port: int | None = None  # None: the recorded one, else 46580 (SKYPILOT_API_SERVER_LOCAL_PORT), else free
    deploy: bool = False
    # Where the deployment's bus listens and what remote agents are told (cli/busaddr.py).
    bus_host: str = LOOPBACK_HOST
    bus_advertise: str = ""

    def argv(self, port: int) -> list[str]:
        bus = ([] if self.bus_host == LOOPBACK_HOST else ["--bus-host", self.bus_host]) + (
            ["--bus-advertise", self.bus_advertise] if self.bus_advertise else [])
        return ["--api-host", self.host, "--api-port", str(port), *(["--deploy"] if self.deploy else []), *bus]


def choose_api_port(requested: int | None, env_port: str | None, recorded: int | None,
                    in_use: "Callable[[int], bool]", free: "Callable[[], int]") -> int:
    """The API server's port (pure but for the two probes): an explicit one must be free; else
    the environment's, the recorded one, sky's default, or any free port — never a taken one."""
    if requested is not None:
        if in_use(requested):
            raise ControlPlaneError(f"port {requested} is in use by another process; choose another --port")
        return requested
    for candidate in (int(env_port) if env_port and env_port.isdigit() else None, recorded, naming.DEFAULT_API_PORT):
        if candidate and 1 <= candidate <= 65535 and not in_use(candidate):
            return candidate
    return free()


@dataclass
class ControlPlane:
    stage: str

    @property
    def state_dir(self) -> Path:
        return naming.state_dir(self.stage)

    @property
    def state_file(self) -> Path:
        return naming.control_state_file(self.stage)

    @property
    def logs_dir(self) -> Path:
        return naming.control_logs_dir(self.stage)

    def read_state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def _supervisor_pid(self, state: dict[str, Any] | None) -> int | None:
        """The recorded supervisor's pid while that process lives and is this stage's supervisor
        (a recycled pid is not)."""
        pid = ((state or {}).get("supervisor") or {}).get("pid")
        if not pid_alive(pid):
            return None
        role = planeprocs.classify(planeprocs.read_argv(pid), str(self.state_dir), str(self._nats_conf()),
                                   self.stage, None)
        return pid if role == "supervisor" else None

    def _nats_conf(self) -> Path:
        return naming.nats_store_dir(self.stage) / "nats.conf"

    def status(self) -> dict[str, Any]:
        external = load_config().nats_url
        state = self.read_state() or {}
        sup = self._supervisor_pid(state)
        procs = []
        if state.get("supervisor"):
            procs.append({"name": "supervisor", "pid": state["supervisor"].get("pid"), "alive": sup is not None,
                          "log": state["supervisor"].get("log")})
        for proc_name, info in (state.get("processes") or {}).items():
            procs.append({"name": proc_name, "pid": info.get("pid"),
                          "alive": sup is not None and pid_alive(info.get("pid")),
                          "log": info.get("log"), "restarts": info.get("restarts", 0),
                          "last_exit": info.get("last_exit"), "ready": info.get("ready")})
        return {
            "stage": self.stage,
            "mode": "external" if external else "embedded",
            "nats_url": external or state.get("nats_url"),
            # Up while its supervisor lives: a child being restarted is the supervisor's business.
            "running": bool(external) or sup is not None,
            "state_dir": str(self.state_dir),
            "started_at": state.get("started_at"),
            "processes": procs,
            # The API server's URL as seen from this machine (its token is never here).
            "api_url": state.get("api_url") if sup is not None or external else None,
            "api_deploy": bool((((state.get("processes") or {}).get("api-server")) or {}).get("deploy")),
            # A deployment's bus takes its users only (cli/busauth.py); never a password here.
            "bus_secured": bool(state.get("bus_secured")) and sup is not None,
            # Each service of the services process as its supervisor sees it (cli/health.py).
            "services": health.services_status(naming.services_health_file(self.stage)),
        }

    def _port(self) -> int:
        """One port per stage, chosen once: clients and local agents find the server again after a
        restart. A new one only when a process that is not ours holds the recorded one."""
        port_file = naming.nats_port_file(self.stage)
        try:
            port = int(port_file.read_text().strip())
        except (OSError, ValueError):
            port = 0
        if port and not port_open(port):
            return port
        port = int(os.environ.get("SKYPURZA_NATS_PORT") or free_port())
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(port_file)
        return port

    def use_port(self, port: int) -> None:
        """`spz api start --port`: the stage's NATS port from now on (kept in its port file), unless
        a process that is not the stage's own holds it."""
        if not 1 <= port <= 65535:
            raise ControlPlaneError(f"--port must be from 1 to 65535, found {port}")
        port_file = naming.nats_port_file(self.stage)
        try:
            current = int(port_file.read_text().strip())
        except (OSError, ValueError):
            current = 0
        if current != port and port_open(port):
            raise ControlPlaneError(f"port {port} is in use by another process; choose another --port")
        port_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(port_file)

    def _api_settings(self, requested: ApiSettings | None) -> tuple[ApiSettings, int]:
        """What the API server runs with: `requested` (an explicit `spz api start`), else what the
        last explicit start recorded; with its port. Recorded for the next start."""
        path = naming.api_settings_file(self.stage)
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError):
            recorded = {}
        if requested is None:
            requested = ApiSettings(host=str(recorded.get("host") or LOOPBACK_HOST),
                                    deploy=bool(recorded.get("deploy")),
                                    bus_host=str(recorded.get("bus_host") or LOOPBACK_HOST),
                                    bus_advertise=str(recorded.get("bus_advertise") or ""))
        rec_port = recorded.get("port") if isinstance(recorded.get("port"), int) else None
        port = choose_api_port(requested.port, os.environ.get("SKYPURZA_API_PORT") or os.environ.get("SKYPILOT_API_SERVER_LOCAL_PORT"), rec_port,
                               port_open, free_port)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"host": requested.host, "port": port, "deploy": requested.deploy,
                                   "bus_host": requested.bus_host, "bus_advertise": requested.bus_advertise}))
        tmp.replace(path)
        return requested, port

    def foreground_argv(self, services: str = "all", api: ApiSettings | None = None) -> list[str]:
        """`spz api start --foreground`: the supervisor's command line, for the caller to exec in
        its own place (its log on stdout; systemd or Kubernetes then own the process). Nothing of an
        earlier, dead control plane survives; a live one is an error (one control plane per stage)."""
        try:
            with self._lock():
                state = self.read_state()
                if self._supervisor_pid(state) is not None:
                    raise ControlPlaneError(f"the control plane of stage {self.stage} is already running; "
                                            "spz api stop it first to run it in the foreground")
                self._kill_leftovers(state)
                self.state_dir.mkdir(parents=True, exist_ok=True)
                self.logs_dir.mkdir(parents=True, exist_ok=True)
                self.state_file.unlink(missing_ok=True)
                port = self._port()
                api_opts, api_port = self._api_settings(api)
        except planelock.LockTimeout as exc:
            raise ControlPlaneError(str(exc)) from None
        return [sys.executable, "-m", planeprocs.SUPERVISOR_MODULE, "--stage", self.stage, "--port", str(port),
                "--services", services, *api_opts.argv(api_port), planeprocs.CONTROL_PLANE_FLAG,
                str(self.state_dir)]

    def _lock(self):
        return planelock.exclusive(naming.control_lock_file(self.stage), LOCK_TIMEOUT_S,
                                   what=f"the control plane of stage {self.stage}")

    def start(self, services: str = "all", wait: bool = True, api: ApiSettings | None = None,
              wait_api: bool = False) -> dict[str, Any]:
        """Start the stage's supervisor (which runs nats-server, the services and the API server)
        unless one runs; `wait_api`: also until the API server answers /api/v1/health.

        Serialised by the stage's lock: concurrent starters wait for the first and use what it
        started. Nothing of a previous, dead control plane survives into the new one."""
        st = self.status()
        if st["mode"] == "external":
            return st
        if st["running"] and self._ready(self.read_state(), wait_api):
            return {**st, "already_running": True}
        try:
            with self._lock():
                state = self.read_state()
                sup = self._supervisor_pid(state)
                if sup is not None:
                    if wait:
                        self._wait_ready(sup, api=wait_api)
                    return {**self.status(), "already_running": True}
                self._kill_leftovers(state)
                self.state_dir.mkdir(parents=True, exist_ok=True)
                self.logs_dir.mkdir(parents=True, exist_ok=True)
                self.state_file.unlink(missing_ok=True)
                port = self._port()
                api_opts, api_port = self._api_settings(api)
                sup_log = self.logs_dir / "supervisor.log"
                with open(sup_log, "ab") as out:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", planeprocs.SUPERVISOR_MODULE, "--stage", self.stage,
                         "--port", str(port), "--services", services, *api_opts.argv(api_port),
                         planeprocs.CONTROL_PLANE_FLAG, str(self.state_dir)],
                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        # The caller's environment as it is: the supervisor flushes what it prints and
                        # sets PYTHONUNBUFFERED for its children itself; its CLI worker gets this
                        # one unchanged (cli/warmworker.py serves only clients it matches).
                        start_new_session=True, env=dict(os.environ),
                    )
                try:
                    self._wait_recorded(proc, sup_log)
                    if wait:
                        self._wait_ready(proc.pid, proc, api=wait_api)
                except ControlPlaneError:
                    # A start that failed leaves nothing behind (no supervisor restarting a
                    # services process that cannot start, for ever).
                    self._kill_leftovers(self.read_state())
                    self.state_file.unlink(missing_ok=True)
                    raise
        except planelock.LockTimeout as exc:
            raise ControlPlaneError(str(exc)) from None
        return {**self.status(), "already_running": False}

    @staticmethod
    def _ready(state: dict[str, Any] | None, api: bool = False) -> bool:
        procs = (state or {}).get("processes") or {}
        if api and "api-server" in procs and not (procs["api-server"] or {}).get("ever_ready"):
            return False
        return bool((procs.get("services") or {}).get("ever_ready"))

    def _wait_recorded(self, proc: subprocess.Popen, log_file: Path, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.read_state()
            if state and (state.get("supervisor") or {}).get("pid") == proc.pid:
                return
            if proc.poll() is not None:
                raise ControlPlaneError(f"the control plane's supervisor exited with {proc.returncode}:\n"
                                        + _tail(log_file))
            time.sleep(0.02)
        raise ControlPlaneError(f"the control plane's supervisor did not start within {timeout:.0f}s; see {log_file}")

    def _wait_ready(self, sup_pid: int, proc: subprocess.Popen | None = None, api: bool = False) -> None:
        """Until the services have said they are ready once (restarts are the supervisor's job), and
        with `api` the API server has answered /api/v1/health once."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            state = self.read_state()
            if self._ready(state, api):
                return
            procs = (state or {}).get("processes") or {}
            for name, log_name in (("services", "services.log"), ("api-server", "api-server.log")):
                if (procs.get(name) or {}).get("restarts", 0) >= 2 and not (procs.get(name) or {}).get("ready"):
                    raise ControlPlaneError(f"the {name} process keeps exiting before it is ready:\n"
                                            + _tail(self.logs_dir / log_name))
            if (proc is not None and proc.poll() is not None) or not pid_alive(sup_pid):
                raise ControlPlaneError("the control plane stopped while starting:\n"
                                        + _tail(self.logs_dir / "services.log"))
            time.sleep(0.03)
        raise ControlPlaneError(f"the services (or the API server) did not report ready within "
                                f"{READY_TIMEOUT_S:.0f}s; see spz api logs (--process services or api-server)")

    def _kill_leftovers(self, state: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Every process of this stage's control plane, recorded or not: supervisor first (it stops
        its children in order), then whatever is left; returns only when all are gone."""
        url = (state or {}).get("nats_url")
        found = planeprocs.find(self.state_dir, self._nats_conf(), self.stage, url)
        order = {"supervisor": 0, "api-server": 1, "services": 2, "nats-server": 3, "cli-worker": 4}
        stopped = []
        for p in sorted(found, key=lambda p: order[p.role]):
            _terminate(p.pid, STOP_TIMEOUT_S)
            stopped.append({"name": p.role, "pid": p.pid})
        # A process that raced past the scan (a child restarted at that moment) is caught here.
        for p in planeprocs.find(self.state_dir, self._nats_conf(), self.stage, url):
            if _terminate(p.pid, 5.0):
                stopped.append({"name": p.role, "pid": p.pid})
        return stopped

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> dict[str, Any]:
        """Stop every process of the stage's control plane and return when they are gone.
        Clusters (and their agents) are not touched."""
        try:
            with self._lock():
                stopped = self._kill_leftovers(self.read_state())
                self.state_file.unlink(missing_ok=True)
        except planelock.LockTimeout as exc:
            raise ControlPlaneError(str(exc)) from None
        return {"stage": self.stage, "stopped": stopped}

    def failing(self, service: str | None = None) -> str | None:
        """Why the control plane cannot serve requests although its supervisor lives, or None: the
        services process keeps exiting before it is ready, or (with `service`) that service is in a
        crash loop. A command waiting on it says so instead of waiting out its timeout."""
        state = self.read_state() or {}
        svc = (state.get("processes") or {}).get("services") or {}
        if self._supervisor_pid(state) is not None and svc.get("restarts", 0) >= 2 and not svc.get("ready"):
            return (f"the services process keeps exiting (restarted {svc['restarts']} times, last exit "
                    f"{svc.get('last_exit')}); see spz api logs:\n" + _tail(self.logs_dir / "services.log", 800))
        if service is not None:
            from .health import why_not_answering

            return why_not_answering(naming.services_health_file(self.stage), service)
        return None

    def restart(self, services: str = "all") -> dict[str, Any]:
        self.stop()
        return self.start(services=services)

    def ensure_url(self) -> str:
        """The NATS URL to talk to, starting the embedded control plane if needed."""
        external = load_config().nats_url
        if external:
            return external
        state = self.read_state()
        if state and state.get("nats_url") and self._supervisor_pid(state) is not None:
            return state["nats_url"]
        st = self.start()
        return st["nats_url"]


def _terminate(pid: int, timeout: float) -> bool:
    """SIGTERM, then SIGKILL after `timeout`; True when the process was alive."""
    if not pid_alive(pid):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.02)
    if pid_alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        kill_deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < kill_deadline:
            _reap(pid)
            time.sleep(0.02)
    _reap(pid)
    return True


def _tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def _reap(pid: int | None) -> None:
    if not pid:
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def operator_credentials(stage: str):
    """The bus user of the CLI on a deployment's own host, or None (the embedded bus, an external
    one, or SKYPURZA_NATS_CREDS naming one). A secured bus takes its users only; the CLI on the
    server host is the deployment's operator — whoever reads the state directory holds every
    credential anyway — so it connects as `control`. Laptops hold none: they use the API server."""
    from skypurza.events.natscreds import CREDS_ENV, CredentialsError, credentials_file, read_credentials

    if os.environ.get(CREDS_ENV) or load_config().nats_url or not ControlPlane(stage).status().get("bus_secured"):
        return None
    try:
        return read_credentials(credentials_file(naming.bus_credentials_dir(stage), naming.BUS_CONTROL_USER))
    except CredentialsError as exc:
        raise ControlPlaneError(f"stage {stage} is a team deployment (spz api start --deploy) whose bus takes its own "
                                f"users only, and {exc}; use its API server: spz api login -e URL --token TOKEN") from None


async def connect_bus(stage: str, source: str = "cli"):
    """A connected Bus for the CLI (the control plane is started on first use)."""
    from skypurza.events.bus import Bus

    from .lostplane import PING_INTERVAL_S, bounded_connect, watch

    url = await asyncio.to_thread(ControlPlane(stage).ensure_url)
    creds = await asyncio.to_thread(operator_credentials, stage)
    # Bounded, then watched: a command never waits for ever on a control plane that is not
    # there or is gone (cli/lostplane.py).
    bus = watch(await bounded_connect(Bus.connect(url, stage, source=f"/skypurza/{stage}/{source}",
                                                  ping_interval=PING_INTERVAL_S, credentials=creds), url))
    # What the CLI publishes is checked against its declared contract, as a service's is (by
    # name, cli/cliemits.py: the contract's classes are most of the event models).
    from .cliemits import CliDeclared

    return bus.watched(CliDeclared())
