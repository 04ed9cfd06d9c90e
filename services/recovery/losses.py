"""Reporting a lost node once: the one way both detectors (heartbeats, instance watching) turn
what they found into a SpotPreempted or NodeLost on the log.

A node is reported once per (cluster, instance or rank): remembered in memory, and looked up on
the cluster's own subject first, so a restarted recovery service (or a second one) that finds
the same loss does not report it again; the event id is derived from the node and the kind, so
two services reporting it at once store it once.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.envelope import Event, derive_id
from skypurza.events.models import NodeLost, SpotPreempted

log = logging.getLogger("skypurza.recovery")

class LossReporter:
    """Publishes on `bus` — the service's own, checked against its contract — as `service`;
    `detected_at` and the envelope's time are `clock.now()`."""

    def __init__(self, bus: Bus, *, service: str, clock: Clock = SYSTEM_CLOCK):
        self._bus = bus
        self._service = service
        self._clock = clock
        self._reported: set[tuple[str, str]] = set()  # (cluster, instance or rank) already reported lost

    async def report(self, cluster: str, rank: int | None, instance_id: str | None, kind: str,
                     evidence: dict[str, Any], last_heartbeat: datetime | None = None) -> Event | None:
        """The event published for this node (`kind` "preempted" or "node_lost"), or None when
        it was reported already."""
        key = (cluster, instance_id or f"rank-{rank}")
        if key in self._reported:
            return None
        cls: type[Event] = SpotPreempted if kind == "preempted" else NodeLost
        prior = await self._bus.last_event(naming.event_subject(self._bus.stage, "cluster", cluster, cls.EVENT_NAME))
        if prior is not None and getattr(prior.event, "instance_id", None) == instance_id \
                and getattr(prior.event, "rank", None) == rank:
            self._reported.add(key)
            return None
        now = self._clock.now()
        if cls is SpotPreempted:
            event: Event = SpotPreempted(cluster=cluster, rank=rank, instance_id=instance_id or "", detected_at=now,
                                         evidence=evidence)
        else:
            event = NodeLost(cluster=cluster, rank=rank if rank is not None else 0, instance_id=instance_id,
                             last_heartbeat=last_heartbeat, detected_at=now, evidence=evidence)
        await self._bus.publish(self._bus.envelope(event, id=derive_id(f"{cluster}|{key[1]}", self._service, kind),
                                                   time=now))
        self._reported.add(key)
        log.warning("%s: node %s (%s) %s: %s", cluster, rank, instance_id, kind, evidence)
        return event
