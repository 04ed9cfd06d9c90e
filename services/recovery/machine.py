"""A managed job as a state machine: its state is a fold of its own events (the `mjob` aggregate),
and `decide(state, fact)` says which transition a fact causes. Pure: no bus, no clock.

States are SkyPilot's (PENDING, STARTING, RUNNING, RECOVERING, SUCCEEDED, FAILED, FAILED_SETUP,
FAILED_NO_RESOURCE, FAILED_CONTROLLER, CANCELLING, CANCELLED). Every transition is one
ManagedJobStatusChanged; its typed `kind` (events/managed_events.py ManagedTransitionKind) is what
the fold reads back, so the log alone says what each launch was for (its `reason` is prose for
people; it begins with the kind, and stored v1 events, which had only that, are upcast from it):

    launch      a task's first launch (STARTING)       started     the job runs (RUNNING)
    preempted   spot preemption -> new cluster          node_lost   node or cluster lost -> new cluster
    restart     user-code failure, counted restart      exit_code   failure with a recover_on_exit_codes code
    fallback    the strategy's first try found no place; the task's own constraints now
    succeeded / failed / failed_setup / failed_controller / no_resource / cancelling / cancelled
    unclassified   only from the v1 upcaster (a v1 reason naming no kind): not a launch

Every launch (task start or recovery) gets a cluster of its own, named from the job and the
launch number; the previous one is torn down. Facts about any cluster but the current one
are stale and change nothing, which is what makes redelivered or late events harmless.

A job group (`execution: parallel`) is one managed job per task, submitted together: each runs
and recovers through this machine on its own. What ties them is `group_end`: once every primary
task has ended, the others are cancelled after the group's termination delay (the fact
`GroupEnded`, a cancel with its own reason).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Literal, Union

from skypurza.events.envelope import derive_id
from skypurza.events.fold import job_status_of_failure, managed_status_of_job
from skypurza.events.managed_events import (
    TERMINAL_STATUSES,
    JobGroupMember,
    ManagedJobCancelRequested,
    ManagedJobStatus,
    ManagedJobStatusChanged,
    ManagedJobSubmitted,
    ManagedTransitionKind,
)
from skypurza.events.payloads import ManagedTask

from .strategy import NONE, Recovery, recovery_of

ACTIVE = frozenset({"STARTING", "RUNNING", "RECOVERING"})
LAUNCHING = frozenset({"STARTING", "RECOVERING"})
LAUNCH_WHYS: frozenset[ManagedTransitionKind] = frozenset(
    {"launch", "preempted", "node_lost", "restart", "exit_code", "fallback"})
LOSS_WHYS: frozenset[ManagedTransitionKind] = frozenset({"preempted", "node_lost"})
# The kind of a failure that ends the job, by the managed status it ends in.
_END_OF_FAILURE: dict[str, ManagedTransitionKind] = {
    "FAILED": "failed", "FAILED_SETUP": "failed_setup", "FAILED_CONTROLLER": "failed_controller"}


# ---------------------------------------------------------------------------------- state

@dataclass
class JobState:
    job_id: int
    name: str
    tasks: list[ManagedTask]
    skypilot_task_ids: list[str] = field(default_factory=list)
    user: str = ""
    team: str | None = None
    project: str | None = None
    secrets_key: str | None = None
    submitted_at: datetime | None = None
    job_rank: int = 0  # --num-jobs: rank and count (SKYPILOT_JOB_RANK / _NUM_JOBS)
    num_jobs: int = 1
    group: JobGroupMember | None = None  # a job group's member
    status: str = "PENDING"
    task_index: int = 0
    cluster: str | None = None
    clusters: list[str] = field(default_factory=list)  # every launch's cluster, in order
    recoveries: int = 0
    restarts_on_errors: int = 0
    task_restarts: int = 0  # counted restarts of the current task
    reason: str = ""
    why: ManagedTransitionKind | None = None  # kind of the last transition (None before any)
    episode: str = ""  # why the current launch episode began (a LAUNCH_WHYS kind other than fallback)
    phase: int = 0  # launches in the current episode: 1 is the strategy's first try
    lost_cluster: str | None = None  # the cluster whose loss began the current episode
    cancel_requested: bool = False
    started_at: datetime | None = None
    ended_at: datetime | None = None
    last_seq: int = 0  # stream sequence of the job's newest event (optimistic concurrency)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def task(self) -> ManagedTask:
        return self.tasks[self.task_index] if self.tasks else ManagedTask()

    @property
    def recovery(self) -> Recovery:
        return recovery_of(self.task)

    @property
    def launch_number(self) -> int:
        return len(self.clusters)

    def skypilot_task_id(self, index: int | None = None) -> str:
        i = self.task_index if index is None else index
        return self.skypilot_task_ids[i] if i < len(self.skypilot_task_ids) else ""

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.job_id, "name": self.name, "status": self.status, "recoveries": self.recoveries,
            "restarts_on_errors": self.restarts_on_errors, "cluster": self.cluster,
            "task_index": self.task_index, "num_tasks": len(self.tasks),
            "task_name": self.task.name, "user": self.user,
            "submitted_at": self.submitted_at.isoformat() if self.submitted_at else None,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "clusters": list(self.clusters), "cancel_requested": self.cancel_requested, "reason": self.reason,
        }


def new_state(ev: ManagedJobSubmitted, seq: int = 0, at: datetime | None = None) -> JobState:
    return JobState(job_id=ev.managed_job_id, name=ev.name, tasks=list(ev.tasks),
                    skypilot_task_ids=list(ev.skypilot_task_ids), user=ev.user, team=ev.team, project=ev.project,
                    secrets_key=ev.secrets_key, submitted_at=at, job_rank=ev.job_rank, num_jobs=ev.num_jobs,
                    group=ev.group, last_seq=seq)


def apply(state: JobState | None, event: Any, seq: int = 0, at: datetime | None = None) -> JobState | None:
    """Fold one `mjob` event into the state (a new state object; the old one is untouched)."""
    if isinstance(event, ManagedJobSubmitted):
        return state if state is not None else new_state(event, seq, at)
    if state is None:
        return None  # events of a job whose submission we never saw
    s = replace(state, clusters=list(state.clusters), last_seq=max(state.last_seq, seq))
    if isinstance(event, ManagedJobCancelRequested):
        s.cancel_requested = True
    elif isinstance(event, ManagedJobStatusChanged):
        if s.terminal:
            return s  # nothing follows an end (a late duplicate from a second writer)
        why = event.kind
        previous = s.cluster
        if event.task_index != s.task_index:
            s.task_restarts = 0
        s.status, s.task_index, s.reason, s.why = event.status, event.task_index, event.reason, why
        s.recoveries, s.restarts_on_errors = event.recoveries, event.restarts_on_errors
        if event.cluster is not None:
            s.cluster = event.cluster
            if event.cluster not in s.clusters:
                s.clusters.append(event.cluster)
        if why in LAUNCH_WHYS:
            if why == "fallback":
                s.phase += 1
            else:
                s.episode, s.phase = why, 1
                s.lost_cluster = previous if why in LOSS_WHYS else None
            if why == "restart":
                s.task_restarts += 1
        if event.status == "RUNNING" and s.started_at is None:
            s.started_at = at
        if s.terminal:
            s.ended_at = at
    return s


# ---------------------------------------------------------------------------------- facts

@dataclass(frozen=True)
class Kick:
    """Look at the job (after its submission, or when reconciling)."""


@dataclass(frozen=True)
class Cancel:
    pass


@dataclass(frozen=True)
class JobStartedF:
    cluster: str


@dataclass(frozen=True)
class JobSucceededF:
    cluster: str


@dataclass(frozen=True)
class JobFailedF:
    cluster: str
    phase: str = "run"  # setup | run | agent
    exit_code: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class JobCancelledF:
    cluster: str


@dataclass(frozen=True)
class LostF:
    cluster: str
    kind: Literal["preempted", "node_lost"]
    detail: str = ""


@dataclass(frozen=True)
class PlacementFailedF:
    cluster: str
    detail: str = ""


@dataclass(frozen=True)
class ProvisionFailedF:
    cluster: str
    detail: str = ""


@dataclass(frozen=True)
class TerminatedF:
    cluster: str
    detail: str = ""


@dataclass(frozen=True)
class GroupEnded:
    """Every primary task of the job's group has ended and the termination delay is over."""

    detail: str = ""


