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
from datetime import date, datetime, timezone

from skypurza.events.bus import Stored
from skypurza.events.dispatch_events import (
    BudgetThresholdCrossed, DispatchPolicyApplied, TaskAdmitted, TaskBudgetStopped, TaskHeld, TaskPreempted,
)
from skypurza.events.dispatch_policy import DispatchPolicy
from skypurza.events.managed_events import ManagedJobCancelRequested
from skypurza.events.models import (
    ClusterTerminated, DownRequested, JobCancelled, JobFailed, JobQueued, JobSucceeded, PlacementFailed,
    ProvisionFailed, TaskSubmitted, UsageRecorded,
)
from skypurza.events.principal import principal_of

from . import admit, budgets, budgetstop, order, preempt, quota, reserve
from .demand import Pending, pending_of
from .policy import semantic_problems
from .usage import Assoc, DecayedUsage

# Every type the fold reads; the service consumes the first group and reads its own decisions.
FOLDED = (TaskSubmitted, DispatchPolicyApplied, JobQueued, JobSucceeded, JobFailed, JobCancelled,
          PlacementFailed, ProvisionFailed, ClusterTerminated, DownRequested, ManagedJobCancelRequested,
          UsageRecorded)
OWN = (TaskAdmitted, TaskHeld, BudgetThresholdCrossed, TaskPreempted, TaskBudgetStopped)


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
    # Fairshare RawUsage per (team, user), decayed (usage.py), and every association seen
    # pending: the fairshare tree's members (order.py).
    fs_usage: DecayedUsage = field(default_factory=DecayedUsage)
    members: set[Assoc] = field(default_factory=set)
    _fs_cache: tuple[tuple[int, int, int], dict[Assoc, float]] | None = None
    walk: quota.Walk | None = None  # over `usage`, told of every charge and release
    # Coalescing (docs/dispatch.md, *How admission works*): a whole pass over the pending set
    # only after what can let a held task go (quota freed, a policy, a budget's state, a
    # task given up); a submission alone is decided by itself. `fresh`: submissions since.
    full_pass: bool = True
    fresh: list[str] = field(default_factory=list)
    last_pass_day: date | None = None
    # (team, user or None, period key) -> the budget state last announced (BudgetThresholdCrossed)
    budget_states: dict[tuple[str, str | None, str], str] = field(default_factory=dict)
    # Preemption (preempt.py): each admitted task's job, the victims announced (never twice),
    # and for each pending preemptor the victims whose quota it waits for.
    job_of: dict[str, tuple[str, int]] = field(default_factory=dict)
    admit_count: int = 0
    preempted: set[str] = field(default_factory=set)
    preempting: dict[str, set[str]] = field(default_factory=dict)
    crossings: list[tuple[budgets.BudgetStatus, float]] = field(default_factory=list)  # (status, alert_at): to announce
    # Budget stops (budgetstop.py): the tasks stopped and the managed jobs cancelled, each said once.
    stopped: set[str] = field(default_factory=set)
    stopped_managed: set[int] = field(default_factory=set)

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
            self.full_pass = True
            self.policy = ev.policy
            pr = ev.policy.priority if ev.policy is not None else None
            if pr is not None:
                self.fs_usage.configure(pr.half_life_s, pr.calc_period_s)
            problems = semantic_problems(ev.policy) if ev.policy is not None else []
            self.policy_problem = "; ".join(f"{'.'.join(map(str, path))}: {msg}" for path, msg in problems[:3])
            self.tree = quota.build_tree(ev.policy) if ev.policy is not None and not problems else None
            self.walk = quota.Walk(self.tree, self.usage) if self.tree is not None else None
        elif isinstance(ev, TaskSubmitted):
            if self.policy is not None and ev.task_id not in self.pending and ev.task_id not in self.admitted_ever:
                user, team = principal_of(s.envelope, ev)
                p = pending_of(ev, s.seq, user, team, s.timestamp.timestamp())
                self.pending[ev.task_id] = p
                self.members.add(order.assoc_of(p))
                self.fresh.append(ev.task_id)
        elif isinstance(ev, TaskAdmitted):
            self.admitted_decision(ev)
        elif isinstance(ev, TaskHeld):
            self.held[ev.task_id] = (ev.kind, ev.reason)
        elif isinstance(ev, TaskPreempted):
            if ev.task_id in self.admitted:
                self.preempted.add(ev.task_id)
                self.preempting.setdefault(ev.by_task, set()).add(ev.task_id)
        elif isinstance(ev, TaskBudgetStopped):
            self.stopped.add(ev.task_id)
            if ev.managed_job_id is not None:
                self.stopped_managed.add(ev.managed_job_id)
        elif isinstance(ev, BudgetThresholdCrossed):
            self.budget_states[(ev.team, ev.user, ev.period_key)] = ev.state
            self.crossings = [(c, a) for c, a in self.crossings
                              if (c.team, c.user, c.period_key, c.state) != (ev.team, ev.user, ev.period_key, ev.state)]
        elif isinstance(ev, JobQueued):
            if ev.task_id in self.admitted:
                self.job_task[(ev.cluster, ev.job_id)] = ev.task_id
                self.job_of[ev.task_id] = (ev.cluster, ev.job_id)
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
            self._fairshare_usage(ev)
            self._budget_crossings(ev)
        return True

    def _fairshare_usage(self, ev: UsageRecorded) -> None:
        start, end = ev.start.timestamp(), ev.end.timestamp()
        seconds = abs(end - start)
        # Intervals from before `billing` was carried: the stored integer billing is what is left.
        rate = ev.billing if ev.billing > 0 else (abs(ev.billing_seconds) / seconds if seconds else 0.0)
        self.fs_usage.add(ev.team or order.NO_TEAM, ev.user or order.NO_TEAM, start, end, rate)

    def _budget_crossings(self, ev: UsageRecorded) -> None:
        """A budget of the interval's team or user whose state (ok, alert, exceeded) changed in
        the interval's period: a full pass (a hard limit holds or lets go) and an announcement."""
        if self.policy is None:
            return
        for b in budgets.applicable(self.policy.budgets, ev.team, ev.user):
            st = budgets.status(b, self.spend, ev.end)
            key = (b.team, b.user, st.period_key)
            if self.budget_states.get(key, "ok") != st.state:
                self.budget_states[key] = st.state
                self.crossings.append((st, b.alert_at))
                self.full_pass = True

    def admitted_decision(self, ev: TaskAdmitted) -> None:
        """A TaskAdmitted (read back, or just decided): quota held from now on."""
        p = self.pending.pop(ev.task_id, None)
        self.held.pop(ev.task_id, None)
        if ev.task_id in self.admitted_ever:
            return
        self.admitted_ever.add(ev.task_id)
        if p is None:
            return
        self.admit_count += 1
        flavor = next((f for f in self.policy.flavors if f.name == ev.flavor), None) if self.policy else None
        book = admit.Book(ev.queue, ev.flavor, p.team, p.user, reserve.booked(flavor, p),
                          priority=preempt.static_priority(self.policy, p) if self.policy is not None else 0,
                          submitted_seq=p.seq, order=self.admit_count, managed_job_id=p.managed_job_id)
        self.admitted[ev.task_id] = book
        self.cluster_of[ev.task_id] = p.cluster
        admit.charge(self.usage, self.users, book)
        self._charged(book)

    def _charged(self, book: admit.Book) -> None:
        # (a book of a queue a newer policy dropped is in no walk's tree)
        if self.walk is not None and book.queue is not None and book.flavor is not None \
                and quota.queue_id(book.queue) in self.walk.tree.nodes:
            self.walk.charged(book.queue, [(book.flavor, r) for r in book.request])

    def release(self, task: str) -> None:
        book = self.admitted.pop(task, None)
        self.cluster_of.pop(task, None)
        self.job_of.pop(task, None)
        self.preempted.discard(task)
        for by in [b for b, victims in self.preempting.items() if task in victims]:
            self.preempting[by].discard(task)
            if not self.preempting[by]:
                del self.preempting[by]
        if book is not None:
            admit.charge(self.usage, self.users, book, -1.0)
            self._charged(book)
            self.full_pass = True

    def forget(self, task: str) -> None:
        self.preempting.pop(task, None)
        if self.pending.pop(task, None) is not None:
            self.full_pass = True  # a StrictFIFO head given up lets the rest of its queue go
        self.held.pop(task, None)

    def fairshare(self) -> dict[Assoc, float]:
        """(team, user) -> FairShare, cached until the usage, the members or the policy change
        (uniform decay scales every usage alike, which no ratio of Fair Tree or classic sees)."""
        pr = self.policy.priority if self.policy is not None else None
        if pr is None:
            return {}
        key = (self.fs_usage.version, len(self.members), id(pr))
        if self._fs_cache is None or self._fs_cache[0] != key:
            tree = order.share_tree(pr, self.members, self.fs_usage.values)
            self._fs_cache = (key, order.fairshare_factors(pr, tree))
        return self._fs_cache[1]

    def ranked(self, now: datetime) -> list[order.Ranked]:
        """Every pending task's priority now, highest first (the order admission takes)."""
        pr = self.policy.priority if self.policy is not None else None
        pending = list(self.pending.values())
        ranks = order.rank(pr, pending, self.fairshare(), now.timestamp())
        by_id = {r.task_id: r for r in ranks}
        return [by_id[p.task_id] for p in order.ordered(pending, ranks)]

    def decisions(self, now: datetime, coalesce: bool = False) -> list[admit.Decision]:
        """What should happen to every pending task now (no policy: all admitted), highest
        priority first. `coalesce`: only the fresh submissions when nothing else changed that
        could let a held task go (the service's path; the CLI always asks for all)."""
        day = now.astimezone(timezone.utc).date()  # a budget's period ends at a UTC midnight: lift its holds
        fresh = [self.pending[t] for t in self.fresh if t in self.pending]
        self.fresh = []
        if coalesce and not self.full_pass and day == self.last_pass_day and self.policy is not None \
                and not self.policy_problem and all(self._alone(p) for p in fresh):
            pending = fresh
        else:
            self.full_pass, self.last_pass_day = False, day
            pending = list(self.pending.values())
        if self.policy is not None and self.policy.priority is not None and len(pending) > 1:
            pending = order.admission_order(self.policy.priority, pending, self.fairshare(), now.timestamp())
        if self.policy is None:
            return [admit.Admit(p.task_id, None, None, None, False, "no dispatch policy") for p in pending]
        if self.policy_problem:
            return [admit.Hold(p.task_id, None, "policy", f"the dispatch policy in the log is invalid "
                               f"({self.policy_problem}); an admin applies a valid one") for p in pending]
        return admit.decide(self.policy, pending, self.usage, self.users, self.spend, now, self.tree, self.walk)

    def preemptable(self) -> list[preempt.Admitted]:
        """Admitted tasks preemption may pick: with a job queued (a cluster job is cancelled, a
        managed job's launch is recovered by the recovery service), not already preempted."""
        out = []
        for task, b in self.admitted.items():
            if task in self.job_of and task not in self.preempted and task not in self.stopped and b.queue and b.flavor:
                out.append(preempt.Admitted(task, b.queue, b.flavor, b.request, b.priority, b.submitted_seq, b.order))
        return out

    def budget_stops(self, now: datetime) -> list[budgetstop.Stop]:
        """The running work a spent `on_limit: stop` budget stops now, not stopped before."""
        if self.policy is None or self.policy_problem or not self.admitted:
            return []
        spent = budgetstop.spent_stops(self.policy.budgets, self.spend, now)
        return budgetstop.stops(spent, self.admitted, self.job_of, self.stopped, self.preempted)

    def preemption_for(self, held: admit.Hold) -> preempt.Preemption | None:
        """What to preempt so that this held task fits, when its queue's policy allows it and
        it is not already waiting for the tasks it preempted."""
        p = self.pending.get(held.task_id)
        if p is None or held.kind != "quota" or self.policy is None or self.tree is None \
                or held.task_id in self.preempting:
            return None
        queue = admit.queue_of(self.policy, p.team)
        if queue is None or (queue.preemption.within_queue == "Never"
                             and queue.preemption.reclaim_within_cohort == "Never"):
            return None
        flavors = admit.allowed_flavors(queue, {f.name: f for f in self.policy.flavors}, p)
        return preempt.plan(self.policy, self.tree, queue, flavors, p, self.usage, self.preemptable())

    def _alone(self, p: Pending) -> bool:
        """May this submission be decided by itself? Not in a StrictFIFO queue (its place in
        the queue's order decides it)."""
        assert self.policy is not None
        q = admit.queue_of(self.policy, p.team)
        return q is None or q.strategy != "StrictFIFO"
