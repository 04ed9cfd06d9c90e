"""What an agent knows about its cluster: a fold of the cluster's events, in log order.

`ClusterView.apply(event, envelope_id, at)` is pure bookkeeping (no I/O, no clock): the agent
replays its cluster's history through it at start, then applies each live event. Every node
folds the same events, so every node reaches the same view.

Event models are lenient (the log keeps old events readable), so the view checks the values it
will act on before it changes anything: an autostop interval no clock can count
(`idle_minutes` past `MAX_COUNTABLE_IDLE_MINUTES`) is refused with `RefusedEvent`, and the agent parks
that event instead of dying on it later. `apply_all_or_nothing` makes any other failure leave
the view as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from skypurza.events.cluster_events import (
    AutostopSet,
    ClusterIdle,
    ClusterProvisioned,
    ClusterStarted,
    ClusterStopped,
    ClusterTerminated,
    DownRequested,
    StopRequested,
)
from skypurza.events.envelope import Event
from skypurza.events.health_events import GpuUnhealthy
from skypurza.events.fold import ClusterStatus, JobFold, cluster_after, cluster_nodes_of, job_after, job_queued
from skypurza.events.job_events import (
    CancelRequested,
    JobCancelled,
    JobFailed,
    JobNodeFinished,
    JobQueued,
    JobStarted,
    JobSucceeded,
)

from .packing import Admission, Capacity, Demand, QueuedJob, admit, capacity_of, demand_of

# The longest autostop interval a clock can count (datetime arithmetic overflows past it). Not
# the user-facing bound (events/limits.MAX_IDLE_MINUTES, a year, checked at the edge): this one
# guards the agent against an event that bypassed the edge.
MAX_COUNTABLE_IDLE_MINUTES = timedelta.max // timedelta(minutes=1)


class RefusedEvent(ValueError):
    """An event whose values the agent cannot act on: it is parked, the view left unchanged."""


def _check_idle_minutes(value: int | None) -> None:
    if value is not None and not -MAX_COUNTABLE_IDLE_MINUTES <= value <= MAX_COUNTABLE_IDLE_MINUTES:
        raise RefusedEvent(f"idle_minutes {value} is out of range (at most {MAX_COUNTABLE_IDLE_MINUTES})")


@dataclass
class NodeReport:
    rank: int
    phase: str
    exit_code: int


@dataclass
class JobView:
    job_id: int
    queued: JobQueued
    queued_id: str  # envelope id of the JobQueued: the cause of everything agents publish for it
    queued_at: datetime
    started: bool = False
    cancel_requested: bool = False
    reports: list[NodeReport] = field(default_factory=list)  # JobNodeFinished, in log order
    state: JobFold | None = None  # the job's state from the one fold (events/fold.py)
    gpu_indices: tuple[int, ...] | None = None  # as the first JobStarted recorded them (packing.py)

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = job_queued(self.queued)

    @property
    def status(self) -> str | None:
        """None while the job runs; its final status (SUCCEEDED, FAILED_SETUP, ...) once ended."""
        assert self.state is not None
        return self.state.status if self.state.terminal else None

    @property
    def terminal(self) -> bool:
        assert self.state is not None
        return self.state.terminal

    @property
    def num_nodes(self) -> int:
        assert self.state is not None
        return self.state.num_nodes

    def report(self, rank: int, phase: str) -> NodeReport | None:
        for r in self.reports:
            if r.rank == rank and r.phase == phase:
                return r
        return None

    def reported_ranks(self, phase: str) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.reports:
            if r.phase == phase:
                out.setdefault(r.rank, r.exit_code)
        return out

    def first_failure(self) -> NodeReport | None:
        for r in self.reports:
            if r.exit_code != 0:
                return r
        return None


@dataclass
class ClusterView:
    cluster: str
    num_nodes: int
    provisioned: ClusterProvisioned | None = None
    jobs: dict[int, JobView] = field(default_factory=dict)
    idle_minutes: int | None = None
    idle_down: bool = False
    idle_wait_for: str = "jobs_and_ssh"  # AutostopSet.wait_for; "none": jobs neither reset nor hold the timer
    # The event that last reset the idle timer (its id keys the one ClusterIdle of that period).
    activity_at: datetime | None = None
    activity_id: str = ""
    idle_reported_for: str = ""  # activity_id a ClusterIdle was seen for
    status: ClusterStatus | None = None  # from the one fold (events/fold.py)
    down_requested: bool = False
    last_seq: int = 0
    # Ranks with a fatal GpuUnhealthy in this lifetime, and why: the cluster is drained (its
    # running jobs go on or are recovered; nothing new is admitted) until it is provisioned or started again.
    drained: dict[int, str] = field(default_factory=dict)

    @property
    def stopped(self) -> bool:
        return self.status == "STOPPED"

    @property
    def terminated(self) -> bool:
        return self.status == "TERMINATED"

    # ------------------------------------------------------------------ folding

    def apply_all_or_nothing(self, event: Event, envelope_id: str, at: datetime, seq: int = 0) -> None:
        """`apply`, except that an event that raises leaves the view as it was (then re-raises)."""
        saved = dict(self.__dict__)
        job_id = getattr(event, "job_id", None)
        job = self.jobs.get(job_id) if isinstance(job_id, int) else None
        saved_job = (dict(job.__dict__), list(job.reports)) if job is not None else None
        new_job = isinstance(job_id, int) and job is None
        try:
            self.apply(event, envelope_id, at, seq)
        except Exception:
            self.__dict__.update(saved)
            if job is not None and saved_job is not None:
                job.__dict__.update(saved_job[0])
                job.reports[:] = saved_job[1]
            if new_job:
                self.jobs.pop(job_id, None)  # type: ignore[arg-type]
            raise

    def apply(self, event: Event, envelope_id: str, at: datetime, seq: int = 0) -> None:
        if isinstance(event, (ClusterProvisioned, AutostopSet)):
            _check_idle_minutes(event.idle_minutes)
        if seq:
            self.last_seq = max(self.last_seq, seq)
        self.status = cluster_after(self.status, event)
        if isinstance(event, ClusterProvisioned):
            self.provisioned = event
            self.num_nodes = cluster_nodes_of(event) or self.num_nodes
            if event.idle_minutes is not None:
                self.idle_minutes, self.idle_down = event.idle_minutes, event.down_when_idle
            self.idle_wait_for = "jobs_and_ssh"  # a new cluster: the task's autostop, not an old AutostopSet's
            self.down_requested = False
            self.drained = {}
            self._activity(at, envelope_id)
        elif isinstance(event, GpuUnhealthy):
            if event.severity == "fatal":
                self.drained = {**self.drained, event.rank: event.detail or event.rule}
        elif isinstance(event, ClusterStarted):
            self.drained = {}  # a started instance is on a new host (EC2 start): its GPUs are others
            self._activity(at, envelope_id)
        elif isinstance(event, AutostopSet):
            self.idle_minutes, self.idle_down = event.idle_minutes, event.down
            self.idle_wait_for = getattr(event, "wait_for", "jobs_and_ssh")
            self._activity(at, envelope_id)
        elif isinstance(event, ClusterIdle):
            self.idle_reported_for = self.activity_id
        elif isinstance(event, (ClusterStopped, ClusterTerminated)):
            pass  # the status above
        elif isinstance(event, (DownRequested, StopRequested)):
            if isinstance(event, DownRequested):
                self.down_requested = True
        elif isinstance(event, JobQueued):
            if event.job_id not in self.jobs:
                self.jobs[event.job_id] = JobView(event.job_id, event, envelope_id, at)
            self._activity(at, envelope_id, job=True)
        else:
            self._apply_job(event, envelope_id, at)

    def _apply_job(self, event: Event, envelope_id: str, at: datetime) -> None:
        job_id = getattr(event, "job_id", None)
        job = self.jobs.get(job_id) if isinstance(job_id, int) else None
        if job is None:
            return
        was_terminal = job.terminal
        assert job.state is not None
        job.state = job_after(job.state, event, self.num_nodes)
        if isinstance(event, JobStarted):
            if not job.started and event.gpu_indices is not None:
                job.gpu_indices = tuple(event.gpu_indices)  # the first start's, for good
            job.started = True
        elif isinstance(event, JobNodeFinished):
            if job.report(event.rank, event.phase) is None:
                job.reports.append(NodeReport(event.rank, event.phase, event.exit_code))
        elif isinstance(event, CancelRequested):
            job.cancel_requested = True
        elif isinstance(event, (JobSucceeded, JobFailed, JobCancelled)) and not was_terminal:
            self._activity(at, envelope_id, job=True)

    def _activity(self, at: datetime, envelope_id: str, *, job: bool = False) -> None:
        if job and self.idle_wait_for == "none":
            return  # a hard limit: the timer runs from the AutostopSet, whatever the jobs do
        self.activity_at, self.activity_id = at, envelope_id

    # ------------------------------------------------------------------ reading

    def current_job(self) -> JobView | None:
        """The oldest job that has not ended."""
        for job_id in sorted(self.jobs):
            if not self.jobs[job_id].terminal:
                return self.jobs[job_id]
        return None

    def busy(self) -> bool:
        return self.current_job() is not None

    def capacity(self) -> Capacity:
        """One node's resources, as the cluster was provisioned (packing.py)."""
        return capacity_of(self.provisioned.candidate if self.provisioned else None, self.num_nodes)

    def demand(self, job: JobView) -> Demand:
        return demand_of(job.queued.task, self.capacity())

    def admissions(self) -> list[Admission]:
        """The jobs that start now (FIFO, packed by their resources: packing.py), from log facts
        only — JobQueued order, JobStarted, the ends — so every node derives the same answer.
        A job that will never run (cancelled before it started, more nodes than the cluster
        has) is not in the queue: the head ends it (decide.job_outcome)."""
        capacity = self.capacity()
        queue = [QueuedJob(j.job_id, demand_of(j.queued.task, capacity), j.started, j.gpu_indices)
                 for _, j in sorted(self.jobs.items())
                 if not j.terminal and (j.started or not (j.cancel_requested or j.num_nodes > self.num_nodes
                                                          or self.drained))]
        return admit(capacity, queue)

    def placed_accelerators(self) -> dict[str, float] | None:
        if self.provisioned is None:
            return None
        return self.provisioned.candidate.accelerators

    def summary(self) -> dict[str, Any]:
        return {"jobs": {j: (v.status or ("running" if v.started else "pending")).lower() for j, v in self.jobs.items()},
                "idle_minutes": self.idle_minutes, "stopped": self.stopped, "terminated": self.terminated}
