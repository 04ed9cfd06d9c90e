"""The dispatch service's one fold of the log, pure: the active policy, the pending submissions,
what admitted work holds, the last reason each held task was given, and the spend so far.

`apply` takes stored events in stream order and is idempotent by sequence (an event at or below
`through` is ignored), so the service rebuilds it from the log at start and then applies what its
consumer delivers, redeliveries included, without counting anything twice. The CLI folds the
same way to answer `spz dispatch queue` and `spz budgets` from the log alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from skypurza.events.bus import Stored
from skypurza.events.dispatch_events import DispatchPolicyApplied, TaskAdmitted, TaskHeld
from skypurza.events.dispatch_policy import DispatchPolicy
from skypurza.events.managed_events import ManagedJobCancelRequested
from skypurza.events.models import (
    ClusterTerminated, DownRequested, JobCancelled, JobFailed, JobQueued, JobSucceeded, PlacementFailed,
    ProvisionFailed, TaskSubmitted, UsageRecorded,
)
from skypurza.events.principal import principal_of

from . import admit, budgets, quota
from .demand import Pending, pending_of
from .policy import semantic_problems

# Every type the fold reads; the service consumes the first group and reads its own decisions.
FOLDED = (TaskSubmitted, DispatchPolicyApplied, JobQueued, JobSucceeded, JobFailed, JobCancelled,
          PlacementFailed, ProvisionFailed, ClusterTerminated, DownRequested, ManagedJobCancelRequested,
          UsageRecorded)
OWN = (TaskAdmitted, TaskHeld)


@dataclass
class DispatchState:
    policy: DispatchPolicy | None = None
    tree: quota.Tree | None = None
    # A policy in the log that its loader would refuse (published by another writer): it stays
    # active, as the optimizer's gate sees it, and holds everything with what is wrong.
    policy_problem: str = ""
    through: int = 0
    pending: dict[str, Pending] = field(default_factory=dict)  # insertion = stream order
    held: dict[str, tuple[str, str]] = field(default_factory=dict)  # task -> (kind, reason) last said
    admitted: dict[str, admit.Book] = field(default_factory=dict)  # holding quota now
    admitted_ever: set[str] = field(default_factory=set)  # never admitted twice
    cluster_of: dict[str, str] = field(default_factory=dict)  # admitted task -> cluster
    job_task: dict[tuple[str, int], str] = field(default_factory=dict)
    usage: dict[str, dict[quota.Key, float]] = field(default_factory=dict)
    users: admit.UserUsage = field(default_factory=dict)
    spend: dict[budgets.SpendKey, int] = field(default_factory=dict)

    def apply_all(self, items: Iterable[Stored]) -> None:
        for s in items:
            self.apply(s)

    def apply(self, s: Stored) -> bool:
        """Fold one stored event; False when it was already folded (or says nothing to us)."""
        if s.seq <= self.through or s.event is None:
            return False
        self.through = s.seq
        ev = s.event
        if isinstance(ev, DispatchPolicyApplied):
            self.policy = ev.policy
            problems = semantic_problems(ev.policy) if ev.policy is not None else []
            self.policy_problem = "; ".join(f"{'.'.join(map(str, path))}: {msg}" for path, msg in problems[:3])
            self.tree = quota.build_tree(ev.policy) if ev.policy is not None and not problems else None
        elif isinstance(ev, TaskSubmitted):
            if self.policy is not None and ev.task_id not in self.pending and ev.task_id not in self.admitted_ever:
                user, team = principal_of(s.envelope, ev)
                self.pending[ev.task_id] = pending_of(ev, s.seq, user, team)
        elif isinstance(ev, TaskAdmitted):
            self.admitted_decision(ev)
        elif isinstance(ev, TaskHeld):
            self.held[ev.task_id] = (ev.kind, ev.reason)
        elif isinstance(ev, JobQueued):
            if ev.task_id in self.admitted:
                self.job_task[(ev.cluster, ev.job_id)] = ev.task_id
        elif isinstance(ev, (JobSucceeded, JobFailed, JobCancelled)):
            task = self.job_task.pop((ev.cluster, ev.job_id), None)
            if task is not None:
                self.release(task)
        elif isinstance(ev, (PlacementFailed, ProvisionFailed)):
            self.release(ev.task_id)
            self.forget(ev.task_id)
        elif isinstance(ev, (ClusterTerminated, DownRequested)):
            # A cluster gone frees what its tasks held; a pending launch torn down is given up.
            if isinstance(ev, ClusterTerminated):
                for task in [t for t, c in self.cluster_of.items() if c == ev.cluster]:
                    self.release(task)
            for task in [t for t, p in self.pending.items() if p.cluster == ev.cluster]:
                self.forget(task)
        elif isinstance(ev, ManagedJobCancelRequested):
            for task in [t for t, p in self.pending.items() if p.managed_job_id == ev.managed_job_id]:
                self.forget(task)
        elif isinstance(ev, UsageRecorded):  # corrections are negative: the sum is the cost
            budgets.charge(self.spend, ev.team, ev.user, ev.end, ev.cost_micros)
        return True

    def admitted_decision(self, ev: TaskAdmitted) -> None:
        """A TaskAdmitted (read back, or just decided): quota held from now on."""
        p = self.pending.pop(ev.task_id, None)
        self.held.pop(ev.task_id, None)
        if ev.task_id in self.admitted_ever:
            return
        self.admitted_ever.add(ev.task_id)
        if p is None:
            return
        book = admit.Book(ev.queue, ev.flavor, p.team, p.user, p.request)
        self.admitted[ev.task_id] = book
        self.cluster_of[ev.task_id] = p.cluster
        admit.charge(self.usage, self.users, book)

    def release(self, task: str) -> None:
        book = self.admitted.pop(task, None)
        self.cluster_of.pop(task, None)
        if book is not None:
            admit.charge(self.usage, self.users, book, -1.0)

    def forget(self, task: str) -> None:
        self.pending.pop(task, None)
        self.held.pop(task, None)

    def decisions(self, now: datetime) -> list[admit.Decision]:
        """What should happen to every pending task now (no policy: all admitted)."""
        pending = list(self.pending.values())
        if self.policy is None:
            return [admit.Admit(p.task_id, None, None, None, False, "no dispatch policy") for p in pending]
        if self.policy_problem:
            return [admit.Hold(p.task_id, None, "policy", f"the dispatch policy in the log is invalid "
                               f"({self.policy_problem}); an admin applies a valid one") for p in pending]
        return admit.decide(self.policy, pending, self.usage, self.users, self.spend, now, self.tree)
