"""The embedded control plane: a real nats-server and the services, started on first use.

`spz api start` (or any command that needs the bus) starts, in the background and in their own
sessions so they outlive the CLI:
- `nats-server` with JetStream on 127.0.0.1, store under `~/.skypurza/<stage>/jetstream`,
  on a port chosen once and kept in the state file (agents of local clusters reconnect to it
  after a restart);
- one `python -m skypurza.cli.serve` process running the services.
`~/.skypurza/<stage>/api.json` records what runs where. With SKYPURZA_NATS_URL (or `nats_url`
in the config file) nothing is started: the CLI talks to that NATS.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from skypurza.events import naming
from skypurza.events.config import load_config
from skypurza.events.natsserver import NatsServer, free_port, port_open
from skypurza.events.processes import pid_alive


class ControlPlaneError(Exception):
    pass


@dataclass
class ControlPlane:
    stage: str

    @property
    def state_dir(self) -> Path:
        return naming.state_dir(self.stage)

    @property
    def state_file(self) -> Path:
        return self.state_dir / "api.json"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def read_state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def status(self) -> dict[str, Any]:
        external = load_config().nats_url
        state = self.read_state() or {}
        procs = []
        for proc_name, info in (state.get("processes") or {}).items():
            procs.append({"name": proc_name, "pid": info.get("pid"), "alive": pid_alive(info.get("pid")),
                          "log": info.get("log")})
        running = bool(procs) and all(p["alive"] for p in procs)
        return {
            "stage": self.stage,
            "mode": "external" if external else "embedded",
            "nats_url": external or state.get("nats_url"),
            "running": bool(external) or running,
            "state_dir": str(self.state_dir),
            "started_at": state.get("started_at"),
            "processes": procs,
        }

    def _port(self) -> int:
        """Keep one port per stage: clients and local agents find the server again after a restart."""
        port_file = self.state_dir / "nats.port"
        if port_file.exists():
            port = int(port_file.read_text().strip())
            if not port_open(port):
                return port
        port = int(os.environ.get("SKYPURZA_NATS_PORT") or free_port())
        port_file.write_text(str(port))
        return port

    def start(self, services: str = "all", wait: bool = True) -> dict[str, Any]:
        """Start nats-server and the services unless they already run (a second start is a no-op)."""
        st = self.status()
        if st["mode"] == "external":
            return st
        if st["running"]:
            return {**st, "already_running": True}
        self.stop()  # clean up a half-dead previous start
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        port = self._port()
        server = NatsServer(store_dir=naming.nats_store_dir(self.stage), port=port,
                            log_file=self.logs_dir / "nats-server.log")
        server.start(detach=True)
        url = server.url
        svc_log = self.logs_dir / "services.log"
        with open(svc_log, "ab") as out:
            svc = subprocess.Popen(
                [sys.executable, "-m", "skypurza.cli.serve", "--nats", url, "--stage", self.stage,
                 "--services", services],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        state = {
            "nats_url": url,
            "port": port,
            "started_at": datetime.now(timezone.utc).isoformat(),
            "processes": {
                "nats-server": {"pid": server.process.pid if server.process else None,
                                "log": str(self.logs_dir / "nats-server.log")},
                "services": {"pid": svc.pid, "log": str(svc_log), "services": services},
            },
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)
        if wait:
            self._wait_services_ready(svc, svc_log)
        return {**self.status(), "already_running": False}

    def _wait_services_ready(self, proc: subprocess.Popen, log_file: Path, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
                raise ControlPlaneError(f"the services process exited with {proc.returncode}:\n{tail}")
            text = log_file.read_text(errors="replace") if log_file.exists() else ""
            if "services ready" in text:
                return
            time.sleep(0.05)
        raise ControlPlaneError(f"the services did not report ready within {timeout:.0f}s; see {log_file}")

    def stop(self, timeout: float = 15.0) -> dict[str, Any]:
        state = self.read_state() or {}
        procs = state.get("processes") or {}
        stopped = []
        # Services first (they flush and ack), then the server.
        for proc_name in ("services", "nats-server"):
            pid = (procs.get(proc_name) or {}).get("pid")
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + timeout
                while pid_alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
                    while pid_alive(pid):
                        time.sleep(0.05)
                stopped.append({"name": proc_name, "pid": pid})
            _reap(pid)
        if self.state_file.exists():
            self.state_file.unlink()
        return {"stage": self.stage, "stopped": stopped}

    def ensure_url(self) -> str:
        """The NATS URL to talk to, starting the embedded control plane if needed."""
        external = load_config().nats_url
        if external:
            return external
        st = self.start()
        return st["nats_url"]


def _reap(pid: int | None) -> None:
    if not pid:
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


async def connect_bus(stage: str, source: str = "cli"):
    """A connected Bus for the CLI (the control plane is started on first use)."""
    from skypurza.events.bus import Bus

    url = await asyncio.to_thread(ControlPlane(stage).ensure_url)
    return await Bus.connect(url, stage, source=f"/skypurza/{stage}/{source}")
