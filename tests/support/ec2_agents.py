"""Playing EC2's user-data in tests: a real agent process for every node of every AWS cluster
the provisioner launches on the fake AWS, and a dead machine when its instance dies.

On EC2 the user-data starts `python -m skypurza.services.agent <AgentSpec argv>` at boot. Here,
for each ClusterProvisioned with an `aws` candidate, the harness starts that command on this
machine (own session, own home per node, HOME pointing there, the fake account's credentials
so that S3 buckets work). It polls the fake EC2; when an instance is no longer pending or
running (a spot preemption, a termination), the machine is gone: its agent and every job
process group the agent recorded are killed at once, with no chance to flush anything.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skypurza.events import naming
from skypurza.events.agentspec import AgentSpec
from skypurza.events.bus import Bus, stored_from_msg
from skypurza.events.models import ClusterProvisioned


@dataclass
class Node:
    cluster: str
    rank: int
    instance_id: str
    region: str
    home: Path
    proc: subprocess.Popen[bytes]


@dataclass
class Ec2Agents:
    bus: Bus
    nats_url: str
    root: Path
    aws: Any  # aws_fixtures.FakeAws
    env: dict[str, str] = field(default_factory=dict)
    poll_s: float = 0.2
    nodes: dict[str, Node] = field(default_factory=dict)  # instance id -> node
    killed: list[str] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> "Ec2Agents":
        self._tasks = [asyncio.create_task(self._follow()), asyncio.create_task(self._watch())]
        return self

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for node in list(self.nodes.values()):
            self._kill(node)

    async def _follow(self) -> None:
        subject = naming.event_filter(self.bus.stage, "cluster", ClusterProvisioned.EVENT_NAME)
        async for msg in self.bus.follow(filter_subject=subject, start_seq=1):
            ev = stored_from_msg(msg).event
            if isinstance(ev, ClusterProvisioned) and ev.candidate.infra == "aws":
                for n in ev.nodes:
                    if n.instance_id not in self.nodes:
                        self._boot(ev, n.rank, n.instance_id)

    def _boot(self, ev: ClusterProvisioned, rank: int, instance_id: str) -> None:
        home = self.root / ev.cluster / f"node-{rank}"
        home.mkdir(parents=True, exist_ok=True)
        spec = AgentSpec(nats_url=self.nats_url, stage=self.bus.stage, cluster=ev.cluster, rank=rank,
                         num_nodes=len(ev.nodes), node_ips=tuple("127.0.0.1" for _ in ev.nodes),
                         instance_id=instance_id, infra="aws", region=ev.candidate.region, zone=ev.candidate.zone,
                         home=str(home))
        env = {**os.environ, **self.aws.env, "AWS_DEFAULT_REGION": ev.candidate.region or "us-east-1",
               "HOME": str(home), "PYTHONUNBUFFERED": "1", **self.env}
        log = open(home / "agent.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(spec.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        self.nodes[instance_id] = Node(ev.cluster, rank, instance_id, ev.candidate.region or "us-east-1", home, proc)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            by_region: dict[str, list[str]] = {}
            for node in self.nodes.values():
                if node.proc.poll() is None:
                    by_region.setdefault(node.region, []).append(node.instance_id)
            for region, ids in by_region.items():
                states = await asyncio.to_thread(self._states, region, ids)
                for iid in ids:
                    if states.get(iid) not in ("pending", "running"):
                        self.killed.append(iid)
                        self._kill(self.nodes[iid])

    def _states(self, region: str, ids: list[str]) -> dict[str, str]:
        reply = self.aws.client(region).describe_instances(Filters=[{"Name": "instance-id", "Values": ids}])
        return {i["InstanceId"]: i["State"]["Name"] for r in reply["Reservations"] for i in r["Instances"]}

    def _kill(self, node: Node) -> None:
        """The machine is gone: the agent and its jobs stop at once."""
        run_dir = node.home / ".spz-agent" / "run"
        for f in run_dir.glob("*.pgid") if run_dir.is_dir() else []:
            try:
                os.killpg(int(f.read_text().strip()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        if node.proc.poll() is None:
            try:
                os.killpg(node.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            node.proc.wait(5)

    def running_clusters(self, regions: list[str]) -> set[str]:
        """Clusters with at least one pending or running instance, as EC2 has them now."""
        out = set()
        for region in regions:
            reply = self.aws.client(region).describe_instances(
                Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
            for r in reply["Reservations"]:
                for i in r["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                    out.add(tags.get(naming.TAG_CLUSTER, "?"))
        return out
