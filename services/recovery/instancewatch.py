"""Instance watching: EC2's word on the nodes of live managed clusters, every `ec2_poll_s`.

`Ec2Watch` (ec2watch.py) asks EC2 and `detect.classify_instance` reads the answer; this is the
loop around them: which nodes to ask about (the AWS nodes of the clusters the service watches,
from their ClusterProvisioned), and a SpotPreempted or NodeLost for each one found lost,
through the `LossReporter` (once per node). The recovery service also calls `check([cluster])`
right after a job fails, to tell a dead node from the user's failure.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Protocol

from skypurza.events.envelope import Event
from skypurza.events.models import ClusterProvisioned

from . import detect
from .ec2watch import Target
from .losses import LossReporter

log = logging.getLogger("skypurza.recovery")

Provisioned = Callable[[str], Awaitable[ClusterProvisioned | None]]


class Looker(Protocol):
    """What asks EC2 (`Ec2Watch`)."""

    async def look(self, targets: list[Target]) -> list[tuple[Target, detect.Finding]]: ...

    async def close(self) -> None: ...


class InstanceWatch:
    def __init__(self, ec2: Looker, reporter: LossReporter, provisioned: Provisioned,
                 clusters: Callable[[], list[str]], *, poll_s: float, infra: str = "aws"):
        self._ec2 = ec2
        self.infra = infra  # whose nodes this looker asks about (aws: EC2; slurm: slurmwatch.py)
        self._reporter = reporter
        self._provisioned = provisioned
        self._clusters = clusters
        self.poll_s = poll_s

    async def targets(self, clusters: list[str]) -> list[Target]:
        """The nodes of these clusters on this watch's infra (another infra's have nothing to ask)."""
        out = []
        for cluster in clusters:
            prov = await self._provisioned(cluster)
            if prov is None or prov.candidate.infra != self.infra or not prov.candidate.region:
                continue
            out += [Target(cluster, n.rank, n.instance_id, prov.candidate.region) for n in prov.nodes]
        return out

    async def check(self, clusters: list[str]) -> list[Event]:
        """Ask EC2 about these clusters' nodes; the SpotPreempted/NodeLost published for lost ones."""
        targets = await self.targets(clusters)
        if not targets:
            return []
        out = []
        for target, finding in await self._ec2.look(targets):
            ev = await self._reporter.report(target.cluster, target.rank, finding.instance_id, finding.kind,
                                             finding.evidence)
            if ev is not None:
                out.append(ev)
        return out

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.check(self._clusters())
            except asyncio.CancelledError:
                raise
            except Exception:  # a detector never stops: the next poll looks again
                log.exception("%s check failed", "EC2" if self.infra == "aws" else self.infra)

    async def close(self) -> None:
        await self._ec2.close()
