"""The config of an N-node NATS JetStream cluster: pure text from names and ports (nothing is
started here; events/natsserver.py starts one node, tests/support/nats_cluster.py a loopback
cluster, compose.yaml carries the compose cluster's text, `compose_file_config`, which includes
the deployment's `authorization {}` block: a compose bus is never open).

Every node gets the same shape: a `server_name` (JetStream's RAFT groups know a peer by it, so it
must be unique and survive restarts), the client `listen`, the monitoring `http` port (`/healthz`,
`/jsz`), a `jetstream {}` block with `sync_interval: always`, and a `cluster {}` block naming
every node's route. Why `sync_interval: always` on every node: by default JetStream acks a
replicated write before any node has fsynced it, and Jepsen's analysis of 2.12.1 lost
acknowledged writes that way after a coordinated power loss; at SkyPurza's event rates (hundreds
per second at most) the fsync costs little.

Other blocks (accounts and users, events/natsauth.py) sit beside these: `node_config(...,
extra_blocks=...)` appends them as given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

from . import naming

MIN_NODES = 3  # quorum is n/2+1: fewer than 3 nodes cannot lose one and keep writing
MAX_NODES = 9  # JetStream recommends 3 or 5; R5 is its largest replica count
COMPOSE_CLIENT_PORT = 4222
COMPOSE_HTTP_PORT = 8222
COMPOSE_ROUTE_PORT = 6222
COMPOSE_STORE_DIR = "/data"
# Where a compose node's config is mounted, and beside it the authorization block (a Compose
# secret from `spz api compose-secrets`): nats-server resolves an include against the including
# file's directory and takes no absolute path, so both must share this directory.
COMPOSE_CONFIG_DIR = "/etc/nats"
COMPOSE_CONFIG_FILE = f"{COMPOSE_CONFIG_DIR}/nats.conf"
# What a compose node's keeper (`spz api bus-node`, cli/busnode.py) renders the block from: the
# users' hashes (a Compose secret) and the volume the provisioner writes each cluster's agent user to.
COMPOSE_NODE_USERS_FILE = "/run/secrets/bus-node-users"
COMPOSE_AGENTS_DIR = "/var/lib/skypurza/bus-agents"


@dataclass(frozen=True)
class ClusterNode:
    """One node: where it binds, where clients and peers reach it, where it stores."""

    name: str          # server_name
    host: str          # how clients and the other nodes reach it (127.0.0.1, or a compose service)
    client_port: int
    http_port: int
    route_port: int
    store_dir: str
    bind: str = "127.0.0.1"  # what it listens on (0.0.0.0 inside a container)

    @property
    def client_url(self) -> str:
        return f"nats://{self.host}:{self.client_port}"

    @property
    def route_url(self) -> str:
        return f"nats-route://{self.host}:{self.route_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


def _check_count(count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or not MIN_NODES <= count <= MAX_NODES:
        raise ValueError(f"a JetStream cluster has {MIN_NODES} to {MAX_NODES} nodes, not {count!r}")
    return count


def _check_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"invalid port {port!r}")
    return port


def loopback_nodes(stage: str, ports: Sequence[tuple[int, int, int]], store_root: PurePath) -> tuple[ClusterNode, ...]:
    """Nodes on 127.0.0.1, one (client, http, route) port triple each, stores under `store_root`."""
    _check_count(len(ports))
    used = [p for triple in ports for p in triple]
    if len(set(used)) != len(used):
        raise ValueError(f"every port of a loopback cluster must differ: {sorted(used)}")
    return tuple(
        ClusterNode(name=naming.nats_server_name(stage, i), host="127.0.0.1", client_port=_check_port(c),
                    http_port=_check_port(h), route_port=_check_port(r), store_dir=str(store_root / f"n{i}"))
        for i, (c, h, r) in enumerate(ports, 1))


def compose_host(index: int) -> str:
    """The compose service of node `index` (1-based): also its host name on the compose network."""
    return f"nats-{index}"


def compose_nodes(stage: str, count: int = 3) -> tuple[ClusterNode, ...]:
    """Nodes as compose runs them: one container each, the same ports inside every container,
    a volume at /data, reached by service name."""
    _check_count(count)
    return tuple(
        ClusterNode(name=naming.nats_server_name(stage, i), host=compose_host(i), client_port=COMPOSE_CLIENT_PORT,
                    http_port=COMPOSE_HTTP_PORT, route_port=COMPOSE_ROUTE_PORT, store_dir=COMPOSE_STORE_DIR,
                    bind="0.0.0.0")
        for i in range(1, count + 1))


def client_urls(nodes: Sequence[ClusterNode]) -> str:
    """What a client is given (SKYPURZA_NATS_URL): every node, comma-separated."""
    return ",".join(n.client_url for n in nodes)


def _quoted(text: str) -> str:
    if any(c in text for c in '"\\\n'):
        raise ValueError(f"a NATS config value cannot hold quotes, backslashes or newlines: {text!r}")
    return f'"{text}"'


def jetstream_block(store_dir: str, *, sync_always: bool = True, max_mem: str | None = None,
                    max_file: str | None = None) -> str:
    lines = [f"  store_dir: {_quoted(store_dir)}"]
    if sync_always:
        lines.append("  sync_interval: always")
    if max_mem:
        lines.append(f"  max_mem: {max_mem}")
    if max_file:
        lines.append(f"  max_file: {max_file}")
    return "jetstream {\n" + "\n".join(lines) + "\n}\n"


def cluster_block(cluster_name: str, node: ClusterNode, nodes: Sequence[ClusterNode], *,
                  advertise: bool = True) -> str:
    """The `cluster {}` block: this node's route listener and every node's route (its own
    included: nats-server skips a route to itself, and every node's file then reads the same).
    `advertise` False keeps the nodes from telling clients about each other's addresses (in
    compose, container names a laptop cannot resolve)."""
    if node not in nodes:
        raise ValueError(f"node {node.name} is not one of the cluster's nodes")
    routes = ",\n".join(f"    {n.route_url}" for n in nodes)
    extra = "" if advertise else "  no_advertise: true\n"
    return (f"cluster {{\n  name: {_quoted(cluster_name)}\n  listen: {node.bind}:{node.route_port}\n{extra}"
            f"  routes: [\n{routes}\n  ]\n}}\n")


def node_config(node: ClusterNode, nodes: Sequence[ClusterNode], *, cluster_name: str, sync_always: bool = True,
                advertise: bool = True, max_mem: str | None = None, max_file: str | None = None,
                extra_blocks: Sequence[str] = ()) -> str:
    """The whole config file of one node."""
    _check_count(len(nodes))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"server names must be unique: {names}")
    head = (f"server_name: {_quoted(node.name)}\n"
            f"listen: {node.bind}:{node.client_port}\n"
            f"http: {node.bind}:{node.http_port}\n"
            "max_payload: 8MB\n")
    body = jetstream_block(node.store_dir, sync_always=sync_always, max_mem=max_mem, max_file=max_file)
    return head + body + cluster_block(cluster_name, node, nodes, advertise=advertise) + "".join(extra_blocks)


def compose_auth_include() -> str:
    """The line that puts the deployment's users into a compose node's config (no password in
    the config itself: the node's keeper writes the block beside a copy of it)."""
    return f"include {_quoted(naming.BUS_AUTH_FILE_NAME)}\n"


def compose_config(stage: str, index: int, count: int = 3) -> str:
    """Node `index`'s config in a compose deployment of `stage`: its users only, never anonymous."""
    nodes = compose_nodes(stage, count)
    return node_config(nodes[index - 1], nodes, cluster_name=naming.nats_cluster_name(stage), advertise=False,
                       extra_blocks=(compose_auth_include(),))


# compose.yaml's stage: Compose substitutes it when it reads the file, as it does for the services'
# own `SKYPURZA_STAGE` there (unset or empty: the default stage, as events/config.py falls back).
COMPOSE_STAGE = f"${{SKYPURZA_STAGE:-{naming.DEFAULT_STAGE}}}"
# A valid stage (naming checks it) that no other part of a node's config holds: the names are built
# by naming for it, then it is swapped for COMPOSE_STAGE, so no name is spelled out here.
_STAGE_PLACEHOLDER = "composestage"


def compose_file_config(index: int, count: int = 3) -> str:
    """Node `index`'s config as compose.yaml carries it (a test checks it is exactly this): the
    names of whatever stage the deployment runs, through COMPOSE_STAGE."""
    text = compose_config(_STAGE_PLACEHOLDER, index, count)
    # Compose interpolates `$` everywhere in the file, configs' `content` included: a literal `$`
    # must reach it as `$$` (none today; escaped before COMPOSE_STAGE goes in, which must not be).
    return text.replace("$", "$$").replace(_STAGE_PLACEHOLDER, COMPOSE_STAGE)
