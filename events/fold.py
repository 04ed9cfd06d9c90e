"""The cluster and job aggregates, folded once.

Every reader of a cluster's events asks this module what an event does: the CLI
(`cli/clusterlog.py`), the node agent's view (`services/agent/view.py`), the provisioner
(`services/provisioner/state.py`), the ledger's projections (`services/ledger/projector.py`,
`queries.py`) and recovery (`services/recovery/machine.py`). The state names, the final states,
the exit code of a job, the status a failure in each phase gives and the transitions live here
only, so `spz status`, `spz logs` and `spz jobs queue` cannot tell one job two ways
(`tests/test_one_fold.py` feeds generated histories and the golden log to every reader).

The names are SkyPilot's (`sky status`, `sky queue`, `sky logs --status`, `sky jobs queue`):
- a cluster is INIT (a launch in flight, or nodes lost: abnormal), UP, STOPPED or TERMINATED;
- a job on a cluster is PENDING, SETTING_UP, RUNNING, then SUCCEEDED, FAILED (the run failed),
  FAILED_SETUP (the setup failed), FAILED_DRIVER (the process was lost with its agent: the exit
  status is unknown) or CANCELLED;
- a managed job's names stay in `managed_events.py`; `managed_status_of_job` maps a cluster job's
  end to one the way SkyPilot's jobs controller does.

Pure: no I/O, no clock, keyed on the event classes. A reader that keeps its own shape (the
ledger's rows, the agent's reports) calls the step functions here (`cluster_after`,
`job_after`); `fold_cluster` is the whole fold of one cluster's subject, the reference the
property test compares every reader with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, get_args

from .cluster_events import (
    ClusterProvisioned,
    ClusterStarted,
    ClusterStopped,
    ClusterTerminated,
    NodeLost,
    SpotPreempted,
)
from .job_events import (
    CancelRequested,
    JobCancelled,
    JobFailed,
    JobNodeFinished,
    JobQueued,
    JobStarted,
    JobSucceeded,
)
from .managed_events import TERMINAL_STATUSES as MANAGED_TERMINAL
from .managed_events import ManagedJobStatus
from .payloads import TaskPayload

# ---------------------------------------------------------------------------------- vocabulary

ClusterStatus = Literal["INIT", "UP", "STOPPED", "TERMINATED"]
JobStatus = Literal["PENDING", "SETTING_UP", "RUNNING", "SUCCEEDED", "FAILED", "FAILED_SETUP",
                    "FAILED_DRIVER", "CANCELLED"]
FailurePhase = Literal["setup", "run", "agent"]

CLUSTER_STATUSES: tuple[ClusterStatus, ...] = get_args(ClusterStatus)
JOB_STATUSES: tuple[JobStatus, ...] = get_args(JobStatus)
# A cluster that holds resources (a stopped one keeps its disks): what teardown must reach.
CLUSTER_LIVE: frozenset[str] = frozenset({"INIT", "UP", "STOPPED"})
JOB_FAILED: frozenset[str] = frozenset({"FAILED", "FAILED_SETUP", "FAILED_DRIVER"})
# A job in one of these never changes again.
JOB_TERMINAL: frozenset[str] = frozenset({"SUCCEEDED", "CANCELLED"} | JOB_FAILED)
# The same, ordered, for SQL `status NOT IN (...)` (a stable text gives the same query).
JOB_TERMINAL_SQL: tuple[str, ...] = tuple(s for s in JOB_STATUSES if s in JOB_TERMINAL)
# Older ledger files stored SETUP for SETTING_UP (the CLI renamed it on output).
LEGACY_JOB_STATUS: Mapping[str, JobStatus] = {"SETUP": "SETTING_UP"}

_FAILURE_STATUS: Mapping[str, JobStatus] = {"setup": "FAILED_SETUP", "run": "FAILED", "agent": "FAILED_DRIVER"}
# SkyPilot's jobs controller: FAILED_SETUP stays, FAILED_DRIVER "is kind of an internal error"
# and becomes FAILED_CONTROLLER, any other failure FAILED.
_MANAGED_OF_JOB: Mapping[str, ManagedJobStatus] = {
    "SUCCEEDED": "SUCCEEDED", "CANCELLED": "CANCELLED", "FAILED": "FAILED",
    "FAILED_SETUP": "FAILED_SETUP", "FAILED_DRIVER": "FAILED_CONTROLLER"}

# `spz logs --status`, `spz launch`, `spz jobs launch/logs` exit codes: SkyPilot's JobExitCode.
EXIT_SUCCEEDED = 0
EXIT_FAILED = 100
EXIT_NOT_FINISHED = 101
EXIT_NOT_FOUND = 102
EXIT_CANCELLED = 103


def job_terminal(status: str | None) -> bool:
    return status in JOB_TERMINAL


def job_status_of_failure(phase: str) -> JobStatus:
    """The status a JobFailed gives: setup → FAILED_SETUP, agent (the process was lost with its
    agent, exit status unknown: SkyPilot's driver) → FAILED_DRIVER, run (or anything else) → FAILED."""
    return _FAILURE_STATUS.get(phase, "FAILED")


def managed_status_of_job(status: str) -> ManagedJobStatus:
    """The managed-job status a cluster job's final status gives (when no restart is due)."""
    return _MANAGED_OF_JOB.get(status, "FAILED")


def exit_code_of(status: str | None) -> int:
    """The exit code for a job's status (a cluster job's or a managed job's); None: no such job."""
    if status is None:
        return EXIT_NOT_FOUND
    if status == "SUCCEEDED":
        return EXIT_SUCCEEDED
    if status == "CANCELLED":
        return EXIT_CANCELLED
    if status in JOB_TERMINAL or status in MANAGED_TERMINAL:
        return EXIT_FAILED
    return EXIT_NOT_FINISHED


def job_num_nodes(task: TaskPayload) -> int:
    """The nodes a job runs on: the task's `num_nodes`, else 1 (SkyPilot's default; on a bigger
    cluster the job runs on ranks 0..n-1, which is what the agents do)."""
    return task.nodes()


def job_has_setup(run_setup: bool, task: TaskPayload) -> bool:
    """Whether the job goes through SETTING_UP (exec never runs setup; no script, nothing to set up)."""
    return bool(run_setup and task.setup)


def cluster_nodes_of(ev: ClusterProvisioned) -> int:
    return len(ev.nodes) or ev.candidate.num_nodes


# ---------------------------------------------------------------------------------- cluster


def cluster_after(status: str | None, event: Any) -> ClusterStatus | None:
    """A cluster's status after one event of its subject (None: never provisioned).

    ClusterProvisioned brings it UP (a new cluster under an old name included); nothing else
    revives a TERMINATED one. ClusterTerminated ends it whatever came before (a launch torn down
    before it came up included: its agents must exit); no other event before the first
    ClusterProvisioned makes a cluster. A lost node (SpotPreempted, NodeLost) makes a running
    cluster INIT, as SkyPilot shows an abnormal one. Only the newest event of each lifecycle
    type decides, so the provisioner's fold of those alone agrees with a fold of the whole history.
    """
    if isinstance(event, ClusterProvisioned):
        return "UP"
    if isinstance(event, ClusterTerminated):
        return "TERMINATED"
    if status is None or status == "TERMINATED":
        return status  # type: ignore[return-value]
    if isinstance(event, ClusterStarted):
        return "UP"
    if isinstance(event, ClusterStopped):
        return "STOPPED"
    if isinstance(event, (SpotPreempted, NodeLost)) and status in ("UP", "INIT"):
        return "INIT"
    return status  # type: ignore[return-value]


# ---------------------------------------------------------------------------------- job


@dataclass(frozen=True)
class JobFold:
    job_id: int
    num_nodes: int = 1
    has_setup: bool = False
    status: JobStatus = "PENDING"
    setup_done: frozenset[int] = frozenset()  # ranks whose setup exited 0
    started_at: datetime | None = None
    ended_at: datetime | None = None
    exit_code: int | None = None
    failed_rank: int | None = None
    failed_phase: FailurePhase | None = None
    reason: str = ""
    cancel_requested: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in JOB_TERMINAL


def job_queued(ev: JobQueued) -> JobFold:
    return JobFold(ev.job_id, job_num_nodes(ev.task), job_has_setup(ev.run_setup, ev.task))


def status_on_start(status: str, has_setup: bool) -> str:
    """JobStarted: PENDING → SETTING_UP (setup to run) or RUNNING; a repeat changes nothing."""
    if status != "PENDING":
        return status
    return "SETTING_UP" if has_setup else "RUNNING"


def status_on_node_finished(status: str, phase: str, setup_done: int, cluster_nodes: int) -> str:
    """JobNodeFinished: SETTING_UP → RUNNING once setup exited 0 on every node of the cluster (an
    agent starts a run only then), or as soon as any node's run ended. `setup_done` counts the
    ranks whose setup exited 0, this report included."""
    if status != "SETTING_UP":
        return status
    if phase == "run" or setup_done >= max(cluster_nodes, 1):
        return "RUNNING"
    return status


def status_on_end(event: JobSucceeded | JobFailed | JobCancelled) -> JobStatus:
    """The final status an end event gives (a JobFailed's by its phase)."""
    if isinstance(event, JobSucceeded):
        return "SUCCEEDED"
    if isinstance(event, JobCancelled):
        return "CANCELLED"
    return job_status_of_failure(event.phase)


def job_after(job: JobFold, event: Any, cluster_nodes: int = 1) -> JobFold:
    """A job after one event about it; a job that ended never changes (a late report, a repeat)."""
    if job.terminal:
        return job
    if isinstance(event, JobStarted):
        if job.status != "PENDING":
            return job
        return replace(job, status=status_on_start(job.status, job.has_setup), started_at=event.started_at)
    if isinstance(event, JobNodeFinished):
        done = job.setup_done
        if event.phase == "setup" and event.exit_code == 0 and event.rank not in done:
            done = done | {event.rank}
        elif event.phase == "setup":
            return job  # a failed setup is the head's to end the job; a repeat counts once
        return replace(job, setup_done=done,
                       status=status_on_node_finished(job.status, event.phase, len(done), cluster_nodes))
    if isinstance(event, CancelRequested):
        return replace(job, cancel_requested=True)
    if isinstance(event, JobSucceeded):
        return replace(job, status=status_on_end(event), ended_at=event.ended_at, exit_code=0)
    if isinstance(event, JobCancelled):
        return replace(job, status=status_on_end(event), ended_at=event.ended_at)
    if isinstance(event, JobFailed):
        return replace(job, status=status_on_end(event), ended_at=event.ended_at,
                       exit_code=event.exit_code, failed_rank=event.failed_rank,
                       failed_phase=event.phase, reason=event.reason)
    return job


# ---------------------------------------------------------------------------------- one cluster


@dataclass(frozen=True)
class ClusterFold:
    """One cluster's subject folded: its status and every job queued on it (job ids are never
    reused under one name, so the jobs of earlier clusters of that name stay, told apart by
    `lifetime`: the number of ClusterProvisioned after a termination before the job was queued)."""

    cluster: str
    status: ClusterStatus | None = None
    num_nodes: int = 0
    lifetime: int = 0
    jobs: Mapping[int, JobFold] = field(default_factory=dict)
    job_lifetime: Mapping[int, int] = field(default_factory=dict)

    def current_jobs(self) -> dict[int, JobFold]:
        """The jobs of the cluster now under this name (what `spz queue` of it shows)."""
        return {j: f for j, f in self.jobs.items() if self.job_lifetime.get(j) == self.lifetime}


def fold_cluster(cluster: str, events: Iterable[Any]) -> ClusterFold:
    """Fold one cluster's events, oldest first (other clusters' and unknown events are skipped)."""
    status: ClusterStatus | None = None
    nodes, lifetime = 0, 0
    jobs: dict[int, JobFold] = {}
    lifetimes: dict[int, int] = {}
    for ev in events:
        if getattr(ev, "cluster", None) != cluster:
            continue
        if isinstance(ev, ClusterProvisioned):
            if status == "TERMINATED":
                lifetime += 1
            nodes = cluster_nodes_of(ev)
        status = cluster_after(status, ev)
        if isinstance(ev, JobQueued):
            if ev.job_id not in jobs:
                jobs[ev.job_id] = job_queued(ev)
                lifetimes[ev.job_id] = lifetime
        elif isinstance(ev, (JobStarted, JobNodeFinished, CancelRequested, JobSucceeded, JobFailed, JobCancelled)):
            job = jobs.get(ev.job_id)
            if job is not None:
                jobs[ev.job_id] = job_after(job, ev, nodes)
    return ClusterFold(cluster, status, nodes, lifetime, jobs, lifetimes)
