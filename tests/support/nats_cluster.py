"""A real 3-node NATS JetStream cluster on loopback for tests: free ports, each node's own store,
waits on `/healthz` and on the JetStream meta leader (no fixed sleeps), a node killed (SIGKILL)
and started again on the same ports and store, teardown by pid."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats_fixtures import kill_processes_using

from skypurza.events import naming
from skypurza.events.natscluster import ClusterNode, client_urls, cluster_block, loopback_nodes
from skypurza.events.natsserver import NatsServer, free_port


def _distinct_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


@dataclass
class NatsCluster:
    stage: str
    root: Path
    nodes: tuple[ClusterNode, ...]
    servers: list[NatsServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Every node, comma-separated (what SKYPURZA_NATS_URL holds)."""
        return client_urls(self.nodes)

    def _server(self, i: int) -> NatsServer:
        node = self.nodes[i]
        return NatsServer(store_dir=Path(node.store_dir), port=node.client_port, log_file=self.root / f"{node.name}.log",
                          server_name=node.name, http_port=node.http_port,
                          cluster_block=cluster_block(naming.nats_cluster_name(self.stage), node, self.nodes),
                          max_mem="64MB", max_file="8GB")

    def start(self, timeout: float = 30.0) -> "NatsCluster":
        self.servers = [self._server(i).start() for i in range(len(self.nodes))]
        for i in range(len(self.nodes)):
            self.wait_healthy(i, timeout)
        self.wait_meta_leader(timeout)
        return self

    def monitor(self, i: int, path: str, timeout: float = 2.0) -> Any:
        with urllib.request.urlopen(f"{self.nodes[i].monitor_url}{path}", timeout=timeout) as resp:
            return json.loads(resp.read() or b"null")

    def wait_healthy(self, i: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.monitor(i, "/healthz").get("status") == "ok":
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.nodes[i].name} not healthy within {timeout}s: {self.log(i)[-2000:]}")
            time.sleep(0.05)

    def wait_meta_leader(self, timeout: float = 30.0) -> str:
        """Until every live node names the same JetStream meta leader (before that a replicated
        stream cannot be placed: err 10005)."""
        deadline = time.monotonic() + timeout
        while True:
            leaders = set()
            for i, server in enumerate(self.servers):
                if server.process is None or server.process.poll() is not None:
                    continue
                try:
                    leaders.add((self.monitor(i, "/jsz").get("meta_cluster") or {}).get("leader") or "")
                except (OSError, urllib.error.URLError, ValueError):
                    leaders.add("")
            if len(leaders) == 1 and "" not in leaders:
                return leaders.pop()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no JetStream meta leader within {timeout}s: {leaders}")
            time.sleep(0.1)

    def index_of(self, server_name: str) -> int:
        return next(i for i, n in enumerate(self.nodes) if n.name == server_name)

    def stream_state(self, i: int, stream: str) -> dict[str, Any] | None:
        """The stream as node `i` holds it (its own replica), from `/jsz?streams=true`."""
        data = self.monitor(i, "/jsz?accounts=true&streams=true")
        for account in data.get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                if detail.get("name") == stream:
                    return detail
        return None

    def kill(self, i: int) -> None:
        """SIGKILL (a crash: no shutdown, no flush)."""
        self.servers[i].kill()

    def restart(self, i: int, timeout: float = 30.0) -> None:
        self.servers[i] = self._server(i).start()
        self.wait_healthy(i, timeout)

    def log(self, i: int) -> str:
        path = self.root / f"{self.nodes[i].name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for server in self.servers:
            server.stop()  # by its own pid (SIGTERM, then SIGKILL)
        for node in self.nodes:
            kill_processes_using(node.client_url)


def make_cluster(root: Path, stage: str = "test") -> NatsCluster:
    ports = _distinct_ports(9)
    triples = [tuple(ports[i * 3:i * 3 + 3]) for i in range(3)]
    return NatsCluster(stage, root, loopback_nodes(stage, triples, root / "js"))  # type: ignore[arg-type]


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    cluster = make_cluster(tmp_path / "cluster")
    cluster.root.mkdir(parents=True, exist_ok=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
