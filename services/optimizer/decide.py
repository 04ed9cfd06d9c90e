"""The optimizer's decisions as pure functions of a task's history (no bus, no clock).

Eats: TaskSubmitted (first placement) and the task's CapacityErrors (failover).
Gives: PlacementChosen (attempt n, the candidate, the ranked remainder) or PlacementFailed.

Nothing is remembered between calls: the blocks of a task are the CapacityErrors in its own
history, so an optimizer restarted mid-failover decides exactly what it would have decided.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from skypurza.events.models import CapacityError, PlacementChosen, PlacementFailed, TaskSubmitted
from skypurza.events.types import Attempt
from skypurza.events.types import Candidate as EventCandidate

from .catalog import Catalog
from .local import LocalResources
from .placement import Block, Candidate, PlacementPlan, block_for_error, next_placement, place

MAX_ATTEMPTS = int(os.environ.get("SKYPURZA_MAX_PLACEMENT_ATTEMPTS", "64"))
REMAINING_SHOWN = 10
# Candidates ranked per request (exactly the best ones; see placement.place's `limit`): blocks
# are applied before ranking, so after any number of failures the next choice is still exact.
PLAN_LIMIT = 32


@dataclass(frozen=True)
class World:
    """What the optimizer knows besides the task: prices and where it may place."""

    catalog: Catalog
    enabled_infras: frozenset[str]
    local: LocalResources | None = None


def to_event_candidate(c: Candidate) -> EventCandidate:
    """A placement candidate as the events carry it; on-demand candidates get a zone pinned
    (the cheapest allowed one) so that a capacity error blocks a zone, not the region."""
    zone = c.zone or (c.zones[0] if c.zones else None)
    return EventCandidate(
        infra=c.infra, region=c.region, zone=zone, zones=list(c.zones), instance_type=c.instance_type,
        accelerators=c.accelerators, use_spot=c.use_spot, vcpus=c.vcpus, memory_gib=c.memory_gib,
        hourly_price_micros=c.hourly_price_micros, num_nodes=c.num_nodes, image_id=c.image_id,
        disk_size_gb=c.disk_size_gb,
    )


def from_event_candidate(c: EventCandidate) -> Candidate:
    return Candidate.from_dict(c.model_dump())


# Placement is a pure function of (resources, nodes, blocks, world): equal requests (the 200
# copies of one managed job, a sweep) are placed once. Keyed by content, bounded in size.
_PLAN_CACHE: OrderedDict[tuple[Any, ...], PlacementPlan] = OrderedDict()
PLAN_CACHE_SIZE = 512


def plan_for(submitted: TaskSubmitted, world: World, blocks: Sequence[Block] | None = None) -> PlacementPlan:
    """The ranked plan for a task, with `blocks` (default: the task's initial blocks) applied."""
    blocks = [Block.from_dict(b) for b in submitted.initial_blocks] if blocks is None else list(blocks)
    key = (id(world.catalog), world.enabled_infras, repr(world.local),
           json.dumps(submitted.task.get("resources"), sort_keys=True, default=str),
           submitted.num_nodes, json.dumps([b.to_dict() for b in blocks], sort_keys=True, default=str))
    plan = _PLAN_CACHE.get(key)
    if plan is not None:
        _PLAN_CACHE.move_to_end(key)
        return plan
    from skypurza.events.taskspec.task import Task

    task = Task.from_public_dict(submitted.task)
    plan = place(task.resource_requests(), submitted.num_nodes, world.catalog, blocks, world.enabled_infras,
                 world.local, limit=PLAN_LIMIT)
    _PLAN_CACHE[key] = plan
    if len(_PLAN_CACHE) > PLAN_CACHE_SIZE:
        _PLAN_CACHE.popitem(last=False)
    return plan


def first_placement(submitted: TaskSubmitted, world: World) -> PlacementChosen | PlacementFailed:
    plan = plan_for(submitted, world)
    if plan.chosen is None:
        return PlacementFailed(task_id=submitted.task_id, cluster=submitted.cluster,
                               reason=plan.reason or "no feasible placement",
                               managed_job_id=submitted.managed_job_id)
    return _chosen(submitted, plan, attempt=1)


_EVENT_CANDIDATES: dict[int, tuple[PlacementPlan, list[EventCandidate]]] = {}


def _event_candidates(plan: PlacementPlan) -> list[EventCandidate]:
    """The head of a plan as event candidates (converted once per cached plan)."""
    hit = _EVENT_CANDIDATES.get(id(plan))
    if hit is not None and hit[0] is plan:
        return hit[1]
    converted = [to_event_candidate(c) for c in plan.candidates[:REMAINING_SHOWN + 1]]
    if len(_EVENT_CANDIDATES) > PLAN_CACHE_SIZE * 2:
        _EVENT_CANDIDATES.clear()
    _EVENT_CANDIDATES[id(plan)] = (plan, converted)
    return converted


def _chosen(submitted: TaskSubmitted, plan: PlacementPlan, attempt: int) -> PlacementChosen:
    assert plan.chosen is not None
    head = _event_candidates(plan)
    return PlacementChosen(
        task_id=submitted.task_id, cluster=submitted.cluster, attempt=attempt,
        candidate=head[0], remaining=head[1:], num_nodes=submitted.num_nodes,
    )


def block_of(error: CapacityError) -> Block:
    return block_for_error(from_event_candidate(error.candidate), error.error_class, zone=error.candidate.zone)


def after_capacity_error(submitted: TaskSubmitted, errors: Sequence[CapacityError], world: World
                         ) -> PlacementChosen | PlacementFailed:
    """The next placement after the newest of `errors` (all the task's errors so far, in order)."""
    last = errors[-1]
    attempts = [Attempt(candidate=e.candidate, error_class=e.error_class, code=e.code, message=e.message)
                for e in errors]
    if last.attempt >= MAX_ATTEMPTS:
        return _failed(submitted, attempts, f"gave up after {last.attempt} attempts")
    blocks = [Block.from_dict(b) for b in submitted.initial_blocks] + [block_of(e) for e in errors]
    plan = next_placement(plan_for(submitted, world, blocks), blocks, last=from_event_candidate(last.candidate))
    if plan.chosen is None:
        return _failed(submitted, attempts, plan.reason or "every candidate was tried")
    return _chosen(submitted, plan, attempt=last.attempt + 1)


def _failed(submitted: TaskSubmitted, attempts: list[Attempt], why: str) -> PlacementFailed:
    lines = [f"{i}) {a.candidate.label()}: {a.code} ({a.error_class}) {a.message}".rstrip()
             for i, a in enumerate(attempts, 1)]
    return PlacementFailed(task_id=submitted.task_id, cluster=submitted.cluster, attempts=attempts,
                           reason=f"{why}; attempts:\n" + "\n".join(lines),
                           managed_job_id=submitted.managed_job_id)


# ---------------------------------------------------------------- which infras are enabled

def aws_credentials_present(env: dict[str, str] | None = None, home: Path | None = None) -> bool:
    """A cheap check (no network, no boto3 import): are there AWS credentials to try?

    `spz check` makes the real call; placement only needs to know whether AWS is configured.
    """
    env = dict(os.environ) if env is None else env
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return True
    if env.get("AWS_PROFILE") or env.get("AWS_WEB_IDENTITY_TOKEN_FILE") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        return True
    aws_dir = Path(env.get("HOME", str(home or Path.home()))) / ".aws"
    return (aws_dir / "credentials").exists() or (aws_dir / "config").exists()


def enabled_infras(allowed: Iterable[str] | None = None, env: dict[str, str] | None = None) -> frozenset[str]:
    """SKYPURZA_ENABLED_INFRAS wins; else AWS when credentials are present, and `local` only while
    no cloud is enabled (or when `allowed_infras` in the config names it)."""
    from .placement import default_enabled_infras

    env = dict(os.environ) if env is None else env
    forced = env.get("SKYPURZA_ENABLED_INFRAS")
    if forced:
        return frozenset(x.strip().lower() for x in forced.split(",") if x.strip())
    clouds = ["aws"] if aws_credentials_present(env) else []
    return default_enabled_infras(clouds, allowed)
