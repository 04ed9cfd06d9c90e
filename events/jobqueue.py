"""Queueing a job on a cluster: job ids are allocated by the log itself.

A cluster's job ids are 1, 2, 3 … Whoever queues a job (the provisioner after a launch, the CLI
for `spz exec` or a relaunch on an existing cluster) reads the last JobQueued of the cluster and
appends the next one with optimistic concurrency on that subject: two writers never get the
same id, and the loser simply retries with the next number.
"""

from __future__ import annotations

import asyncio
from typing import Any

from . import naming
from .bus import Bus, ConcurrencyConflict
from .envelope import Envelope
from .job_events import JobQueued
from .principal import stamp


def job_queued_subject(stage: str, cluster: str) -> str:
    return naming.event_subject(stage, "cluster", cluster, JobQueued.EVENT_NAME)


async def queue_job(bus: Bus, *, cluster: str, id: str | None = None, attempts: int = 50,
                    principal: tuple[str, str] | None = None, **fields: Any) -> tuple[JobQueued, Envelope]:
    """Append JobQueued with the next job id of `cluster`. `id` (derived by a handler) makes it
    idempotent: if an event with this id is already in the log, it is returned, not re-queued.
    `principal` (user, team): the caller an API server authenticated, stamped on the envelope."""
    subject = job_queued_subject(bus.stage, cluster)
    for _ in range(attempts):
        last = await bus.last_event(subject)
        if id is not None and last is not None and last.envelope is not None and last.envelope.id == id:
            return last.event, last.envelope  # type: ignore[return-value]
        next_id = (last.event.job_id + 1) if last is not None and last.event is not None else 1
        job = JobQueued(cluster=cluster, job_id=next_id, **fields)
        env = bus.envelope(job, id=id)
        if principal is not None:
            env = stamp(env, *principal)
        try:
            ack = await bus.publish(env, expected_last_seq=last.seq if last else 0, occ_subject=subject)
        except ConcurrencyConflict:
            await asyncio.sleep(0.01)
            continue
        if ack.duplicate:
            # Same id already stored earlier (not the last one): find what it was.
            async for s in bus.replay(filter_subject=subject):
                if s.envelope is not None and s.envelope.id == env.id:
                    return s.event, s.envelope  # type: ignore[return-value]
        return job, env
    raise RuntimeError(f"could not allocate a job id on cluster {cluster!r} after {attempts} attempts")
