"""Submitting and cancelling managed jobs (what `spz jobs launch|cancel` publish), and reading
the jobs back from the log.

Submitting (the id allocated by the log) lives in events/managed_submit.py, shared with the API
server; it is re-exported here for the CLI's callers.
"""

from __future__ import annotations

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.managed_events import ManagedJobCancelRequested
from skypurza.events.managed_submit import managed_task_id, submit_managed_job, submitted_subject

from . import machine
from .history import history

__all__ = ["managed_task_id", "read_jobs", "request_cancel", "submit_managed_job", "submitted_subject"]


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
