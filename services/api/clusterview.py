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
from skypurza.events.addresses import head_ip, task_ports
from skypurza.events.bus import Bus
from skypurza.events.cluster_events import AutostopSet, ClusterProvisioned, ClusterStarted
from skypurza.events.clusterfit import ClusterShape
from skypurza.events.fold import ClusterFold, fold_cluster
from skypurza.events.job_events import JobQueued
from skypurza.events.principal import principal_of, stamped_principal
from skypurza.events.queueplan import SetUp
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
    # What queueing a job on it decides with (events/queueplan.py): where it is and what each
    # node has, what its nodes were set up with, its autostop interval now.
    shape: ClusterShape | None = None
    set_up: SetUp = SetUp(ran=False)
    idle_minutes: int | None = None
    head_ip: str | None = None  # rank 0's address (`spz status --ip`, events/addresses.py)
    ports: tuple[str, ...] = ()  # the launching task's resources.ports (`spz status --endpoints`)

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
    queued_by: dict[int, Owner] = {}  # a job an API server queued itself (spz exec): its stamp
    idle: int | None = None
    head: str | None = None
    ports: tuple[str, ...] = ()
    last = 0
    async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "cluster", name)):
        last = max(last, s.seq)
        if s.event is None:
            continue
        events.append(s.event)
        if isinstance(s.event, ClusterProvisioned):
            provisioned = s.event
            idle, head, ports = s.event.idle_minutes, head_ip(s.event.nodes), ()
        elif isinstance(s.event, ClusterStarted) and s.event.nodes:
            head = head_ip(s.event.nodes) or head  # a started instance may have a new address
        elif isinstance(s.event, AutostopSet):
            idle = s.event.idle_minutes
        elif isinstance(s.event, JobQueued) and s.event.job_id not in queued:
            queued[s.event.job_id] = s.event
            if provisioned is not None and s.event.task_id == provisioned.task_id:
                ports = task_ports(s.event.task)
            stamped = stamped_principal(s.envelope) if s.envelope is not None else None
            if stamped is not None:
                queued_by[s.event.job_id] = stamped
    view = ClusterView(name, fold_cluster(name, events), last_seq=last, idle_minutes=idle, head_ip=head,
                       ports=ports)
    owners: dict[str, Owner] = {}

    async def owner_of(task_id: str, fallback: Owner) -> Owner:
        if task_id not in owners:
            owners[task_id] = await task_owner(bus, task_id, fallback)
        return owners[task_id]

    if provisioned is not None:
        view.owner = await owner_of(provisioned.task_id, (provisioned.user, provisioned.team))
        view.use_spot = bool(provisioned.candidate.use_spot)
        view.shape = ClusterShape.of_provisioned(provisioned)
    for job_id in view.jobs:
        ev = queued[job_id]
        view.job_owner[job_id] = await owner_of(ev.task_id, queued_by.get(job_id, (ev.user, view.owner[1])))
    ran = [j for j in sorted(view.jobs) if queued[j].run_setup]
    if ran:
        view.set_up = SetUp(ran=True, setup=queued[ran[-1]].task.setup)
    return view
