"""A cluster as its subject of the log tells it, with who owns it and each of its jobs.

The API server decides on the log as it is this instant (the status service may lag): the
status and the jobs' states come from the one fold (events/fold.py). The owner of a cluster is
the principal of the TaskSubmitted that launched it, and of a job the TaskSubmitted that queued
it (events/principal.py `principal_of`: the API server's stamp, else the event's own fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.cluster_events import ClusterProvisioned
from skypurza.events.fold import ClusterFold, fold_cluster
from skypurza.events.job_events import JobQueued
from skypurza.events.principal import principal_of
from skypurza.events.task_events import TaskSubmitted

Owner = tuple[str, "str | None"]  # (user, team)


@dataclass
class ClusterView:
    name: str
    fold: ClusterFold
    owner: Owner = ("", None)
    use_spot: bool = False
    job_owner: dict[int, Owner] = field(default_factory=dict)
    last_seq: int = 0

    @property
    def status(self) -> str | None:
        return self.fold.status

    @property
    def jobs(self) -> dict[int, Any]:
        return self.fold.current_jobs()


async def task_owner(bus: Bus, task_id: str, fallback: Owner) -> Owner:
    """The principal of the task's TaskSubmitted (`fallback` when the log has none)."""
    stored = await bus.last_event(naming.event_subject(bus.stage, "task", task_id, TaskSubmitted.EVENT_NAME))
    if stored is None or not isinstance(stored.event, TaskSubmitted):
        return fallback
    return principal_of(stored.envelope, stored.event)


async def read_view(bus: Bus, name: str) -> ClusterView:
    events: list[Any] = []
    provisioned: ClusterProvisioned | None = None
    queued: dict[int, JobQueued] = {}
    last = 0
    async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "cluster", name)):
        last = max(last, s.seq)
        if s.event is None:
            continue
        events.append(s.event)
        if isinstance(s.event, ClusterProvisioned):
            provisioned = s.event
        elif isinstance(s.event, JobQueued):
            queued.setdefault(s.event.job_id, s.event)
    view = ClusterView(name, fold_cluster(name, events), last_seq=last)
    owners: dict[str, Owner] = {}

    async def owner_of(task_id: str, fallback: Owner) -> Owner:
        if task_id not in owners:
            owners[task_id] = await task_owner(bus, task_id, fallback)
        return owners[task_id]

    if provisioned is not None:
        view.owner = await owner_of(provisioned.task_id, (provisioned.user, provisioned.team))
        view.use_spot = bool(provisioned.candidate.use_spot)
    for job_id in view.jobs:
        ev = queued[job_id]
        view.job_owner[job_id] = await owner_of(ev.task_id, (ev.user, view.owner[1]))
    return view
