"""What the provisioner knows about clusters, rebuilt from the event log every time it is needed.

Nothing is kept in memory between events: a provisioner restarted at any point reads the same
answers. A cluster's state is the newest event of each lifecycle type on its subject
(`bus.last_event`), folded in stream order by the one fold (`events/fold.py` `cluster_after`,
whose answer depends only on the newest event of each type); the set of live clusters is the
same fold over every ClusterProvisioned and ClusterTerminated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.fold import CLUSTER_LIVE, ClusterStatus, cluster_after
from skypurza.events.models import (
    CapacityError,
    ClusterProvisioned,
    ClusterStarted,
    ClusterStopped,
    ClusterTerminated,
    ProvisionFailed,
)
from skypurza.events.types import NodeInfo as EventNode

from .adapter import ClusterRef


@dataclass(frozen=True)
class ClusterState:
    cluster: str
    provisioned: ClusterProvisioned | None = None
    provisioned_seq: int = 0
    terminated_seq: int = 0
    stopped_seq: int = 0
    started_seq: int = 0
    started_nodes: tuple[EventNode, ...] = ()
    status: ClusterStatus | None = None  # the one fold's, of the newest lifecycle events

    @property
    def live(self) -> bool:
        """Provisioned and not terminated since (stopped clusters are live: they hold disks)."""
        return self.provisioned is not None and self.status in CLUSTER_LIVE

    @property
    def stopped(self) -> bool:
        return self.live and self.status == "STOPPED"

    @property
    def infra(self) -> str | None:
        return self.provisioned.candidate.infra if self.provisioned else None

    @property
    def nodes(self) -> list[EventNode]:
        """The newest node list (IPs change when a stopped cluster starts again)."""
        if self.started_nodes and self.started_seq > self.provisioned_seq:
            return list(self.started_nodes)
        return list(self.provisioned.nodes) if self.provisioned else []

    def ref(self, stage: str) -> ClusterRef:
        assert self.provisioned is not None
        c = self.provisioned.candidate
        return ClusterRef(stage=stage, cluster=self.cluster, region=c.region, zone=c.zone,
                          instance_ids=tuple(n.instance_id for n in self.nodes), infra=c.infra)


def cluster_state(cluster: str, provisioned: Stored | None, terminated: Stored | None,
                  stopped: Stored | None, started: Stored | None) -> ClusterState:
    """Pure: the state from the newest event of each kind (any may be missing)."""
    def seq(s: Stored | None) -> int:
        return s.seq if s is not None and s.event is not None else 0

    prov = provisioned.event if provisioned is not None and isinstance(provisioned.event, ClusterProvisioned) else None
    start_nodes = tuple(started.event.nodes) if started is not None and isinstance(started.event, ClusterStarted) else ()
    status: ClusterStatus | None = None
    for s in sorted((s for s in (provisioned, terminated, stopped, started) if seq(s)), key=seq):
        status = cluster_after(status, s.event)  # type: ignore[union-attr]
    return ClusterState(cluster=cluster, provisioned=prov, provisioned_seq=seq(provisioned),
                        terminated_seq=seq(terminated), stopped_seq=seq(stopped), started_seq=seq(started),
                        started_nodes=start_nodes, status=status)


async def load_cluster_state(bus: Bus, cluster: str) -> ClusterState:
    def subject(event: type) -> str:
        return naming.event_subject(bus.stage, "cluster", cluster, event.EVENT_NAME)  # type: ignore[attr-defined]

    found = await asyncio.gather(*(bus.last_event(subject(e)) for e in
                                   (ClusterProvisioned, ClusterTerminated, ClusterStopped, ClusterStarted)))
    return cluster_state(cluster, *found)


def fold_live(events: Iterable[Stored]) -> dict[str, ClusterProvisioned]:
    """Pure: clusters whose newest ClusterProvisioned is newer than their newest ClusterTerminated
    (the one fold over both, in stream order), with that ClusterProvisioned."""
    status: dict[str, ClusterStatus | None] = {}
    newest: dict[str, ClusterProvisioned] = {}
    for s in sorted((s for s in events if isinstance(s.event, (ClusterProvisioned, ClusterTerminated))),
                    key=lambda s: s.seq):
        c = s.event.cluster  # type: ignore[union-attr]
        status[c] = cluster_after(status.get(c), s.event)
        if isinstance(s.event, ClusterProvisioned):
            newest[c] = s.event
    return {c: ev for c, ev in newest.items() if status.get(c) in CLUSTER_LIVE}


async def live_clusters(bus: Bus) -> dict[str, ClusterProvisioned]:
    """Every live cluster of the stage, from the whole log (ClusterProvisioned minus ClusterTerminated)."""
    return (await live_clusters_at(bus))[0]


async def live_clusters_at(bus: Bus) -> tuple[dict[str, ClusterProvisioned], dict[str, int]]:
    """`live_clusters`, and the stream sequence of each one's ClusterProvisioned (what a team's
    credentials were then: teamcreds.py)."""
    events: list[Stored] = []
    for event in (ClusterProvisioned, ClusterTerminated):
        events += await replay_all(bus, naming.event_filter(bus.stage, "cluster", event.EVENT_NAME))
    live = fold_live(events)
    seqs: dict[str, int] = {}
    for s in events:
        if isinstance(s.event, ClusterProvisioned) and s.event is live.get(s.event.cluster):
            seqs[s.event.cluster] = s.seq
    return live, seqs


async def replay_all(bus: Bus, subject: str) -> list[Stored]:
    """Every event on `subject`. Asks for the last one first: a replay of a subject with no
    event at all would wait out the fetch timeout."""
    if await bus.last_event(subject) is None:
        return []
    return [s async for s in bus.replay(filter_subject=subject)]


async def find_event(bus: Bus, subject: str, pred: Callable[[Stored], bool]) -> Stored | None:
    """The newest stored event on `subject` for which `pred` holds (the newest is checked first)."""
    last = await bus.last_event(subject)
    if last is None:
        return None
    if pred(last):
        return last
    found = None
    async for s in bus.replay(filter_subject=subject):
        if pred(s):
            found = s
    return found


@dataclass(frozen=True)
class Outcome:
    """What already came of one PlacementChosen (a redelivery must not act again)."""

    provisioned: ClusterProvisioned | None = None
    failed: CapacityError | ProvisionFailed | None = None


async def placement_outcome(bus: Bus, *, task_id: str, cluster: str, placement_id: str) -> Outcome:
    def mine(s: Stored) -> bool:
        return getattr(s.event, "placement_id", None) == placement_id

    subject = naming.event_subject(bus.stage, "cluster", cluster, ClusterProvisioned.EVENT_NAME)
    found = await find_event(bus, subject, mine)
    if found is not None and isinstance(found.event, ClusterProvisioned):
        return Outcome(provisioned=found.event)
    for event in (CapacityError, ProvisionFailed):
        found = await find_event(bus, naming.event_subject(bus.stage, "task", task_id, event.EVENT_NAME), mine)
        if found is not None and isinstance(found.event, (CapacityError, ProvisionFailed)):
            return Outcome(failed=found.event)
    return Outcome()


async def event_with_id(bus: Bus, subject: str, event_id: str) -> Stored | None:
    """The stored event with envelope id `event_id` on `subject`."""
    return await find_event(bus, subject, lambda s: s.envelope is not None and s.envelope.id == event_id)
