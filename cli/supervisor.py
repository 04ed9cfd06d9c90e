"""The one supervisor of a stage's embedded control plane (`python -m skypurza.cli.supervisor`).

`spz api start` (holding the stage's lock) starts this process and nothing else; it runs
nats-server, the services process and the API server (services/api) as its children and restarts
each with back-off when it dies — on the same port and the same store, so clients and local agents reconnect. CLI calls
never restart anything themselves while a supervisor lives: that is what made two servers open
one store.

Children get PR_SET_PDEATHSIG: a supervisor that is SIGKILLed takes its children with it, and
the next `spz` call (under the lock) starts a fresh control plane instead of finding orphans.

`api.json` (naming.control_state_file) is rewritten atomically on every change: the URL, each
process's pid, restarts and last exit, and whether the services have reported ready since their
last start (the API server: whether it has answered `GET /api/v1/health` since its last start).

A deployment (`--deploy`) secures the bus (cli/busauth.py): nats-server's config includes the
generated `authorization {}` block (no anonymous client), the `control` user makes the streams
and buckets before any service starts, and each child connects as its own user: the services
by `--nats-creds-dir` (one user per service), the API server and, through the provisioner's
environment, local node agents by SKYPURZA_NATS_CREDS. Passwords stay in their 0600 files.
Remote clusters' agents each get a user of their own, minted by the provisioner
(events/agentusers.py): the supervisor notices a change of that set, writes the block again (its
one writer) and reloads nats-server with SIGHUP. `--bus-host` is where nats-server listens
(loopback by default), `--bus-advertise` the address remote agents are given.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from skypurza.events import naming
from skypurza.events.natsserver import NatsServer, nats_server_binary, port_open

from .planeprocs import CONTROL_PLANE_FLAG, WORKER_MODULE

READY_MARK = b"services ready"
POLL_S = 0.1
STOP_GRACE_S = 15.0
# After this long without dying, a child's back-off starts again from its first step.
STABLE_S = 60.0
HEALTH_PROBE_S = 0.5
AGENT_USERS_POLL_S = 0.25  # how soon a cluster's new agent user is live (and changes coalesced)
SETUP_TIMEOUT_S = 20.0


def api_ready(url: str, timeout: float = HEALTH_PROBE_S) -> bool:
    """Whether an spz API server answers `GET {url}/api/v1/health`."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/api/v1/health", timeout=timeout) as resp:
            return resp.status == 200 and b'"version"' in resp.read(4096)
    except (OSError, ValueError):
        return False


