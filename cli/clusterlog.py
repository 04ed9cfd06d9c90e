"""A cluster and its jobs as the event log tells them, read by the CLI itself.

The status service's projections answer `spz status` and `spz queue`; the commands that act on a
cluster (launch on an existing cluster, exec, logs, cancel) read the cluster's own events
instead, so they decide on the log as it is this instant, even while the status service catches up.
`fold()` is pure; `read_cluster()` replays one cluster's subject.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

from skypurza.events import fold as one_fold
from skypurza.events.addresses import head_ip, task_ports
from skypurza.events.cluster_events import (
    AutostopSet,
    ClusterProvisioned,
    ClusterStarted,
    NodeReady,
)
from skypurza.events.fold import (  # noqa: F401  (the names cli code imports from here)
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_NOT_FINISHED,
    EXIT_NOT_FOUND,
    EXIT_SUCCEEDED,
    JobFold,
    exit_code_of,
)
from skypurza.events.job_events import JobNodeFinished, JobQueued
from skypurza.events.jobdemand import describe_task

# The final job states, as `spz queue --skip-finished` filters them (events/fold.py decides).
TERMINAL_JOB = one_fold.JOB_TERMINAL_SQL


@dataclass
class Job:
    """A job as the CLI shows it: what JobQueued said, and its state from the one fold."""

    job_id: int
    task_id: str
    name: str | None
    user: str
    run_setup: bool
    setup: str | None
    submitted_at: datetime
    state: JobFold
    cluster_nodes: int = 1  # the nodes setup runs on (every node of the cluster)
    resources: str | None = None  # what it asked per node (events/jobdemand.py), as `spz queue` shows it
    # (rank, phase) of every JobNodeFinished, late ones too: an agent stores a phase's last output
    # chunk before it reports the phase, so a reported phase's output is all in the logs stream.
    reported: set[tuple[int, str]] = field(default_factory=set)

    @property
    def num_nodes(self) -> int:
        return self.state.num_nodes

    @property
    def status(self) -> str:  # PENDING, SETTING_UP, RUNNING, then one of TERMINAL_JOB
        return self.state.status

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def started_at(self) -> datetime | None:
        return self.state.started_at

    @property
    def ended_at(self) -> datetime | None:
        return self.state.ended_at

    @property
    def exit_code(self) -> int | None:
        return self.state.exit_code

    @property
    def failed_rank(self) -> int | None:
        return self.state.failed_rank

    @property
    def reason(self) -> str:
        return self.state.reason

    @property
    def cancel_requested(self) -> bool:
        return self.state.cancel_requested

    @property
    def setup_done(self) -> frozenset[int]:
        return self.state.setup_done

    def as_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "name": self.name, "user": self.user, "status": self.status,
                "task_id": self.task_id, "num_nodes": self.num_nodes,
                "submitted_at": self.submitted_at.isoformat(),
                "started_at": self.started_at.isoformat() if self.started_at else None,
                "ended_at": self.ended_at.isoformat() if self.ended_at else None,
                "exit_code": self.exit_code, "failed_rank": self.failed_rank, "reason": self.reason or None,
                "resources": self.resources}


@dataclass
class Cluster:
    name: str
    status: str | None = None  # None: never provisioned (or not yet); INIT (a node lost), UP, STOPPED, TERMINATED
    num_nodes: int = 0
    infra: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    use_spot: bool = False
    accelerators: dict[str, float] | None = None
    vcpus: float | None = None  # per node, as placed (None: not known)
    memory_gib: float | None = None
    hourly_price_micros: int = 0  # per node
    launched_at: datetime | None = None
    user: str = ""
    idle_minutes: int | None = None
    idle_down: bool = False
    task_id: str | None = None
    head_ip: str | None = None  # rank 0's public address, else its private one (`status --ip`)
    ports: tuple[str, ...] = ()  # the launching task's resources.ports (`status --endpoints`)
    jobs: dict[int, Job] = field(default_factory=dict)
    ready_ranks: set[int] = field(default_factory=set)
    last_seq: int = 0

    @property
    def exists(self) -> bool:
        return self.status in one_fold.CLUSTER_LIVE

    def last_job(self) -> Job | None:
        return self.jobs[max(self.jobs)] if self.jobs else None

    def last_setup(self) -> Job | None:
        """The last job that ran setup: what the nodes were set up with (exec never runs setup)."""
        ran = [j for j in self.jobs.values() if j.run_setup]
        return max(ran, key=lambda j: j.job_id) if ran else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "status": self.status, "infra": self.infra, "region": self.region, "zone": self.zone,
            "instance_type": self.instance_type, "num_nodes": self.num_nodes, "use_spot": self.use_spot,
            "accelerators": self.accelerators,
            "hourly_price_micros": self.hourly_price_micros,  # per node, as the status service has it
            "launched_at": self.launched_at.isoformat() if self.launched_at else None, "user": self.user,
            "autostop": self.idle_minutes, "autodown": self.idle_down, "market": "spot" if self.use_spot else "on-demand",
        }


def fold(name: str, events: Iterable[tuple[Any, datetime, int]]) -> Cluster:
    """Replay (event, envelope time, seq) of one cluster's subject, oldest first."""
    c = Cluster(name)
    for event, at, seq in events:
        c.last_seq = max(c.last_seq, seq)
        apply(c, event, at)
    return c


