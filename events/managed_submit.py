"""Submitting a managed job: ManagedJobSubmitted with the next managed job id, allocated by the log.

Managed job ids are 1, 2, 3 ... allocated by the log itself: read the newest
ManagedJobSubmitted, append the next one with optimistic concurrency on that subject filter.
Two submitters never get the same id; the loser retries (with a little jitter, so that a
burst of submitters does not collide in lock step). Here, not in the recovery service, because
both the CLI (`spz jobs launch`) and the API server (`POST /api/v1/jobs`) submit, and a service
never imports another.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from . import naming
from .bus import Bus, ConcurrencyConflict
from .clock import SYSTEM_CLOCK, Clock
from .managed_events import JobGroupMember, ManagedJobSubmitted
from .payloads import ManagedTask
from .principal import stamp


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
                             group: JobGroupMember | None = None,
                             stamped: tuple[str, str] | None = None) -> ManagedJobSubmitted:
    """Append ManagedJobSubmitted with the next managed job id. `secrets[i]` are task i's secret
    values: they go to the secrets store (never the log) under `<key>-<i>`. The submission time
    (in the tasks' SKYPILOT_TASK_IDs and the envelope) is `clock.now()`.

    `job_rank`/`num_jobs`: its place in a `--num-jobs` fan-out. `group`: its place in a job
    group; a `root_job_id` of 0 makes it the group's root (its own id is the group's), and a
    member's SKYPILOT_TASK_ID is the group's (`<group>_<task>_<root id>-<index>`). `stamped`: the
    (user, team) an API server authenticated, put on the envelope (events/principal.py)."""
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
        if stamped is not None:
            env = stamp(env, *stamped)
        try:
            await bus.publish(env, expected_last_seq=last.seq if last is not None else 0, occ_subject=subject)
            return event
        except ConcurrencyConflict:
            await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
    raise RuntimeError(f"could not allocate a managed job id after {attempts} attempts")
