"""How a node agent is started: the one contract between the provisioner (local processes, EC2
user-data), the test harness that plays EC2's user-data, and the agent itself.

`python -m skypurza.services.agent <AgentSpec.to_argv()>` starts an agent.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

# The node agent's settings (services/agent/settings.py reads each; a test checks the two agree).
# Local agents inherit them with the provisioner's environment; nodes elsewhere (pods) are given
# these, so one `SKYPURZA_AGENT_HEARTBEAT_S` set for the control plane means the same everywhere.
# SKYPURZA_AGENT_NATS_URL is not one: it is the provisioner's, and the command line carries the URL.
AGENT_SETTING_VARS = (
    "SKYPURZA_AGENT_HEARTBEAT_S", "SKYPURZA_AGENT_KILL_GRACE_S", "SKYPURZA_AGENT_LOG_LEVEL",
    "SKYPURZA_AGENT_SAMPLE_S", "SKYPURZA_AGENT_XID_SOURCE", "SKYPURZA_CHECKPOINT_SYNC_S", "SKYPURZA_BUCKET_STORE",
    "SKYPURZA_AGENT_GPU_SOURCE", "SKYPURZA_AGENT_TOOL_TIMEOUT_S",
)


# A file descriptor the local backend gives an agent it starts: the agent writes "ready\n" to it once
# NodeReady is stored and closes it, so the backend reacts to that (or to the agent's exit: end of
# file) instead of polling the ready file. The agent takes it out of its environment at once, so no
# job inherits it.
READY_FD_VAR = "SKYPURZA_AGENT_READY_FD"
READY_LINE = b"ready\n"


def agent_settings_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's settings set in `environ` (pure; empty values are unset, as the agent reads them)."""
    return {k: environ[k] for k in AGENT_SETTING_VARS if environ.get(k) not in (None, "")}


@dataclass(frozen=True)
class AgentSpec:
    nats_url: str
    stage: str
    cluster: str
    rank: int
    num_nodes: int
    # Internal IPs of every node, in rank order (rank 0 = head): SKYPILOT_NODE_IPS.
    node_ips: tuple[str, ...] = ()
    # ... or a file holding them, one a line: a gang of N local nodes shares one file instead of
    # carrying N IPs in each of N command lines (memory and cluster.json quadratic in N).
    # `from_argv` reads it, so the agent sees `node_ips` either way.
    node_ips_file: str = ""
    instance_id: str = ""
    infra: str = "local"  # "local" or "aws"
    region: str | None = None
    zone: str | None = None
    # Where the agent keeps its files: workdir copies, job state, pid files. Local clusters give
    # each node its own directory; on EC2 it is the user's home.
    home: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def to_argv(self) -> list[str]:
        argv = ["--nats", self.nats_url, "--stage", self.stage, "--cluster", self.cluster,
                "--rank", str(self.rank), "--num-nodes", str(self.num_nodes)]
        if self.node_ips_file:
            argv += ["--node-ips-file", self.node_ips_file]
        else:
            argv += ["--node-ips", ",".join(self.node_ips)]
        argv += ["--infra", self.infra]
        if self.instance_id:
            argv += ["--instance-id", self.instance_id]
        if self.region:
            argv += ["--region", self.region]
        if self.zone:
            argv += ["--zone", self.zone]
        if self.home:
            argv += ["--home", self.home]
        for k, v in sorted(self.extra.items()):
            argv += ["--extra", f"{k}={v}"]
        return argv

    def command(self, python: str | None = None) -> list[str]:
        return [python or sys.executable, "-m", "skypurza.services.agent", *self.to_argv()]

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="python -m skypurza.services.agent",
                                    description="SkyPurza node agent: runs a cluster's jobs on this node.")
        p.add_argument("--nats", required=True, dest="nats_url")
        p.add_argument("--stage", required=True)
        p.add_argument("--cluster", required=True)
        p.add_argument("--rank", required=True, type=int)
        p.add_argument("--num-nodes", required=True, type=int)
        p.add_argument("--node-ips", default="")
        p.add_argument("--node-ips-file", default="")
        p.add_argument("--infra", default="local")
        p.add_argument("--instance-id", default="")
        p.add_argument("--region", default=None)
        p.add_argument("--zone", default=None)
        p.add_argument("--home", default="")
        p.add_argument("--extra", action="append", default=[])
        return p

    @classmethod
    def from_argv(cls, argv: list[str]) -> "AgentSpec":
        a = cls.parser().parse_args(argv)
        ips = a.node_ips.split(",")
        if a.node_ips_file:
            with open(a.node_ips_file, encoding="utf-8") as f:
                ips = f.read().split()
        return cls(nats_url=a.nats_url, stage=a.stage, cluster=a.cluster, rank=a.rank, num_nodes=a.num_nodes,
                   node_ips=tuple(x for x in ips if x), node_ips_file=a.node_ips_file, instance_id=a.instance_id,
                   infra=a.infra, region=a.region, zone=a.zone, home=a.home,
                   extra=dict(kv.split("=", 1) for kv in a.extra))