def apply(c: Cluster, event: Any, at: datetime) -> None:
    """One event of the cluster's subject: the status and the jobs' states from the one fold
    (events/fold.py), the rest is what the CLI shows."""
    if isinstance(event, ClusterProvisioned):
        cand = event.candidate
        if c.status == "TERMINATED":
            c.jobs = {}  # a new cluster under an old name: the old one's jobs are history
        c.num_nodes = one_fold.cluster_nodes_of(event)
        c.infra, c.region, c.zone = cand.infra, cand.region, cand.zone
        c.instance_type, c.use_spot, c.accelerators = cand.instance_type, cand.use_spot, cand.accelerators
        c.vcpus, c.memory_gib = cand.vcpus, cand.memory_gib
        c.hourly_price_micros, c.launched_at, c.user = event.hourly_price_micros, event.launched_at, event.user
        c.idle_minutes, c.idle_down, c.task_id = event.idle_minutes, event.down_when_idle, event.task_id
        c.ready_ranks = set()
        c.head_ip, c.ports = _head_ip(event.nodes), ()
    elif isinstance(event, ClusterStarted) and event.nodes:
        c.head_ip = _head_ip(event.nodes) or c.head_ip  # a started instance may have a new address
    c.status = one_fold.cluster_after(c.status, event)
    if isinstance(event, NodeReady):
        c.ready_ranks.add(event.rank)
    elif isinstance(event, AutostopSet):
        c.idle_minutes, c.idle_down = event.idle_minutes, event.down
    elif isinstance(event, JobQueued):
        if event.job_id in c.jobs:
            return  # the first JobQueued of an id is the job (ids are allocated once)
        if event.task_id == c.task_id:
            c.ports = _ports_of(event.task)
        c.jobs[event.job_id] = Job(event.job_id, event.task_id, event.name or event.task.name, event.user,
                                   event.run_setup, event.task.setup, at, one_fold.job_queued(event),
                                   max(c.num_nodes, 1), describe_task(event.task))
    else:
        job = c.jobs.get(getattr(event, "job_id", -1))
        if job is not None:
            job.cluster_nodes = max(c.num_nodes, 1)
            job.state = one_fold.job_after(job.state, event, job.cluster_nodes)
            if isinstance(event, JobNodeFinished):
                job.reported.add((event.rank, event.phase))


_head_ip = head_ip  # (the names this module used; events/addresses.py is the one copy)
_ports_of = task_ports


# Event types on a cluster's subject that say nothing of its state or its jobs: the server skips
# them, so a read of the cluster does not grow with its age (a metering tick per node per minute).
NOT_CLUSTER_STATE = frozenset({"usage_recorded"})


def cluster_state_subjects(stage: str, name: str) -> list[str]:
    """One subject per event type of the cluster aggregate that the fold reads (every registered
    one but NOT_CLUSTER_STATE); a type this CLI does not know could not be folded anyway."""
    from skypurza.events import naming
    from skypurza.events.modeltable import names_of_aggregate  # from the table: no model is built

    return [naming.event_filter(stage, "cluster", n, aggregate_id=name)
            for n in names_of_aggregate("cluster") if n not in NOT_CLUSTER_STATE]


async def read_cluster(bus: Any, name: str) -> Cluster:
    items = []
    async for s in bus.replay(filter_subjects=cluster_state_subjects(bus.stage, name)):
        if s.event is not None and s.envelope is not None:
            if getattr(s.event, "EVENT_NAME", "") in NOT_CLUSTER_STATE:
                continue
            items.append((s.event, s.envelope.time, s.seq))
    return fold(name, items)


async def cluster_names(bus: Any) -> list[str]:
    """Every cluster the log has provisioned (then `read_cluster` tells which still exist)."""
    from skypurza.events import naming

    names: list[str] = []
    subject = naming.event_filter(bus.stage, "cluster", "cluster_provisioned")
    async for s in bus.replay(filter_subject=subject):
        if s.event is not None and s.event.cluster not in names:
            names.append(s.event.cluster)
    return names
