"""The optimizer's decisions as pure functions of a task's history (no bus, no clock).

Eats: TaskSubmitted (first placement) and the task's CapacityErrors (failover).
Gives: PlacementChosen (attempt n, the candidate, the ranked remainder) or PlacementFailed.

Nothing is remembered between calls: the blocks of a task are the CapacityErrors in its own
history, so an optimizer restarted mid-failover decides exactly what it would have decided.

Every input is an argument: the task's events and the `World` (catalog, enabled infras, this
machine's resources, the attempt limit). Nothing here reads the environment, the disk or the
clock; the service's setup (world.py, settings.py) does, once, and passes plain values in.
The one memory is a bounded cache of plans keyed by content (the catalog's fingerprint, never
an object's identity), which only saves work: a hit returns what a miss would compute.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

from skypurza.events.models import CapacityError, PlacementChosen, PlacementFailed, TaskSubmitted
from skypurza.events.types import Attempt
from skypurza.events.types import Candidate as EventCandidate
from skypurza.events.types import ReservationRef

from skypurza.events.k8s_capacity import ContextCapacity
from skypurza.events.slurm_discovery import SlurmCluster

from . import reserved, workspace
from .catalog import Catalog
from .local import LocalResources
from .settings import DEFAULT_MAX_ATTEMPTS  # SKYPURZA_MAX_PLACEMENT_ATTEMPTS sets World.max_attempts
from .placement import (
    Block,
    Candidate,
    PlacementPlan,
    block_for_error,
    enabled_infras,  # noqa: F401  (decide.enabled_infras: where callers have always found it)
    next_placement,
    place,
)

REMAINING_SHOWN = 10
# Candidates ranked per request (exactly the best ones; see placement.place's `limit`): blocks
# are applied before ranking, so after any number of failures the next choice is still exact.
PLAN_LIMIT = 32


@dataclass(frozen=True)
class World:
    """What the optimizer knows besides the task: prices, where it may place, when it gives up."""

    catalog: Catalog
    enabled_infras: frozenset[str]
    local: LocalResources | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    kubernetes: tuple[ContextCapacity, ...] = ()  # each enabled context's free capacity, read at start
    slurm: tuple[SlurmCluster, ...] = ()  # each Slurm cluster's partitions (events/slurm_discovery.py)


def to_event_candidate(c: Candidate) -> EventCandidate:
    """A placement candidate as the events carry it; on-demand candidates get a zone pinned
    (the cheapest allowed one) so that a capacity error blocks a zone, not the region."""
    zone = c.zone or (c.zones[0] if c.zones else None)
    if _already_valid(c, zone):
        return _valid_event_candidate(c, zone)
    return EventCandidate(
        infra=c.infra, region=c.region, zone=zone, zones=list(c.zones), instance_type=c.instance_type,
        accelerators=c.accelerators, use_spot=c.use_spot, vcpus=c.vcpus, memory_gib=c.memory_gib,
        hourly_price_micros=c.hourly_price_micros, num_nodes=c.num_nodes, image_id=c.image_id,
        disk_size_gb=c.disk_size_gb,
    )


# The fields `to_event_candidate` sets: what validation would mark as set on the model.
_SET_FIELDS = frozenset({"infra", "region", "zone", "zones", "instance_type", "accelerators", "use_spot", "vcpus",
                         "memory_gib", "hourly_price_micros", "num_nodes", "image_id", "disk_size_gb"})


def _str_or_none(v: Any) -> bool:
    return v is None or type(v) is str


def _already_valid(c: Candidate, zone: str | None) -> bool:
    """True when every value already has the exact type validation would give it (placement's
    own candidates always do), so validating could neither refuse nor change anything."""
    accs = c.accelerators
    return (type(c.infra) is str and type(c.instance_type) is str and _str_or_none(c.region) and _str_or_none(zone)
            and _str_or_none(c.image_id) and type(c.use_spot) is bool and type(c.vcpus) is float
            and type(c.memory_gib) is float and type(c.hourly_price_micros) is int and type(c.num_nodes) is int
            and type(c.disk_size_gb) is int and all(type(z) is str for z in c.zones)
            and (accs is None or (type(accs) is dict
                                  and all(type(k) is str and type(v) is float for k, v in accs.items()))))


def _valid_event_candidate(c: Candidate, zone: str | None) -> EventCandidate:
    """`EventCandidate(...)` for values `_already_valid` checked, without validating them again
    (a placement converts eleven candidates: issue 21). The same model, field for field, as the
    validating constructor builds (fresh containers included)."""
    out = object.__new__(EventCandidate)
    object.__setattr__(out, "__dict__", {
        "infra": c.infra, "region": c.region, "zone": zone, "zones": list(c.zones), "instance_type": c.instance_type,
        "accelerators": None if c.accelerators is None else dict(c.accelerators), "use_spot": c.use_spot,
        "vcpus": c.vcpus, "memory_gib": c.memory_gib, "hourly_price_micros": c.hourly_price_micros,
        "num_nodes": c.num_nodes, "image_id": c.image_id, "disk_size_gb": c.disk_size_gb, "reservation": None,
    })
    object.__setattr__(out, "__pydantic_fields_set__", set(_SET_FIELDS))
    object.__setattr__(out, "__pydantic_extra__", None)
    object.__setattr__(out, "__pydantic_private__", None)
    return out


def from_event_candidate(c: EventCandidate) -> Candidate:
    return Candidate.from_dict(c.model_dump())


# Placement is a pure function of (resources, nodes, blocks, world): equal requests (the 200
# copies of one managed job, a sweep) are placed once. Keyed by content (the catalog by its
# fingerprint: a refreshed catalog is a new key even where its object reuses an old id), bounded.
@dataclass
class _Planned:
    plan: PlacementPlan
    head: list[EventCandidate] | None = None  # the plan's head as event candidates, converted once


_PLAN_CACHE: OrderedDict[tuple[Any, ...], _Planned] = OrderedDict()
PLAN_CACHE_SIZE = 512


def plan_key(submitted: TaskSubmitted, world: World, blocks: Sequence[Block]) -> tuple[Any, ...]:
    """What a plan depends on, by content."""
    return (world.catalog.fingerprint, world.enabled_infras, repr(world.local), repr(world.kubernetes), repr(world.slurm),
            json.dumps(_resources_of(submitted), sort_keys=True, default=str),
            submitted.num_nodes, json.dumps([b.to_dict() for b in blocks], sort_keys=True, default=str))


def _resources_of(submitted: TaskSubmitted) -> dict[str, Any] | None:
    res = submitted.task.resources
    return None if res is None else res.to_dict()


def initial_blocks(submitted: TaskSubmitted) -> list[Block]:
    """The task's initial blocks (where recovery lost it) as the optimizer's own."""
    return [Block(scope=b.scope, infra=b.infra, region=b.region, zone=b.zone, instance_type=b.instance_type,
                  use_spot=b.use_spot, quota_class=b.quota_class, error_class=b.error_class)
            for b in submitted.initial_blocks]


class InvalidTask(ValueError):
    """A submitted task that is not a valid task: a hand-made event (the CLI and the API server
    check a task before they submit it). Placing it fails, with what is wrong."""


MAX_PROBLEMS_SHOWN = 3


def valid_task(submitted: TaskSubmitted) -> Any:
    """The submitted task as the task model (events/taskspec), or InvalidTask saying why."""
    from pydantic import ValidationError

    from skypurza.events.taskspec.messages import findings
    from skypurza.events.taskspec.task import Task

    try:
        return Task.from_public_dict(submitted.task.to_dict())
    except ValidationError as exc:
        found = list(findings(exc.errors(include_url=False), Task))
        shown = "; ".join(f"{'.'.join(map(str, f.loc)) or '(task)'}: {f.message}" for f in found[:MAX_PROBLEMS_SHOWN])
        more = f" (and {len(found) - MAX_PROBLEMS_SHOWN} more)" if len(found) > MAX_PROBLEMS_SHOWN else ""
        raise InvalidTask(f"invalid task: {shown}{more}") from None


def _planned(submitted: TaskSubmitted, world: World, blocks: Sequence[Block] | None = None,
             limit: int | None = PLAN_LIMIT) -> _Planned:
    # Validated on every call, hit or miss: a cached plan is for the same resources, not the same
    # task, and a hit must decide what a miss would (an invalid task is never placed).
    task = valid_task(submitted)
    blocks = initial_blocks(submitted) if blocks is None else list(blocks)
    key = plan_key(submitted, world, blocks) + ((limit,) if limit != PLAN_LIMIT else ())
    hit = _PLAN_CACHE.get(key)
    if hit is not None:
        _PLAN_CACHE.move_to_end(key)
        return hit
    plan = place(task.resource_requests(), submitted.num_nodes, world.catalog, blocks, world.enabled_infras,
                 world.local, limit=limit, kubernetes=world.kubernetes, slurm=world.slurm)
    entry = _PLAN_CACHE[key] = _Planned(plan)
    if len(_PLAN_CACHE) > PLAN_CACHE_SIZE:
        _PLAN_CACHE.popitem(last=False)
    return entry


def plan_for(submitted: TaskSubmitted, world: World, blocks: Sequence[Block] | None = None,
             limit: int | None = PLAN_LIMIT) -> PlacementPlan:
    """The ranked plan for a task, with `blocks` (default: the task's initial blocks) applied."""
    return _planned(submitted, world, blocks, limit).plan


# ---------------------------------------------------------------- a team's workspace
# A team's allowed infras (services/optimizer/workspace.py) narrow the World before ranking (an
# infra) and the candidates after it (a region or zone: then the plan is ranked whole, so a
# region-limited team still gets the cheapest place it may use). No entries: exactly as before.

def workspace_world(world: World, entries: Sequence[workspace.Entry]) -> World | None:
    """The World narrowed to the team's infras; None when none of them is enabled here."""
    if not entries:
        return world
    allowed = workspace.infras_of(entries)
    enabled = frozenset(e for e in world.enabled_infras if workspace.normalize_infra(e) in allowed)
    return dataclasses.replace(world, enabled_infras=enabled) if enabled else None


def _in_workspace(plan: PlacementPlan, entries: Sequence[workspace.Entry]) -> list[Candidate]:
    return [c2 for c in plan.candidates if (c2 := workspace.restrict(entries, c)) is not None]


def _workspace_limit(entries: Sequence[workspace.Entry]) -> int | None:
    return None if workspace.narrows_by_place(entries) else PLAN_LIMIT


def first_placement(submitted: TaskSubmitted, world: World, team: str | None = None,
                    entries: Sequence[workspace.Entry] = (),
                    reservation: ReservationRef | None = None) -> PlacementChosen | PlacementFailed:
    """The first placement; `entries` (the allowed infras of the submitter's `team`) confine it,
    and so does the `reservation` the task was admitted to."""
    try:
        if reservation is not None:
            return _first_in_reservation(submitted, world, team or "", entries, reservation)
        if entries:
            return _first_in_workspace(submitted, world, team or "", entries)
        entry = _planned(submitted, world)
    except InvalidTask as exc:
        return PlacementFailed(task_id=submitted.task_id, cluster=submitted.cluster, reason=str(exc),
                               managed_job_id=submitted.managed_job_id)
    if entry.plan.chosen is None:
        return PlacementFailed(task_id=submitted.task_id, cluster=submitted.cluster,
                               reason=entry.plan.reason or "no feasible placement",
                               managed_job_id=submitted.managed_job_id)
    if entry.head is None:
        entry.head = _event_candidates(entry.plan)
    return _chosen(submitted, entry.head, attempt=1)


def _first_in_workspace(submitted: TaskSubmitted, world: World, team: str,
                        entries: Sequence[workspace.Entry]) -> PlacementChosen | PlacementFailed:
    narrowed = workspace_world(world, entries)
    if narrowed is None:
        why = f"none of them is enabled here (enabled: {', '.join(sorted(world.enabled_infras)) or 'none'})"
        return PlacementFailed(task_id=submitted.task_id, cluster=submitted.cluster,
                               reason=workspace.refusal(team, entries, why), managed_job_id=submitted.managed_job_id)
    plan = _planned(submitted, narrowed, limit=_workspace_limit(entries)).plan
    cands = _in_workspace(plan, entries)
    if not cands:
        why = plan.reason or "no place there fits the task"
        return PlacementFailed(task_id=submitted.task_id, cluster=submitted.cluster,
                               reason=workspace.refusal(team, entries, why), managed_job_id=submitted.managed_job_id)
    return _chosen(submitted, [to_event_candidate(c) for c in cands[:REMAINING_SHOWN + 1]], attempt=1)


def _first_in_reservation(submitted: TaskSubmitted, world: World, team: str, entries: Sequence[workspace.Entry],
                          ref: ReservationRef) -> PlacementChosen | PlacementFailed:
    # The whole plan is ranked (no limit): the reservation's type may not be among the cheapest.
    narrowed = workspace_world(world, entries) if entries else world
    plan = _planned(submitted, narrowed, limit=None).plan if narrowed is not None else None
    cands = _in_workspace(plan, entries) if plan is not None and entries else (plan.candidates if plan else [])
    cands = reserved.within(cands, ref)
    if not cands:
        why = (plan.reason if plan is not None and not plan.candidates else "") or "no candidate is there"
        return PlacementFailed(task_id=submitted.task_id, cluster=submitted.cluster,
                               reason=reserved.refusal(ref, why), managed_job_id=submitted.managed_job_id)
    head = [to_event_candidate(c).model_copy(update={"reservation": ref}) for c in cands[:REMAINING_SHOWN + 1]]
    return _chosen(submitted, head, attempt=1)


def _event_candidates(plan: PlacementPlan) -> list[EventCandidate]:
    """The head of a plan as event candidates."""
    return [_event_candidate(c) for c in plan.candidates[:REMAINING_SHOWN + 1]]


# The event candidates of plan heads, by content: distinct plans share most of their heads
# (placement's memo hands out the same candidates to requests that select the same types), so
# each is converted once. Shared, as a plan cache hit's head already is: nothing changes them.
_EVENT_CANDIDATES: OrderedDict[tuple[Any, ...], EventCandidate] = OrderedDict()
EVENT_CANDIDATES_SIZE = 4096


def _event_candidate(c: Candidate) -> EventCandidate:
    """`to_event_candidate(c)`, remembered by the candidate's content (a value equal to another
    converts to an equal model: validation normalises 4 and 4.0 alike)."""
    accs = c.accelerators
    key = c if accs is None else (*c[:4], tuple(accs.items()), *c[5:])
    try:
        got = _EVENT_CANDIDATES.get(key)
    except TypeError:  # an unhashable value (not placement's own): converted every time
        return to_event_candidate(c)
    if got is None:
        got = _EVENT_CANDIDATES[key] = to_event_candidate(c)
        if len(_EVENT_CANDIDATES) > EVENT_CANDIDATES_SIZE:
            _EVENT_CANDIDATES.popitem(last=False)
    return got


def _chosen(submitted: TaskSubmitted, head: list[EventCandidate], attempt: int) -> PlacementChosen:
    return PlacementChosen(
        task_id=submitted.task_id, cluster=submitted.cluster, attempt=attempt,
        candidate=head[0], remaining=head[1:], num_nodes=submitted.num_nodes,
    )


def block_of(error: CapacityError) -> Block:
    return block_for_error(from_event_candidate(error.candidate), error.error_class, zone=error.candidate.zone)


def after_capacity_error(submitted: TaskSubmitted, errors: Sequence[CapacityError], world: World,
                         team: str | None = None, entries: Sequence[workspace.Entry] = ()
                         ) -> PlacementChosen | PlacementFailed:
    """The next placement after the newest of `errors` (all the task's errors so far, in order),
    within the team's workspace (`entries`) as the first one was."""
    last = errors[-1]
    attempts = [Attempt(candidate=e.candidate, error_class=e.error_class, code=e.code, message=e.message)
                for e in errors]
    if last.attempt >= world.max_attempts:
        return _failed(submitted, attempts, f"gave up after {last.attempt} attempts")
    narrowed = workspace_world(world, entries)
    if narrowed is None:
        return _failed(submitted, attempts, workspace.refusal(team or "", entries, "none of them is enabled here"))
    blocks = initial_blocks(submitted) + [block_of(e) for e in errors]
    try:
        planned = plan_for(submitted, narrowed, blocks, _workspace_limit(entries))
    except InvalidTask as exc:
        return _failed(submitted, attempts, str(exc))
    plan = next_placement(planned, blocks, last=from_event_candidate(last.candidate))
    if entries:
        cands = _in_workspace(plan, entries)
        if not cands:
            return _failed(submitted, attempts, workspace.refusal(team or "", entries,
                                                                  plan.reason or "every place there was tried"))
        return _chosen(submitted, [to_event_candidate(c) for c in cands[:REMAINING_SHOWN + 1]],
                       attempt=last.attempt + 1)
    if plan.chosen is None:
        return _failed(submitted, attempts, plan.reason or "every candidate was tried")
    return _chosen(submitted, _event_candidates(plan), attempt=last.attempt + 1)


def _failed(submitted: TaskSubmitted, attempts: list[Attempt], why: str) -> PlacementFailed:
    lines = [f"{i}) {a.candidate.label()}: {a.code} ({a.error_class}) {a.message}".rstrip()
             for i, a in enumerate(attempts, 1)]
    return PlacementFailed(task_id=submitted.task_id, cluster=submitted.cluster, attempts=attempts,
                           reason=f"{why}; attempts:\n" + "\n".join(lines),
                           managed_job_id=submitted.managed_job_id)


# ---------------------------------------------------------------- admission (dispatch)
# While a dispatch policy is active a TaskSubmitted waits for its TaskAdmitted; with none (the
# default) it is placed at once, exactly as before. Whether one was active is a function of the
# submission's stream sequence and the log's DispatchPolicyApplied events, so the optimizer and
# the dispatch service agree without sharing anything (docs/dispatch.md).

PolicyChanges = Sequence[tuple[int, bool]]  # (stream seq, a policy is active from then on), sorted


def awaits_admission(changes: PolicyChanges, seq: int) -> bool:
    """True when the newest policy change stored before `seq` left a policy active."""
    i = bisect.bisect_left(changes, (seq, False))
    return i > 0 and changes[i - 1][1]


def admitted_world(world: World, infra: str | None) -> World:
    """The world of an admitted task: the flavor's infra only, where it names an enabled one."""
    if infra is None or infra not in world.enabled_infras:
        return world
    return dataclasses.replace(world, enabled_infras=frozenset({infra}))

