"""The GPU health manager: listens to node samples (core NATS, events/nodesample.py), keeps the
last one per node, runs the rules (rules.py) and acts on what they find.

- Every finding is a GpuUnhealthy on the node's cluster, once per finding key: the id is derived
  from the key (two managers store it once) and the findings already on the log are read back at
  start (a restarted manager does not report them again).
- A fatal finding also publishes NodeLost with the evidence (`source: gpu_health`): the recovery
  service already recovers a managed job on a lost node onto a new cluster, and the node agents
  drain the cluster on the GpuUnhealthy (services/agent/view.py).
- `query_subject(stage, "gpuhealth", "nodes")` answers `spz health`: each node's last sample and
  findings. Bounded: at most `max_nodes` nodes are kept (the least recently heard go first).

One bad sample (too big, not a sample) is dropped and counted; the loop never stops on one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from datetime import datetime
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.cluster_events import NodeLost
from skypurza.events.envelope import derive_id
from skypurza.events.health_events import GpuUnhealthy
from skypurza.events.nodesample import NodeSample, decode_sample
from skypurza.events.contract import BusAccess
from skypurza.events.service import LoopContract, declared_bus

from . import rules
from .settings import HealthSettings

log = logging.getLogger("skypurza.gpuhealth")

QUERY_SERVICE = "gpuhealth"
MAX_FINDINGS_PER_NODE = 64

CONTRACT = LoopContract(
    name="gpuhealth",
    reads=(GpuUnhealthy,),
    emits=(GpuUnhealthy, NodeLost),
    emit_notes={GpuUnhealthy: "a rule found a sick GPU (node samples on core NATS)",
                NodeLost: "a fatal finding: recovery moves the managed job elsewhere"},
    bus=BusAccess(answers=QUERY_SERVICE, samples="read"),
)


class GpuHealthService:
    contract = CONTRACT
    name = CONTRACT.name

    def __init__(self, settings: HealthSettings | None = None, *, clock: Clock = SYSTEM_CLOCK):
        self.settings = settings or HealthSettings.load()
        self.clock = clock
        self.bus: Bus | None = None
        self.nodes: OrderedDict[tuple[str, int], NodeSample] = OrderedDict()
        self.findings: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
        # Per node, so a sample reads and replaces its own node's entries only: one flat dict
        # scanned by key prefix cost every sample the whole fleet's idle GPUs (bench/metrics.py).
        self.since: dict[tuple[str, int], dict[str, datetime]] = {}
        self.ecc_base: dict[tuple[str, int], dict[str, tuple[datetime, int]]] = {}  # corrected ECC windows (rules.py)
        self.reported: set[str] = set()
        self.dropped = 0
        self._subs: list[Any] = []
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=10_000)

    async def run(self, bus: Bus, stop: asyncio.Event) -> None:
        self.bus = declared_bus(bus, CONTRACT)
        await self._read_back()
        self._subs.append(await bus.nc.subscribe(naming.samples_filter(bus.stage), cb=self._on_sample))
        self._subs += await bus.serve_queries(QUERY_SERVICE, {"nodes": self._nodes_query})
        while not stop.is_set():
            try:
                data = await asyncio.wait_for(self._queue.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            try:
                await self.handle(data)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad sample or a failed publish: the next sample tries again
                log.exception("a node sample could not be handled")

    async def close(self) -> None:
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection may be gone already
                pass
        self._subs.clear()

    async def _on_sample(self, msg: Any) -> None:
        try:
            self._queue.put_nowait(msg.data)
        except asyncio.QueueFull:
            self.dropped += 1  # the manager is behind: a newer sample of the node comes soon

    async def _read_back(self) -> None:
        """The findings already on the log: reported, and shown by `spz health`."""
        assert self.bus is not None
        subject = naming.event_filter(self.bus.stage, "cluster", GpuUnhealthy.EVENT_NAME)
        if await self.bus.last_event(subject) is None:
            return
        async for stored in self.bus.replay(filter_subject=subject):
            ev = stored.event
            if isinstance(ev, GpuUnhealthy):
                f = rules.Finding(ev.cluster, ev.rank, ev.gpu_index, ev.rule, ev.severity, ev.detail, ev.evidence)
                self.reported.add(f.key)
                self._remember(f, ev.detected_at)

    async def handle(self, data: bytes) -> list[rules.Finding]:
        """One sample off the wire: kept, judged, and its new findings published."""
        sample = decode_sample(data)
        if sample is None:
            self.dropped += 1
            return []
        node = (sample.cluster, sample.rank)
        self.nodes[node] = sample
        self.nodes.move_to_end(node)
        while len(self.nodes) > self.settings.max_nodes:
            gone, _ = self.nodes.popitem(last=False)
            self.findings.pop(gone, None)
            self._forget_since(gone)
        now = self.clock.now()
        result = rules.evaluate(sample, now, self.since.get(node, {}), self.settings, self.ecc_base.get(node, {}))
        self._forget_since(node)
        if result.since:
            self.since[node] = result.since
        if result.ecc_base:
            self.ecc_base[node] = result.ecc_base
        new = [f for f in result.findings if f.key not in self.reported]
        for f in new:
            await self._publish(f, sample, now)
        return new

    def _forget_since(self, node: tuple[str, int]) -> None:
        self.since.pop(node, None)
        self.ecc_base.pop(node, None)

    async def _publish(self, f: rules.Finding, sample: NodeSample, now: datetime) -> None:
        assert self.bus is not None
        ev = GpuUnhealthy(cluster=f.cluster, rank=f.rank, gpu_index=f.gpu_index, rule=f.rule,  # type: ignore[arg-type]
                          severity=f.severity, detail=f.detail, evidence=f.evidence,  # type: ignore[arg-type]
                          detected_at=now)
        await self.bus.publish(self.bus.envelope(ev, id=derive_id(f.key, CONTRACT.name, "gpu_unhealthy"), time=now))
        if f.severity == "fatal":
            lost = NodeLost(cluster=f.cluster, rank=f.rank, instance_id=sample.instance_id, detected_at=now,
                            evidence={"source": "gpu_health", "rule": f.rule, "state": f"GPU unhealthy: {f.detail}",
                                      **{k: v for k, v in f.evidence.items() if k in ("xid", "pci_bus_id")}})
            await self.bus.publish(self.bus.envelope(lost, id=derive_id(f.key, CONTRACT.name, "node_lost"), time=now))
        self.reported.add(f.key)
        self._remember(f, now)
        log.warning("%s node %s: %s (%s)", f.cluster, f.rank, f.detail, f.severity)

    def _remember(self, f: rules.Finding, at: datetime) -> None:
        mine = self.findings.setdefault((f.cluster, f.rank), {})
        if f.key in mine or len(mine) < MAX_FINDINGS_PER_NODE:
            mine[f.key] = {"gpu_index": f.gpu_index, "rule": f.rule, "severity": f.severity, "detail": f.detail,
                           "evidence": f.evidence, "detected_at": at.isoformat()}

    async def _nodes_query(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        cluster = params.get("cluster")
        keys = set(self.nodes) | set(self.findings)
        out = []
        for c, r in sorted(keys):
            if cluster and c != cluster:
                continue
            s = self.nodes.get((c, r))
            out.append({"cluster": c, "rank": r, "sample": s.model_dump(mode="json") if s else None,
                        "findings": list(self.findings.get((c, r), {}).values())})
        return out