def api_url(host: str, port: int) -> str:
    """The URL a client on this machine uses (a wildcard bind is reached on loopback)."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "127.0.0.1", "localhost": "127.0.0.1"}.get(host, host)
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def restart_delay(failures_in_a_row: int, first: float, cap: float) -> float:
    """Back-off before restart number `failures_in_a_row` (1-based): first, 2×first, … ≤ cap."""
    return min(cap, first * (2 ** max(0, failures_in_a_row - 1)))


def cli_worker_wanted(env: dict[str, str] | os._Environ) -> bool:
    """A plane started with SKYPURZA_CLI_WORKER=0 runs no CLI worker (every command cold)."""
    return str(env.get("SKYPURZA_CLI_WORKER", "")).strip().lower() not in ("0", "false", "no", "off")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    first_delay: float
    max_delay: float
    proc: subprocess.Popen | None = None
    started_mono: float = 0.0
    started_at: str | None = None
    restarts: int = 0
    failures_in_a_row: int = 0
    last_exit: int | None = None
    restart_at: float | None = None
    log_offset: int = 0
    ready: bool = False
    ever_ready: bool = False
    extra: dict = field(default_factory=dict)
    own_env: dict[str, str] = field(default_factory=dict)  # on top of the supervisor's (its bus user)
    # The supervisor's own environment, unchanged (the CLI worker: "the environment the CLI has").
    callers_env: bool = False

    def spawn(self, env: dict[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        if self.callers_env:
            env = dict(os.environ)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**env, **self.own_env},
                                         preexec_fn=_die_with_parent)
        self.started_mono = time.monotonic()
        self.started_at = _now()
        self.ready = False
        self.restart_at = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def record(self) -> dict:
        return {"pid": self.proc.pid if self.alive() else None, "log": str(self.log),
                "started_at": self.started_at, "restarts": self.restarts, "last_exit": self.last_exit,
                "ready": self.ready, "ever_ready": self.ever_ready, **self.extra}


class Supervisor:
    def __init__(self, stage: str, port: int, services: str, api_host: str = "127.0.0.1", api_port: int = 0,
                 deploy: bool = False, bus_host: str = "127.0.0.1", bus_advertise: str = "") -> None:
        from .busaddr import check_bus_host, local_host, parse_advertise

        self.stage = stage
        self.port = port
        self.bus_host = check_bus_host(bus_host, deploy)
        self.local_host = local_host(self.bus_host)
        self.url = f"nats://[{self.local_host}]:{port}" if ":" in self.local_host else f"nats://{self.local_host}:{port}"
        # The address remote agents are given (the provisioner's SKYPURZA_AGENT_NATS_URL).
        self.bus_advertise = parse_advertise(bus_advertise) if bus_advertise else ""
        self.state_dir = naming.state_dir(stage)
        self.state_file = naming.control_state_file(stage)
        logs = naming.control_logs_dir(stage)
        store = naming.nats_store_dir(stage)
        store.mkdir(parents=True, exist_ok=True)
        conf = store / "nats.conf"
        # A deployment's bus: the authorization block is included by a path relative to the
        # config (nats-server takes no absolute include), so no password is in nats.conf.
        self.secured = deploy
        auth_blocks: tuple[str, ...] = ()
        if deploy:
            from . import busauth

            auth = busauth.prepare(stage)
            auth_blocks = (f"include {json.dumps(os.path.relpath(auth, conf.parent))}\n",)
        conf.write_text(NatsServer(store_dir=store, port=port, extra_blocks=auth_blocks, host=self.bus_host).config_text())
        self.nats = Child("nats-server", [nats_server_binary(), "-c", str(conf)], logs / "nats-server.log",
                          first_delay=0.2, max_delay=5.0)
        self.services = Child(
            "services",
            [sys.executable, "-m", "skypurza.cli.serve", "--nats", self.url, "--stage", stage,
             "--services", services, *self._creds_dir_args(), CONTROL_PLANE_FLAG, str(self.state_dir)],
            logs / "services.log", first_delay=1.0, max_delay=30.0, extra={"services": services},
            # The only bus the services process opens without a user of its own is a local node
            # agent's (it inherits this environment through the provisioner): the agent user.
            own_env={**self._creds_env("agent"), **self._agent_users_env()})
        # The API server (none with api_port 0): tokens only in a deployment; on the embedded
        # default a loopback caller without a token is the OS user (services/api/__main__.py).
        self.api: Child | None = None
        if api_port:
            self.api_url = api_url(api_host, api_port)
            self.api = Child(
                "api-server",
                [sys.executable, "-m", "skypurza.services.api", "--nats", self.url, "--stage", stage,
                 "--host", api_host, "--port", str(api_port), "--log-level", "warning",
                 *([] if deploy else ["--embedded"]), CONTROL_PLANE_FLAG, str(self.state_dir)],
                logs / "api-server.log", first_delay=1.0, max_delay=30.0,
                extra={"url": self.api_url, "host": api_host, "port": api_port, "deploy": deploy},
                own_env=self._creds_env("api"))
        # The warm CLI worker (cli/warmworker.py): `spz` commands forked from a pre-imported process.
        # Started with the environment `spz api start` had; it serves only clients it matches.
        self.worker = Child(
            "cli-worker", [sys.executable, "-m", WORKER_MODULE, "--stage", stage, CONTROL_PLANE_FLAG, str(self.state_dir)],
            logs / "cli-worker.log", first_delay=0.2, max_delay=5.0, callers_env=True)
        self._next_probe = 0.0
        self._next_agents_look = 0.0
        self._agents_seen: tuple = ()
        if deploy:
            from skypurza.events.agentusers import fingerprint

            self._agents_seen = fingerprint(naming.bus_agent_users_dir(stage))  # in the block prepared above
        from .logrotate import max_bytes

        self.log_limit = max_bytes()  # each child's log file (cli/logrotate.py)
        self._next_log_look = 0.0
        self.stopping = False
        self.started_at = _now()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def _agent_users_env(self) -> dict[str, str]:
        """A deployment's provisioner mints each remote cluster's own agent user
        (events/agentusers.py) and hands remote agents the advertised bus address."""
        if not self.secured:
            return {}
        from skypurza.events.agentusers import AGENT_USERS_ENV, PER_CLUSTER

        return {AGENT_USERS_ENV: PER_CLUSTER, **({"SKYPURZA_AGENT_NATS_URL": self.bus_advertise}
                                                 if self.bus_advertise else {})}

    def _reload_agent_users(self) -> bool:
        """When the provisioner added or removed a cluster's agent user: the authorization block
        written again (this process is its one writer) and nats-server reloaded (SIGHUP), once
        for however many changed since the last look. True when it reloaded."""
        from skypurza.events.agentusers import fingerprint

        now = time.monotonic()
        if not self.secured or now < self._next_agents_look:
            return False
        self._next_agents_look = now + AGENT_USERS_POLL_S
        seen = fingerprint(naming.bus_agent_users_dir(self.stage))
        if seen == self._agents_seen:
            return False
        from skypurza.events.natscreds import CredentialsError

        from . import busauth

        try:
            busauth.prepare(self.stage)
        except (OSError, CredentialsError, ValueError) as exc:  # the old block stays; tried again next look
            print(f"cannot write the bus's authorization block: {exc}", flush=True)
            return False
        self._agents_seen = seen
        if self.nats.alive():
            self.nats.proc.send_signal(signal.SIGHUP)  # a restarted nats-server reads the new block anyway
        print(f"bus users reloaded: {len(seen)} cluster agent user(s)", flush=True)
        return True

    def _bound_logs(self) -> None:
        """Each child's log cut when it passes the limit (the older half kept as `<log>.1`)."""
        from .logrotate import CHECK_EVERY_S, rotate_if_large

        now = time.monotonic()
        if now < self._next_log_look:
            return
        self._next_log_look = now + CHECK_EVERY_S
        for child in (self.nats, self.services, self.api, self.worker):
            if child is not None and rotate_if_large(child.log, self.log_limit):
                child.log_offset = 0  # where its readiness line is looked for: the file starts again
                print(f"{child.name}'s log passed {self.log_limit >> 20} MiB: the older part is {child.log}.1",
                      flush=True)

    def _creds_dir_args(self) -> list[str]:
        return ["--nats-creds-dir", str(naming.bus_credentials_dir(self.stage))] if self.secured else []

    def _creds_env(self, user: str) -> dict[str, str]:
        if not self.secured:
            return {}
        from . import busauth

        return busauth.env_for(self.stage, user)

    def _set_up_bus(self) -> bool:
        """As the control user: the streams and buckets no service's user may create."""
        import asyncio

        from . import busauth

        try:
            asyncio.run(asyncio.wait_for(busauth.set_up(self.url, self.stage), SETUP_TIMEOUT_S))
        except Exception as exc:  # one line in the supervisor's log; the start fails with it
            print(f"cannot set up the deployment's bus at {self.url}: {type(exc).__name__}: {exc}", flush=True)
            return False
        return True

    # ------------------------------------------------------------------ state file
    def write_state(self) -> None:
        state = {
            "nats_url": self.url, "port": self.port, "started_at": self.started_at,
            "bus_secured": self.secured, "bus_host": self.bus_host,
            **({"bus_advertise": self.bus_advertise} if self.bus_advertise else {}),
            "supervisor": {"pid": os.getpid(), "log": str(naming.control_logs_dir(self.stage) / "supervisor.log")},
            "processes": {"nats-server": self.nats.record(), "services": self.services.record(),
                          **({"api-server": self.api.record()} if self.api else {}),
                          **({"cli-worker": self.worker.record()} if self.worker.proc is not None else {})},
            **({"api_url": self.api_url} if self.api else {}),
        }
        tmp = self.state_file.with_name(self.state_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    # ------------------------------------------------------------------ loop
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if port_open(self.port, self.local_host):
            print(f"port {self.port} is already in use: refusing to start a second nats-server", flush=True)
            return 3
        self.nats.spawn(self.env)
        if not self._wait_listening(10.0):
            print(f"nats-server did not listen on {self.port}; see {self.nats.log}", flush=True)
            self._stop_child(self.nats)
            return 3
        if self.secured and not self._set_up_bus():
            self._stop_child(self.nats)
            return 3
        self.services.spawn(self.env)
        if self.api:
            self.api.spawn(self.env)
        if cli_worker_wanted(os.environ):
            self.worker.spawn(self.env)
        self.write_state()
        print(f"supervising nats-server (pid {self.nats.proc.pid}) and services (pid {self.services.proc.pid}) "
              f"at {self.url}", flush=True)
        while not self.stopping:
            changed = self._tend(self.nats) | self._tend(self.services) | (self._tend(self.api) if self.api else False)
            if self.worker.proc is not None:
                changed |= self._tend(self.worker)
                if not self.worker.ready and self.worker.alive() and naming.cli_worker_socket(self.stage).exists():
                    self.worker.ready = self.worker.ever_ready = True  # it listens (it binds once imported)
                    changed = True
            if not self.services.ready and self.services.alive() and self._reported_ready(self.services):
                self.services.ready = self.services.ever_ready = True
                changed = True
            if self.api and not self.api.ready and self.api.alive() and time.monotonic() >= self._next_probe:
                self._next_probe = time.monotonic() + HEALTH_PROBE_S
                if api_ready(self.api_url):
                    self.api.ready = self.api.ever_ready = True
                    changed = True
            self._reload_agent_users()
            self._bound_logs()
            if changed:
                self.write_state()
            time.sleep(POLL_S)
        self._stop_child(self.worker)
        if self.api:
            self._stop_child(self.api)
        self._stop_child(self.services)
        self._stop_child(self.nats)
        self.write_state()
        print("stopped", flush=True)
        return 0

    def _tend(self, child: Child) -> bool:
        """Notice a dead child and restart it when its back-off is over; True when state changed."""
        if child.alive():
            if child.failures_in_a_row and time.monotonic() - child.started_mono > STABLE_S:
                child.failures_in_a_row = 0
            return False
        now = time.monotonic()
        if child.restart_at is None:
            child.last_exit = child.proc.returncode if child.proc else None
            if child is self.worker and child.last_exit == 0:
                child.failures_in_a_row = 0  # the CLI worker left for changed code: back at once
            child.failures_in_a_row += 1
            delay = restart_delay(child.failures_in_a_row, child.first_delay, child.max_delay)
            child.restart_at = now + delay
            print(f"{child.name} exited with {child.last_exit}; restarting in {delay:.1f}s", flush=True)
            return True
        if now < child.restart_at:
            return False
        if child is self.nats and port_open(self.port, self.local_host):
            child.restart_at = now + 0.5  # the old socket is still closing; never bind twice
            return False
        child.restarts += 1
        child.spawn(self.env)
        print(f"{child.name} restarted (pid {child.proc.pid}, restart {child.restarts})", flush=True)
        return True

    def _reported_ready(self, child: Child) -> bool:
        try:
            with open(child.log, "rb") as f:
                f.seek(child.log_offset)
                return READY_MARK in f.read()
        except OSError:
            return False

    def _wait_listening(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.nats.alive():
                return False
            if port_open(self.port, self.local_host):
                return True
            time.sleep(0.02)
        return False

    def _stop_child(self, child: Child) -> None:
        if not child.alive():
            return
        child.proc.terminate()
        try:
            child.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait(10)
        child.last_exit = child.proc.returncode

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self.stopping = True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skypurza.cli.supervisor", description=__doc__)
    p.add_argument("--stage", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--services", default="all")
    p.add_argument("--api-host", default="127.0.0.1")
    p.add_argument("--api-port", type=int, default=0, help="The API server's port (0: no API server).")
    p.add_argument("--deploy", action="store_true", help="The API server takes tokens only (a team deployment).")
    p.add_argument("--bus-host", default="127.0.0.1", help="Where nats-server listens (off loopback: --deploy only).")
    p.add_argument("--bus-advertise", default="", help="HOST:PORT remote node agents reach the bus at.")
    p.add_argument(CONTROL_PLANE_FLAG, dest="control_plane", required=True,
                   help="the stage's state directory (how `spz api stop` recognises this process)")
    args = p.parse_args(argv)
    from skypurza.events.config import ConfigError
    from skypurza.events.natscreds import CredentialsError

    try:
        supervisor = Supervisor(args.stage, args.port, args.services, args.api_host, args.api_port, args.deploy,
                                bus_host=args.bus_host, bus_advertise=args.bus_advertise)
    except (OSError, CredentialsError, ValueError, ConfigError) as exc:  # BusAddressError is a ValueError  # the deployment's credentials cannot be written
        print(f"cannot prepare the control plane of stage {args.stage}: {exc}", flush=True)
        return 3
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