@dataclass(frozen=True)
class NothingToCancel:
    """CANCELLING, and the current cluster never came up (so no termination will follow)."""

    cluster: str | None


Fact = Union[Kick, Cancel, JobStartedF, JobSucceededF, JobFailedF, JobCancelledF, LostF, PlacementFailedF,
             ProvisionFailedF, TerminatedF, NothingToCancel, GroupEnded]


@dataclass(frozen=True)
class Transition:
    status: ManagedJobStatus
    kind: ManagedTransitionKind
    task_index: int
    cluster: str | None
    recoveries: int
    restarts_on_errors: int
    reason: str

    def event(self, job_id: int) -> ManagedJobStatusChanged:
        return ManagedJobStatusChanged(managed_job_id=job_id, status=self.status, kind=self.kind,
                                       task_index=self.task_index, cluster=self.cluster, recoveries=self.recoveries,
                                       restarts_on_errors=self.restarts_on_errors, reason=self.reason)


# ---------------------------------------------------------------------------------- names

_SLUG = re.compile(r"[^a-z0-9]+")


def cluster_name(job_name: str, job_id: int, launch: int) -> str:
    """The cluster of a managed job's `launch`-th launch: `<name>-<job id>-<launch>`."""
    slug = _SLUG.sub("-", (job_name or "").lower()).strip("-")[:24].strip("-") or "job"
    return f"{slug}-{job_id}-{launch}"


