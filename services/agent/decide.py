"""What a node agent does next: pure decisions from the cluster view and the node's own state.

`decide(view, rank, local, now)` returns the actions to take, in order. The agent calls it
after every event it reads, every process exit and every tick; doing an action changes the
local state (or publishes an event that comes back through the view), so calling it again
gives the next step. Nothing here does I/O or reads a clock.

Rules (several jobs at once per cluster, admitted FIFO while their resources fit: packing.py):
- the head (rank 0) admits jobs (`ClusterView.admissions`, from log facts only) and publishes
  each one's JobStarted with its GPU indices; every node, the head included, starts a job's
  phases only once that JobStarted is in its view — one publisher, so every node runs the same
  jobs, and a started job is never un-started;
- setup (when the job asks for it) runs on every node of the cluster; run starts on a node
  once every node's setup succeeded, on ranks 0..num_nodes-1 of the job; a node runs one phase
  of each job at a time, and the phases of several jobs side by side;
- a node kills a job's process when the job ended, was cancelled, or another node failed;
- the head (rank 0) decides the job's outcome from the nodes' reports: success when every
  node's run exited 0; failure at the first non-zero report (its phase, exit code, rank);
  cancelled when asked, once the head's own process is gone;
- the head publishes ClusterIdle when nothing ran for the autostop interval, once per idle
  period, and DownRequested after a job queued with down_after ended (when no autostop
  interval is set: with one, `--down` tears the cluster down once idle that long).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Union

from .view import ClusterView, JobView

# Exit codes of a node's report that are not the script's own.
LOST_EXIT = -1  # the process ended while the agent was down; its exit status is unknown
SYNC_FAILED_EXIT = -2  # the workdir or a file mount could not be put in place
HEAD = 0

Phase = Literal["setup", "run"]


@dataclass
class LocalState:
    """What this node knows about itself that the log may not show yet."""

    # (job_id, phase) of every process this node runs (one phase per job; several jobs). A single
    # (job_id, phase) pair is accepted too, as the one process this node runs.
    running: set[tuple[int, str]] = field(default_factory=set)
    killing: set[int] = field(default_factory=set)  # jobs whose processes are being stopped
    done: dict[tuple[int, str], int] = field(default_factory=dict)  # (job_id, phase) -> exit code
    published: set[str] = field(default_factory=set)  # keys of head publications in flight

    def __post_init__(self) -> None:
        if self.running is None:
            self.running = set()
        elif isinstance(self.running, tuple):
            self.running = {self.running}  # type: ignore[arg-type]
        if isinstance(self.killing, bool):
            self.killing = {j for j, _ in self.running} if self.killing else set()

    def finished(self, job: JobView, rank: int, phase: str) -> bool:
        return (job.job_id, phase) in self.done or job.report(rank, phase) is not None

    def jobs(self) -> list[int]:
        """The jobs this node runs a process of, in id order."""
        return sorted({j for j, _ in self.running})

    def runs(self, job_id: int) -> bool:
        return any(j == job_id for j, _ in self.running)


@dataclass(frozen=True)
class Outcome:
    status: Literal["succeeded", "failed", "cancelled"]
    phase: Literal["setup", "run", "agent"] | None = None
    exit_code: int | None = None
    failed_rank: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class Start:
    job_id: int
    phase: Phase


@dataclass(frozen=True)
class Kill:
    job_id: int
    reason: str


@dataclass(frozen=True)
class PublishStarted:
    job_id: int
    gpu_indices: tuple[int, ...] = ()  # what it may use on each of its nodes (packing.py)


@dataclass(frozen=True)
class PublishOutcome:
    job_id: int
    outcome: Outcome


@dataclass(frozen=True)
class PublishDown:
    job_id: int


@dataclass(frozen=True)
class PublishIdle:
    activity_id: str
    idle_since: datetime
    idle_minutes: int
    down: bool


Action = Union[Start, Kill, PublishStarted, PublishOutcome, PublishDown, PublishIdle]


def key(action: Action) -> str:
    """Identity of a head publication, so it is not published twice while its echo is in flight."""
    if isinstance(action, PublishStarted):
        return f"started:{action.job_id}"
    if isinstance(action, PublishOutcome):
        return f"outcome:{action.job_id}"
    if isinstance(action, PublishDown):
        return f"down:{action.job_id}"
    if isinstance(action, PublishIdle):
        return f"idle:{action.activity_id}"
    return ""


def job_outcome(job: JobView, cluster_nodes: int, head_running_it: bool) -> Outcome | None:
    """The job's final state if it is decided now (head only), else None."""
    if job.terminal:
        return None
    runs = job.reported_ranks("run")
    if all(runs.get(r) == 0 for r in range(job.num_nodes)):
        return Outcome("succeeded")
    if job.cancel_requested:
        return None if head_running_it else Outcome("cancelled")
    if job.num_nodes > cluster_nodes:
        return Outcome("failed", "run", None, None,
                       f"the task asks for {job.num_nodes} nodes; the cluster has {cluster_nodes}")
    first = job.first_failure()
    if first is None:
        return None
    if first.exit_code == LOST_EXIT:
        return Outcome("failed", "agent", None, first.rank,
                       f"the {first.phase} process on node {first.rank} ended while its agent was down; "
                       "its exit status is unknown")
    if first.exit_code == SYNC_FAILED_EXIT:
        return Outcome("failed", first.phase, None, first.rank,  # type: ignore[arg-type]
                       f"the workdir or file mounts could not be put in place on node {first.rank}")
    return Outcome("failed", first.phase, first.exit_code, first.rank,  # type: ignore[arg-type]
                   f"{first.phase} failed on node {first.rank} with exit code {first.exit_code}")


