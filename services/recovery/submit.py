"""Submitting and cancelling managed jobs (what `spz jobs launch|cancel` publish), and reading
the jobs back from the log.

Managed job ids are 1, 2, 3 ... allocated by the log itself: read the newest
ManagedJobSubmitted, append the next one with optimistic concurrency on that subject filter.
Two submitters never get the same id; the loser retries (with a little jitter, so that a
burst of submitters does not collide in lock step).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus, ConcurrencyConflict
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.managed_events import JobGroupMember, ManagedJobCancelRequested, ManagedJobSubmitted
from skypurza.events.payloads import ManagedTask

from . import machine
from .history import history


def managed_task_id(submitted_at: datetime, dag_name: str, job_id: int, task_index: int,
                    task_name: str | None = None) -> str:
    """SKYPILOT_TASK_ID of a managed job's task: `sky-managed-<ts>_<dag>[_<task>]_<id>-<idx>`
    (../shared/reference/skypilot-contract.md §2); the same on every recovery."""
    ts = submitted_at.astimezone(timezone.utc).strftime("%Y-%m-%d-%H-%M-%S-%f")
    name = dag_name if not task_name or task_name == dag_name else f"{dag_name}_{task_name}"
    return f"sky-managed-{ts}_{name}_{job_id}-{task_index}"


def submitted_subject(stage: str) -> str:
    return naming.event_filter(stage, "mjob", ManagedJobSubmitted.EVENT_NAME)


async def submit_managed_job(bus: Bus, *, name: str, tasks: Sequence[ManagedTask | dict[str, Any]], user: str = "",
                             team: str | None = None, project: str | None = None,
                             secrets: list[dict[str, str]] | None = None, attempts: int = 2000,
                             clock: Clock = SYSTEM_CLOCK, job_rank: int = 0, num_jobs: int = 1,
                             group: JobGroupMember | None = None) -> ManagedJobSubmitted:
    """Append ManagedJobSubmitted with the next managed job id. `secrets[i]` are task i's secret
    values: they go to the secrets store (never the log) under `<key>-<i>`. The submission time
    (in the tasks' SKYPILOT_TASK_IDs and the envelope) is `clock.now()`.

    `job_rank`/`num_jobs`: its place in a `--num-jobs` fan-out. `group`: its place in a job
    group; a `root_job_id` of 0 makes it the group's root (its own id is the group's), and a
    member's SKYPILOT_TASK_ID is the group's (`<group>_<task>_<root id>-<index>`)."""
    if not 0 <= job_rank < num_jobs:
        raise ValueError(f"job rank {job_rank} is not in 0..{num_jobs - 1}")
    entries = [ManagedTask.model_validate(t) for t in tasks]  # a bad task is refused before an id is taken
    if not entries:
        raise ValueError("a managed job needs at least one task")
    secrets_key: str | None = None
    if secrets and any(secrets):
        secrets_key = str(uuid.uuid4())
        for i, values in enumerate(secrets):
            if values:
                await bus.put_secrets(f"{secrets_key}-{i}", dict(values))
    subject = submitted_subject(bus.stage)
    for attempt in range(attempts):
        last = await bus.last_event(subject)
        job_id = (last.event.managed_job_id + 1) if last is not None and isinstance(last.event, ManagedJobSubmitted) \
            else 1
        now = clock.now()
        member = group.model_copy(update={"root_job_id": job_id}) if group and group.root_job_id <= 0 else group
        if member is not None:
            ids = [managed_task_id(now, member.name, member.root_job_id, member.index, t.name) for t in entries]
        else:
            ids = [managed_task_id(now, name, job_id, i, t.name) for i, t in enumerate(entries)]
        event = ManagedJobSubmitted(managed_job_id=job_id, name=name, tasks=entries, user=user, team=team,
                                    project=project, skypilot_task_ids=ids, secrets_key=secrets_key,
                                    job_rank=job_rank, num_jobs=num_jobs, group=member)
        env = bus.envelope(event, time=now)
        try:
            await bus.publish(env, expected_last_seq=last.seq if last is not None else 0, occ_subject=subject)
            return event
        except ConcurrencyConflict:
            await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
    raise RuntimeError(f"could not allocate a managed job id after {attempts} attempts")


async def request_cancel(bus: Bus, job_id: int, requested_by: str = "") -> bool:
    """Ask for a job to be cancelled; False when it does not exist or has ended already."""
    states = await read_jobs(bus, [job_id])
    state = states.get(job_id)
    if state is None or state.terminal:
        return False
    await bus.publish(ManagedJobCancelRequested(managed_job_id=job_id, requested_by=requested_by))
    return True


async def read_jobs(bus: Bus, job_ids: list[int] | None = None) -> dict[int, machine.JobState]:
    """Managed jobs as the log says they are now (a fold of their `mjob` events)."""
    out: dict[int, machine.JobState] = {}
    subjects = ([naming.aggregate_subjects(bus.stage, "mjob", str(j)) for j in job_ids] if job_ids
                else [naming.aggregate_events_subject(bus.stage, "mjob")])
    for subject in subjects:
        if await bus.last_event(subject) is None:
            continue
        # One job: a few gets, no consumer. Every job: one replay.
        events = history(bus, subject) if job_ids else bus.replay(filter_subject=subject)
        async for s in events:
            job_id = getattr(s.event, "managed_job_id", None)
            if s.event is None or job_id is None:
                continue
            state = machine.apply(out.get(job_id), s.event, s.seq, s.envelope.time if s.envelope else s.timestamp)
            if state is not None:
                out[job_id] = state
    return out