def launch_task_id(job_id: int, launch: int) -> str:
    """TaskSubmitted.task_id of a launch: derived, so every recovery service computes the same."""
    return derive_id(f"managed-job:{job_id}", "recovery", f"launch-{launch}")


# ---------------------------------------------------------------------------------- decide

def decide(s: JobState, fact: Fact) -> Transition | None:
    if s.terminal:
        return None
    if s.cancel_requested or isinstance(fact, (Cancel, GroupEnded)) or s.status == "CANCELLING":
        return _cancel(s, fact)
    if isinstance(fact, Kick):
        if s.status == "PENDING" and s.tasks:
            return _launch(s, "STARTING", 0, "launch", f"task 0 of {len(s.tasks)}")
        return None
    if getattr(fact, "cluster", None) != s.cluster or s.cluster is None:
        return None  # about an earlier cluster of this job (or another job): stale
    if isinstance(fact, JobStartedF):
        if s.status in LAUNCHING:
            return _to(s, "RUNNING", "started", f"on {s.cluster}")
        return None
    if isinstance(fact, JobSucceededF):
        if s.status not in ACTIVE:
            return None
        if s.task_index + 1 < len(s.tasks):
            nxt = s.task_index + 1
            return _launch(s, "STARTING", nxt, "launch", f"task {nxt} of {len(s.tasks)}")
        return _to(s, "SUCCEEDED", "succeeded", f"on {s.cluster}")
    if isinstance(fact, JobFailedF):
        if s.status not in ACTIVE:
            return None
        return _after_failure(s, fact)
    if isinstance(fact, JobCancelledF):
        if s.status in ACTIVE:
            return _to(s, "CANCELLED", "cancelled", f"the job was cancelled on {s.cluster}")
        return None
    if isinstance(fact, (LostF, TerminatedF)):
        if s.status not in ACTIVE:
            return None
        kind = fact.kind if isinstance(fact, LostF) else "node_lost"
        detail = fact.detail or ("cluster terminated" if isinstance(fact, TerminatedF) else kind)
        if s.recovery.strategy == NONE:
            return _to(s, "FAILED", "failed", f"{detail}; job_recovery strategy is none")
        return _launch(s, "RECOVERING", s.task_index, kind, f"{s.cluster}: {detail}", recoveries=s.recoveries + 1)
    if isinstance(fact, PlacementFailedF):
        if s.status not in LAUNCHING:
            return None
        if s.episode in ("preempted", "node_lost") and s.phase == 1:
            return _launch(s, "RECOVERING", s.task_index, "fallback",
                           f"the strategy's first choice has no place ({_first_line(fact.detail)}); "
                           "trying the task's own constraints")
        return _to(s, "FAILED_NO_RESOURCE", "no_resource", fact.detail or "no placement")
    if isinstance(fact, ProvisionFailedF):
        if s.status in LAUNCHING:
            return _to(s, "FAILED_NO_RESOURCE", "no_resource", f"provisioning failed: {fact.detail}")
        return None
    return None


def _after_failure(s: JobState, fact: JobFailedF) -> Transition:
    counted = s.recovery.restart_counted(fact.exit_code, s.task_restarts)
    what = (f"{fact.phase} exited with {fact.exit_code}" if fact.exit_code is not None else f"{fact.phase} failed") \
        + (f" ({fact.detail})" if fact.detail else "")
    if counted is None:
        # The one fold's job status, as SkyPilot's jobs controller maps it: FAILED_SETUP stays,
        # FAILED_DRIVER (the process was lost with its agent) is FAILED_CONTROLLER, else FAILED.
        status = managed_status_of_job(job_status_of_failure(fact.phase))
        return _to(s, status, _END_OF_FAILURE.get(status, "failed"), what)
    if counted:
        n = s.task_restarts + 1
        return _launch(s, "RECOVERING", s.task_index, "restart",
                       f"{what}; restart {n} of {s.recovery.max_restarts_on_errors}",
                       restarts=s.restarts_on_errors + 1)
    return _launch(s, "RECOVERING", s.task_index, "exit_code", f"{what}; a recover_on_exit_codes code")