def kill_reason(job: JobView, rank: int) -> str | None:
    """Why this node must stop its process for `job` now, or None."""
    if job.terminal:
        return f"job {job.job_id} ended ({job.status.lower() if job.status else 'ended'})"
    if job.cancel_requested:
        return f"job {job.job_id} was cancelled"
    first = job.first_failure()
    if first is not None and first.rank != rank:
        return f"node {first.rank} failed ({first.phase})"
    return None


def next_phase(view: ClusterView, rank: int, local: LocalState) -> Start | None:
    """The first phase this node should start now, if any (`next_phases` gives them all)."""
    starts = next_phases(view, rank, local)
    return starts[0] if starts else None


def next_phases(view: ClusterView, rank: int, local: LocalState) -> list[Start]:
    """The phases this node should start now: of each started job it runs nothing of yet."""
    out: list[Start] = []
    for job_id in sorted(view.jobs):
        job = view.jobs[job_id]
        if (not job.started or job.terminal or local.runs(job_id) or job.cancel_requested
                or job.first_failure() is not None or job.num_nodes > view.num_nodes):
            continue
        if job.queued.run_setup:
            if not local.finished(job, rank, "setup"):
                out.append(Start(job_id, "setup"))
                continue
            setup = job.reported_ranks("setup")
            if not all(setup.get(r) == 0 for r in range(view.num_nodes)):
                continue  # another node's setup is still running (or failed: the head ends the job)
        if rank < job.num_nodes and not local.finished(job, rank, "run"):
            out.append(Start(job_id, "run"))
    return out


def idle_due(view: ClusterView, now: datetime) -> PublishIdle | None:
    """ClusterIdle once per idle period, when autostop is on and nothing ran for the interval."""
    busy = view.busy() and view.idle_wait_for != "none"  # --wait-for none: a hard time limit
    if (view.idle_minutes is None or view.activity_at is None or busy or view.stopped
            or view.terminated or view.down_requested or view.idle_reported_for == view.activity_id):
        return None
    if now - view.activity_at < timedelta(minutes=view.idle_minutes):
        return None
    return PublishIdle(view.activity_id, view.activity_at, view.idle_minutes, view.idle_down)


def decide(view: ClusterView, rank: int, local: LocalState, now: datetime) -> list[Action]:
    actions: list[Action] = []
    if view.terminated:
        actions += [Kill(j, "the cluster was terminated") for j in local.jobs() if j not in local.killing]
        return actions
    for job_id in local.jobs():
        if job_id in local.killing:
            continue
        job = view.jobs.get(job_id)
        reason = kill_reason(job, rank) if job is not None else "unknown job"
        if reason:
            actions.append(Kill(job_id, reason))
    if rank == HEAD:
        for job_id in sorted(view.jobs):
            job = view.jobs[job_id]
            outcome = job_outcome(job, view.num_nodes, local.runs(job_id))
            if outcome is not None:
                actions.append(PublishOutcome(job_id, outcome))
            elif job.terminal and job.queued.down_after and not view.down_requested and view.idle_minutes is None:
                # With an autostop interval, `--down` means "down when idle that long" (idle_due).
                actions.append(PublishDown(job_id))
        # Admission is the head's alone; every node starts a job once its JobStarted is seen.
        actions += [PublishStarted(a.job_id, a.gpu_indices) for a in view.admissions()]
    actions += next_phases(view, rank, local)
    if rank == HEAD:
        idle = idle_due(view, now)
        if idle is not None:
            actions.append(idle)
    return [a for a in actions if not key(a) or key(a) not in local.published]
