"""Optimizer service: the cheapest place that has capacity, and the next one when it has not.

Eats:  TaskSubmitted            -> PlacementChosen (attempt 1) | PlacementFailed
       CapacityError            -> PlacementChosen (attempt n+1) | PlacementFailed (every attempt listed)
       DispatchPolicyApplied    -> (folded: while a policy is active, a TaskSubmitted waits ...)
       TaskAdmitted             -> ... for this, then PlacementChosen (attempt 1) | PlacementFailed
       TeamAdded/Updated/Removed -> (folded: a team's allowed infras confine its tasks' placements,
                                   the team being the API server's stamp: workspace.py)
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
import bisect
import dataclasses
import logging
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.envelope import decode, envelope_of
from skypurza.events.models import (
    CapacityError, DispatchPolicyApplied, PlacementChosen, PlacementFailed, TaskAdmitted, TaskSubmitted, TeamAdded,
    TeamRemoved, TeamUpdated,
)
from skypurza.events.principal import principal_of
from skypurza.events.service import EmitContext, Emit, Pipelined, Reactions, ServiceContract, handles

from . import decide
from .workspace import TeamInfras
from .catalog import Catalog
from .settings import OptimizerSettings
from .world import kubernetes_contexts, load_world, slurm_clusters

log = logging.getLogger("skypurza.optimizer")

SPOT_REFRESH_TTL_S = 300.0
KUBE_REFRESH_TTL_S = 5.0
# Partitions change rarely (an admin's scontrol, a node drained) and reading them is an SSH round
# trip per cluster: read again before placing when older than this.
SLURM_REFRESH_TTL_S = 60.0

CONTRACT = ServiceContract(
    name="optimizer",
    consumes=(TaskSubmitted, CapacityError, DispatchPolicyApplied, TaskAdmitted, TeamAdded, TeamUpdated, TeamRemoved),
    emits=(PlacementChosen, PlacementFailed),
    # Decisions take well under a millisecond and read only the task's own inputs: handle a
    # fetched batch in order and publish the placements pipelined (see ServiceRunner).
    delivery=Pipelined(),
    consume_notes={TaskSubmitted: "first placement (with no dispatch policy active)",
                   CapacityError: "next placement", DispatchPolicyApplied: "whether submissions wait for admission",
                   TaskAdmitted: "first placement (while a dispatch policy is active)",
                   TeamAdded: "a team's allowed infras (where its tasks may be placed)",
                   TeamUpdated: "a team's allowed infras", TeamRemoved: "a team's allowed infras"},
    emit_notes={PlacementFailed: "every attempt listed"},
)


# The default task, and CPU minimums on the spot market (the other market's prices, the value parsers).
WARM_UP_TASKS: tuple[dict[str, Any], ...] = ({}, {"resources": {"cpus": "1+", "memory": "1+", "use_spot": True}})


def warm_up(world: decide.World) -> None:
    """One placement nobody asked for, at start: the catalog's lazy load and the first build of the
    task, candidate and envelope models (~60 ms) are paid here, not by the first request (issue
    21). Nothing is published; the plan cache is keyed by content, so no later decision changes."""
    try:
        for task in WARM_UP_TASKS:
            probe = TaskSubmitted(task_id="warm-up", cluster="warm-up", task=task)
            decode(envelope_of(probe, source=CONTRACT.name).to_json())
            envelope_of(decide.first_placement(probe, world), source=CONTRACT.name).to_json()
    except Exception as exc:  # only a warm-up: the first request pays instead
        log.warning("optimizer: warm-up placement failed: %s", exc)


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
        self._kube_read = clock.monotonic()
        self._slurm_read = clock.monotonic()
        self.world: decide.World | None = None
        self.bus: Bus | None = None
        self.policy_changes: list[tuple[int, bool]] = []  # decide.awaits_admission reads them
        self.teams = TeamInfras()  # each team's allowed infras, folded from the log
        self._team_seq = 0  # the newest team event folded

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self.world = await asyncio.to_thread(load_world, self.settings, self._catalog, self._enabled)
        await asyncio.to_thread(warm_up, self.world)
        enabled = self.world.enabled_infras
        async for s in bus.replay(filter_subject=naming.event_filter(bus.stage, DispatchPolicyApplied.AGGREGATE,
                                                                     DispatchPolicyApplied.EVENT_NAME)):
            self._policy_changed(s)
        stored = []
        for subject in (naming.event_filter(bus.stage, "team", name)
                        for name in (TeamAdded.EVENT_NAME, TeamUpdated.EVENT_NAME, TeamRemoved.EVENT_NAME)):
            stored += [s async for s in bus.replay(filter_subject=subject)]
        for s in sorted(stored, key=lambda s: s.seq):
            self._team_changed(s)
        log.info("optimizer: infras enabled: %s", ", ".join(sorted(enabled)))

    async def close(self) -> None:
        pass  # no background work

    @handles(TaskSubmitted)
    async def on_submitted(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert self.world is not None and isinstance(stored.event, TaskSubmitted)
        ev = stored.event
        if decide.awaits_admission(self.policy_changes, stored.seq):
            return []  # the dispatch service admits it (TaskAdmitted) or says why it waits
        if self._live_spot and "aws" in self.world.enabled_infras:
            await self._refresh_spot(ev)
        await self._refresh_kubernetes()
        await self._refresh_slurm()
        team = self._team(stored)
        return [Emit(decide.first_placement(ev, self.world, team, self.teams.of(team)), key="attempt-1")]

    def _team(self, stored: Stored) -> str | None:
        """Whose workspace confines the task: the API server's stamp, else the event's own team."""
        return principal_of(stored.envelope, stored.event)[1]

    def _team_changed(self, stored: Stored) -> None:
        # Replayed at start and then consumed: a team event is folded once, in log order.
        if stored.event is not None and stored.seq > self._team_seq:
            self._team_seq = stored.seq
            self.teams.apply(stored.event)

    @handles(TeamAdded, TeamUpdated, TeamRemoved)
    async def on_team(self, stored: Stored, ctx: EmitContext) -> Reactions:
        self._team_changed(stored)
        return []

    def _policy_changed(self, stored: Stored) -> None:
        if isinstance(stored.event, DispatchPolicyApplied) and all(seq != stored.seq for seq, _ in self.policy_changes):
            bisect.insort(self.policy_changes, (stored.seq, stored.event.policy is not None))

    @handles(DispatchPolicyApplied)
    async def on_policy(self, stored: Stored, ctx: EmitContext) -> Reactions:
        self._policy_changed(stored)
        return []

    @handles(TaskAdmitted)
    async def on_admitted(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert self.world is not None and isinstance(stored.event, TaskAdmitted)
        ev = stored.event
        if not decide.awaits_admission(self.policy_changes, ev.submitted_seq):
            return []  # submitted with no policy active: placed when it was submitted
        submitted, _, team = await self._task_history(ev.task_id, stored.seq)
        if submitted is None:
            log.warning("admission of unknown task %s ignored", ev.task_id)
            return []
        return [Emit(decide.first_placement(submitted, decide.admitted_world(self.world, ev.infra), team,
                                            self.teams.of(team), ev.reservation), key="attempt-1")]

    @handles(CapacityError)
    async def on_capacity_error(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert self.world is not None and isinstance(stored.event, CapacityError)
        ev = stored.event
        submitted, errors, team = await self._task_history(ev.task_id, stored.seq)
        if submitted is None:
            log.warning("capacity error for unknown task %s ignored", ev.task_id)
            return []
        await self._refresh_kubernetes()
        await self._refresh_slurm()
        return [Emit(decide.after_capacity_error(submitted, errors, self.world, team, self.teams.of(team)),
                     key=f"attempt-{ev.attempt + 1}")]

    async def _task_history(self, task_id: str, until_seq: int
                            ) -> tuple[TaskSubmitted | None, list[CapacityError], str | None]:
        assert self.bus is not None
        submitted: TaskSubmitted | None = None
        team: str | None = None
        errors: list[CapacityError] = []
        seen: set[int] = set()
        async for s in self.bus.replay(filter_subject=naming.aggregate_subjects(self.bus.stage, "task", task_id),
                                       until_seq=until_seq):
            if isinstance(s.event, TaskSubmitted) and submitted is None:
                submitted, team = s.event, self._team(s)
            elif isinstance(s.event, CapacityError) and s.event.attempt not in seen:
                seen.add(s.event.attempt)
                errors.append(s.event)
        return submitted, errors, team

    async def _refresh_kubernetes(self) -> None:
        """Pods come and go: each context's free capacity is read again when older than a TTL
        (the World stays the deciders' only input; a replay gives the same World, the same answer)."""
        assert self.world is not None
        if not self.world.kubernetes:
            return
        now = self.clock.monotonic()
        if now - self._kube_read < KUBE_REFRESH_TTL_S:
            return
        self._kube_read = now
        try:
            contexts = await asyncio.to_thread(kubernetes_contexts, self.world.enabled_infras)
        except Exception as exc:  # a refresh must never stop a placement: the last reading stands
            log.warning("Kubernetes capacity unavailable: %s", exc)
            return
        self.world = dataclasses.replace(self.world, kubernetes=contexts)

    async def _refresh_slurm(self) -> None:
        """Each Slurm cluster's partitions read again when older than SLURM_REFRESH_TTL_S (bounded:
        the discovery's own timeout); a failed read keeps the last one."""
        assert self.world is not None
        if "slurm" not in self.world.enabled_infras:
            return
        now = self.clock.monotonic()
        if now - self._slurm_read < SLURM_REFRESH_TTL_S:
            return
        self._slurm_read = now
        try:
            clusters = await asyncio.to_thread(slurm_clusters, self.world.enabled_infras)
        except Exception as exc:  # a refresh must never stop a placement: the last reading stands
            log.warning("Slurm partitions unavailable: %s", exc)
            return
        self.world = dataclasses.replace(self.world, slurm=clusters)

    async def _refresh_spot(self, ev: TaskSubmitted) -> None:
        assert self.world is not None
        try:
            plan = decide.plan_for(ev, self.world)
        except decide.InvalidTask:
            return  # nothing to price: first_placement says what is wrong with it
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