def _cancel(s: JobState, fact: Fact) -> Transition | None:
    why = f"{fact.detail}; " if isinstance(fact, GroupEnded) and fact.detail else ""
    if s.status == "PENDING":
        return _to(s, "CANCELLED", "cancelled", f"{why}before any launch", cluster=None)
    if s.status != "CANCELLING":
        return _to(s, "CANCELLING", "cancelling", why + (f"tearing down {s.cluster}" if s.cluster else "").rstrip("; "))
    if isinstance(fact, TerminatedF) and fact.cluster == s.cluster:
        return _to(s, "CANCELLED", "cancelled", f"{s.cluster} terminated")
    if isinstance(fact, NothingToCancel) and fact.cluster == s.cluster:
        return _to(s, "CANCELLED", "cancelled", "no cluster was up")
    return None


def _to(s: JobState, status: ManagedJobStatus, why: ManagedTransitionKind, text: str, *,
        cluster: str | None | bool = True) -> Transition:
    # The reason still begins with the kind: people read it (`spz jobs queue`), code reads `kind`.
    return Transition(status, why, s.task_index, s.cluster if cluster is True else cluster,  # type: ignore[arg-type]
                      s.recoveries, s.restarts_on_errors, f"{why}: {text}" if text else why)


def _launch(s: JobState, status: ManagedJobStatus, task_index: int, why: ManagedTransitionKind, text: str, *,
            recoveries: int | None = None, restarts: int | None = None) -> Transition:
    cluster = cluster_name(s.name, s.job_id, s.launch_number + 1)
    return Transition(status, why, task_index, cluster, s.recoveries if recoveries is None else recoveries,
                      s.restarts_on_errors if restarts is None else restarts, f"{why}: {text}")


def _first_line(text: str) -> str:
    return (text or "").splitlines()[0] if text else ""


# ---------------------------------------------------------------------------------- effects

@dataclass(frozen=True)
class Launch:
    """A launch the state asks for: the TaskSubmitted that must exist for `cluster`."""

    cluster: str
    number: int
    task_index: int
    episode: str
    phase: int
    lost_cluster: str | None

    def task_id(self, job_id: int) -> str:
        return launch_task_id(job_id, self.number)


def wanted_launch(s: JobState) -> Launch | None:
    if s.status not in LAUNCHING or s.why not in LAUNCH_WHYS or s.cluster is None:
        return None
    return Launch(s.cluster, s.clusters.index(s.cluster) + 1, s.task_index, s.episode, s.phase, s.lost_cluster)


def clusters_to_tear_down(s: JobState) -> list[str]:
    """Clusters of this job that must go: all of them once it ends (or is being cancelled),
    every earlier one while it is active."""
    if s.terminal or s.status == "CANCELLING":
        return list(s.clusters)
    if s.status in ACTIVE:
        return [c for c in s.clusters if c != s.cluster]
    return []


# ---------------------------------------------------------------------------------- job groups

@dataclass(frozen=True)
class Peer:
    """What a job group's decision needs of one member."""

    job_id: int
    index: int
    name: str | None  # its task's name
    terminal: bool
    ended_at: datetime | None


def peer_of(s: JobState) -> Peer:
    return Peer(s.job_id, s.group.index if s.group else 0, s.task.name, s.terminal, s.ended_at)


@dataclass(frozen=True)
class GroupEnd:
    """When a member must be cancelled because its group's primary tasks have ended."""

    due_at: datetime
    detail: str


def group_end(s: JobState, peers: Iterable[Peer]) -> GroupEnd | None:
    """For an unfinished, non-primary member of a job group: the time it is to be cancelled
    (the last primary task's end plus the termination delay), once every primary task has ended;
    None while one still runs, for a primary task, or for a job of no group. A primary member
    the log does not have (a submission cut short) never ends: nothing is cancelled for it, and
    a member already being cancelled needs nothing more."""
    g = s.group
    if g is None or s.terminal or g.primary or s.cancel_requested or s.status == "CANCELLING":
        return None  # (one being cancelled needs nothing more)
    by_index = {p.index: p for p in peers}
    primaries = [by_index.get(i) for i in g.primaries]
    if not primaries or any(p is None or not p.terminal or p.ended_at is None for p in primaries):
        return None
    last = max(p.ended_at for p in primaries if p is not None and p.ended_at is not None)
    names = ", ".join(p.name or f"task {p.index}" for p in primaries if p is not None)
    return GroupEnd(last + timedelta(seconds=g.termination_delay_s),
                    f"the job group's primary task{'s' if len(primaries) > 1 else ''} ({names}) ended"
                    + (f" {g.termination_delay_s} s before" if g.termination_delay_s else ""))
