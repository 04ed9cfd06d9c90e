"""Heartbeat watching: a node of a live managed cluster that beat and then went silent is lost.

Agents beat every few seconds on core NATS (`naming.heartbeats_filter`); this keeps the last
beat of each (cluster, rank) by the injected clock's monotonic reading and, every quarter of the
timeout (at most 5 s, paced by the event loop), reports the watched nodes silent for longer
than the timeout (`detect.silent_nodes`: a node never heard from is not judged, so a slow boot
is never a death). Its inputs are injected — the bus (the service's, checked against its
contract), the nodes to watch, the clock (events/clock.py) — so a test drives `beat()` and
`check()` with a `ManualClock` instead of sleeping.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any, Awaitable, Callable

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.envelope import Event

from . import detect
from .losses import LossReporter

log = logging.getLogger("skypurza.recovery")

Node = tuple[str, int, str | None]  # cluster, rank, instance id
Nodes = Callable[[], Awaitable[list[Node]]]


class HeartbeatWatch:
    def __init__(self, bus: Bus, reporter: LossReporter, nodes: Nodes, *, timeout_s: float,
                 clock: Clock = SYSTEM_CLOCK):
        self._bus = bus
        self._reporter = reporter
        self._nodes = nodes
        self.timeout_s = timeout_s
        self._clock = clock
        self._beats: dict[tuple[str, int], float] = {}
        self._sub: Any = None

    async def start(self) -> None:
        if self._sub is None:
            self._sub = await self._bus.nc.subscribe(naming.heartbeats_filter(self._bus.stage), cb=self._on_beat)

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection may be gone already: nothing left to stop
                pass
            self._sub = None

    async def _on_beat(self, msg: Any) -> None:
        parsed = detect.parse_heartbeat_subject(msg.subject, naming.subject_prefix(self._bus.stage))
        if parsed is not None:
            self.beat(*parsed)

    def beat(self, cluster: str, rank: int) -> None:
        self._beats[(cluster, rank)] = self._clock.monotonic()

    def heard(self) -> dict[tuple[str, int], float]:
        """The last beat of every (cluster, rank) heard and not yet judged lost."""
        return dict(self._beats)

    async def check(self) -> list[Event]:
        """Report the watched nodes silent for longer than the timeout; what was published."""
        watched = await self._nodes()
        out = []
        for silent in detect.silent_nodes(self._beats, watched, self._clock.monotonic(), self.timeout_s):
            ev = await self._reporter.report(
                silent.cluster, silent.rank, silent.instance_id, "node_lost",
                {"source": "heartbeat", "silent_s": round(silent.seconds, 1), "timeout_s": self.timeout_s},
                last_heartbeat=self._clock.now() - timedelta(seconds=silent.seconds))
            self._beats.pop((silent.cluster, silent.rank), None)
            if ev is not None:
                out.append(ev)
        return out

    async def run(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(self.timeout_s / 4, 5.0)))
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # a detector never stops: the next round looks again
                log.exception("heartbeat check failed")

