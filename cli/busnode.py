"""A compose deployment's NATS node: nats-server under a keeper that writes the node's
`authorization {}` block and reloads it when a remote cluster's agent user comes or goes
(docs/team.md, *A compose deployment's bus*).

On `spz api start --deploy` the supervisor is the block's one writer (cli/supervisor.py). In
compose each node is a container of its own, so each node keeps its own block, from two inputs:

- the deployment's users (`deployment_users`, pure, from the stage) with each one's **bcrypt
  hash** (`naming.compose_node_users_file`, written by `spz api compose-secrets`): a node holds no
  usable password of anyone's;
- the per-cluster agent users the provisioner mints (events/agentusers.py), one file per cluster
  in a volume the provisioner writes and every node reads (`--agents`).

The keeper renders the block, starts nats-server on a copy of the node's config beside it, looks
at the agents' directory every `POLL_S` (its fingerprint: names, mtimes, sizes), and on a change
writes the block again and sends nats-server SIGHUP (a reload: the removed user's connections are
closed, a new user's password is taken). SIGTERM and SIGINT go to nats-server; the keeper exits
with nats-server's status, and Compose restarts the container.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skypurza.events import naming
from skypurza.events.agentusers import AgentUser, fingerprint, list_users
from skypurza.events.natsauth import deployment_users
from skypurza.events.natscreds import write_private

from .busauth import NODE_USERS_FORMAT, block_with_agents, deployment_contracts

POLL_S = 0.25  # how soon a cluster's new agent user is live on this node (changes coalesced)
_MAX_USERS_FILE_BYTES = 1 << 20


class NodeUsersError(Exception):
    """The node users file cannot be used (one line: which file, what is wrong, what to run)."""


@dataclass(frozen=True)
class NodeUsers:
    stage: str
    hashes: Mapping[str, str]  # user -> bcrypt hash


def read_node_users(path: Path) -> NodeUsers:
    again = "run `spz api compose-secrets` again"
    try:
        if path.stat().st_size > _MAX_USERS_FILE_BYTES:
            raise NodeUsersError(f"{path} is not a node users file (over {_MAX_USERS_FILE_BYTES} bytes)")
        data = json.loads(path.read_text(encoding="utf-8"))
    except PermissionError as exc:  # drawn as another user: Compose mounts the file with its host owner
        raise NodeUsersError(f"cannot read {path}: {exc.strerror or exc} (the nodes run as uid {os.getuid()}: "
                             f"`sudo chown -R {os.getuid()}` the bus secrets' directory on the host)") from None
    except OSError as exc:
        raise NodeUsersError(f"cannot read {path}: {exc.strerror or exc} ({again})") from None
    except ValueError as exc:
        raise NodeUsersError(f"{path} is not JSON: {exc} ({again})") from None
    if not isinstance(data, dict) or data.get("format") != NODE_USERS_FORMAT:  # busauth.node_users_text's
        raise NodeUsersError(f"{path} is not a node users file of format {NODE_USERS_FORMAT} ({again})")
    hashes = data.get("password_hashes")
    if not isinstance(hashes, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v.startswith("$2") for k, v in hashes.items()):
        raise NodeUsersError(f"{path}: password_hashes must map each user to a bcrypt hash ({again})")
    try:
        stage = naming.check_stage(str(data.get("stage", "")))
    except ValueError as exc:
        raise NodeUsersError(f"{path}: {exc} ({again})") from None
    return NodeUsers(stage, hashes)


def node_block(users: NodeUsers, agents: Mapping[str, AgentUser]) -> str:
    """The node's authorization block (pure): every deployment user with its hash, and each
    cluster's agent user the provisioner minted. A deployment user without a hash (secrets drawn
    by an older version) is a NodeUsersError: the node would refuse that service for ever."""
    missing = sorted(u.name for u in deployment_users(users.stage, deployment_contracts())
                     if u.name not in users.hashes)
    if missing:
        raise NodeUsersError(f"the node users file has no hash for {', '.join(missing)} "
                             "(run `spz api compose-secrets` again, then restart the nodes)")
    return block_with_agents(users.stage, users.hashes, agents)


class NodeKeeper:
    """One node: its block kept current, nats-server reloaded on a change."""

    def __init__(self, config: Path, users_file: Path, agents_dir: Path, work_dir: Path,
                 binary: str | None = None) -> None:
        self.config, self.users_file, self.agents_dir, self.work_dir = config, users_file, agents_dir, work_dir
        self.binary = binary
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen: tuple = ()
        self.reloads = 0

    @property
    def auth_file(self) -> Path:
        return self.work_dir / naming.BUS_AUTH_FILE_NAME

    def write_block(self) -> int:
        """The block written (0600) from the users file and the agents there now; how many agent users."""
        seen = fingerprint(self.agents_dir)
        agents = list_users(self.agents_dir)
        write_private(self.auth_file, node_block(read_node_users(self.users_file), agents))
        self.seen = seen
        return len(agents)

    def prepare(self) -> Path:
        """The node's config copied beside its block (it includes the block by a relative path)."""
        try:
            text = self.config.read_text(encoding="utf-8")
        except OSError as exc:
            raise NodeUsersError(f"cannot read the node's config {self.config}: {exc.strerror or exc}") from None
        if f'include "{naming.BUS_AUTH_FILE_NAME}"' not in text:
            raise NodeUsersError(f"{self.config} does not include {naming.BUS_AUTH_FILE_NAME}: its bus would be open")
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.write_block()
        conf = self.work_dir / self.config.name
        write_private(conf, text)
        return conf

    def look(self) -> bool:
        """On a change of the agents' directory: the block written again and nats-server
        reloaded. True when it reloaded. A bad users file keeps the last block (said once a change)."""
        if fingerprint(self.agents_dir) == self.seen:
            return False
        try:
            count = self.write_block()
        except (NodeUsersError, OSError, ValueError) as exc:
            print(f"cannot write the node's authorization block (the last one stays): {exc}", flush=True)
            self.seen = fingerprint(self.agents_dir)
            return False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGHUP)
        self.reloads += 1
        print(f"bus users reloaded: {count} cluster agent user(s)", flush=True)
        return True

    def run(self) -> int:
        from skypurza.events.natsserver import nats_server_binary

        conf = self.prepare()
        self.proc = subprocess.Popen([self.binary or nats_server_binary(), "-c", str(conf)], stdin=subprocess.DEVNULL)

        def forward(signum, frame) -> None:  # noqa: ARG001
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, forward)
        while self.proc.poll() is None:
            time.sleep(POLL_S)
            self.look()
        return self.proc.returncode


def main(config: Path, users_file: Path, agents_dir: Path, stage: str | None = None) -> int:
    """`spz api bus-node`: refuses a stage other than the one the users were drawn for (every
    user's grants name that stage's subjects) before nats-server starts."""
    drawn = read_node_users(users_file).stage
    if stage and stage != drawn:
        raise NodeUsersError(f"the node users were drawn for stage {drawn!r} but this deployment runs stage {stage!r}: "
                             f"run `SKYPURZA_STAGE={stage} spz api compose-secrets` again, or set SKYPURZA_STAGE={drawn}")
    return NodeKeeper(config, users_file, agents_dir, naming.bus_node_dir(drawn, config)).run()
