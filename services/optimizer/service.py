"""Optimizer service: the cheapest place that has capacity, and the next one when it has not.

Eats:  TaskSubmitted            -> PlacementChosen (attempt 1) | PlacementFailed
       CapacityError            -> PlacementChosen (attempt n+1) | PlacementFailed (every attempt listed)
Emits: PlacementChosen, PlacementFailed, as `CONTRACT` declares (the runner refuses anything
       else); ids derived from the cause: a redelivered cause republishes the same ids and
       JetStream drops the copies.

It holds no state of its own: a task's blocks are the CapacityErrors in the task's history,
read back from the log when an error arrives (`decide.after_capacity_error`). Kill it in the
middle of a failover and restart it: its durable consumer resumes at the unacked event and
the decision is the same, so no attempt is repeated.

Live spot prices (SKYPURZA_LIVE_SPOT_PRICES=1, AWS enabled): before the first placement the
spot prices of the regions among the best spot candidates are read from EC2 (cached for five
minutes, by the injected clock's monotonic reading: events/clock.py), so a lagging catalog
does not decide.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.models import CapacityError, PlacementChosen, PlacementFailed, TaskSubmitted
from skypurza.events.service import EmitContext, Emit, Pipelined, Reactions, ServiceContract, handles

from . import decide
from .catalog import Catalog
from .settings import OptimizerSettings
from .world import load_world

log = logging.getLogger("skypurza.optimizer")

SPOT_REFRESH_TTL_S = 300.0

CONTRACT = ServiceContract(
    name="optimizer",
    consumes=(TaskSubmitted, CapacityError),
    emits=(PlacementChosen, PlacementFailed),
    # Decisions take well under a millisecond and read only the task's own inputs: handle a
    # fetched batch in order and publish the placements pipelined (see ServiceRunner).
    delivery=Pipelined(),
    consume_notes={TaskSubmitted: "first placement", CapacityError: "next placement"},
    emit_notes={PlacementFailed: "every attempt listed"},
)


class OptimizerService:
    contract = CONTRACT
    name = CONTRACT.name

    def __init__(self, catalog: Catalog | None = None, enabled: frozenset[str] | None = None,
                 live_spot_prices: bool | None = None, settings: OptimizerSettings | None = None,
                 clock: Clock = SYSTEM_CLOCK):
        self.clock = clock
        self._catalog = catalog
        self._enabled = enabled
        self.settings = settings or OptimizerSettings.load()  # a bad value stops it here, with its name
        self._live_spot = self.settings.live_spot_prices if live_spot_prices is None else live_spot_prices
        self._spot_refreshed: dict[str, float] = {}
        self.world: decide.World | None = None
        self.bus: Bus | None = None

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self.world = await asyncio.to_thread(load_world, self.settings, self._catalog, self._enabled)
        enabled = self.world.enabled_infras
        log.info("optimizer: infras enabled: %s", ", ".join(sorted(enabled)))

    async def close(self) -> None:
        pass  # no background work

    @handles(TaskSubmitted)
    async def on_submitted(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert self.world is not None and isinstance(stored.event, TaskSubmitted)
        ev = stored.event
        if self._live_spot and "aws" in self.world.enabled_infras:
            await self._refresh_spot(ev)
        return [Emit(decide.first_placement(ev, self.world), key="attempt-1")]

    @handles(CapacityError)
    async def on_capacity_error(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert self.world is not None and isinstance(stored.event, CapacityError)
        ev = stored.event
        submitted, errors = await self._history(ev.task_id, stored.seq)
        if submitted is None:
            log.warning("capacity error for unknown task %s ignored", ev.task_id)
            return []
        return [Emit(decide.after_capacity_error(submitted, errors, self.world), key=f"attempt-{ev.attempt + 1}")]

    async def _history(self, task_id: str, until_seq: int) -> tuple[TaskSubmitted | None, list[CapacityError]]:
        assert self.bus is not None
        submitted: TaskSubmitted | None = None
        errors: list[CapacityError] = []
        seen: set[int] = set()
        async for s in self.bus.replay(filter_subject=naming.aggregate_subjects(self.bus.stage, "task", task_id),
                                       until_seq=until_seq):
            if isinstance(s.event, TaskSubmitted) and submitted is None:
                submitted = s.event
            elif isinstance(s.event, CapacityError) and s.event.attempt not in seen:
                seen.add(s.event.attempt)
                errors.append(s.event)
        return submitted, errors

    async def _refresh_spot(self, ev: TaskSubmitted) -> None:
        assert self.world is not None
        plan = decide.plan_for(ev, self.world)
        regions = []
        for c in plan.candidates[:10]:
            if c.use_spot and c.infra == "aws" and c.region and c.region not in regions:
                regions.append(c.region)
        now = self.clock.monotonic()
        catalog = self.world.catalog
        for region in regions[:3]:
            if now - self._spot_refreshed.get(region, -1e9) < SPOT_REFRESH_TTL_S:
                continue
            try:
                from .catalog.refresh import refresh_spot_prices

                types = sorted({c.instance_type for c in plan.candidates if c.region == region})
                catalog = await asyncio.to_thread(refresh_spot_prices, catalog, region, types)
                self._spot_refreshed[region] = now
            except Exception as exc:  # a price refresh must never stop a placement
                log.warning("live spot prices for %s unavailable: %s", region, exc)
        self.world = dataclasses.replace(self.world, catalog=catalog)
