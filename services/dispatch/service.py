"""Dispatch service: admission between submission and placement, by the dispatch policy.

Eats:  TaskSubmitted, DispatchPolicyApplied, what frees quota (a job's end, a failed
       placement, a cluster terminated) and what the ledger meters (UsageRecorded)
Emits: TaskAdmitted (the optimizer places it) | TaskHeld (the reason, again when it changes)
       | BudgetThresholdCrossed (a budget's state changed in its period: the alerts service)
       | TaskPreempted + CancelRequested (a running job preempted for a held task, preempt.py)
       | TaskBudgetStopped + CancelRequested or ManagedJobCancelRequested (running work of a spent
         `on_limit: stop` budget, budgetstop.py)

With no policy in the log it emits nothing: the optimizer places every TaskSubmitted itself, so
nothing changes for a broker without one. While a policy is active the optimizer waits for the
TaskAdmitted (both read which policy was active at the submission's stream sequence).

Reads (`spz dispatch queue|share|prio`, `spz budgets`, the API's dispatch routes) are answered
over the bus from that same state (its `queue`, `share`, `budgets` queries, events/dispatch_queries.py;
the views are services/dispatch/reads.py's), as fresh as the caller's `min_seq`: a read costs the
same however long the log is.

Stateless across restarts: `start` folds the log (services/dispatch/state.py) up to its end,
its own decisions included, then the durable consumer resumes; an event already folded is not
folded again, and a task already admitted is never admitted again. Decisions are
services/dispatch/admit.py's, pure; every one is an event, so `spz events replay` explains
why a task waited.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from skypurza.events import dispatch_queries, naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.dispatch_events import (
    BudgetThresholdCrossed, TaskAdmitted, TaskBudgetStopped, TaskHeld, TaskPreempted, budget_id,
)
from skypurza.events.job_events import CancelRequested
from skypurza.events.managed_events import ManagedJobCancelRequested
from skypurza.events.contract import BusAccess
from skypurza.events.service import Emit, EmitContext, InOrder, Reactions, ServiceContract, handles

from . import admit, budgets, reads
from .state import FOLDED, OWN, DispatchState

log = logging.getLogger("skypurza.dispatch")

CONTRACT = ServiceContract(
    name="dispatch",
    consumes=FOLDED,
    emits=(TaskAdmitted, TaskHeld, BudgetThresholdCrossed, TaskPreempted, CancelRequested, TaskBudgetStopped,
           ManagedJobCancelRequested),
    reads=OWN,
    # One decision at a time over the whole pending set: admission is an ordering.
    delivery=InOrder(),
    consume_notes={FOLDED[0]: "admission, while a policy is active"},
    emit_notes={TaskHeld: "the reason, re-emitted when it changes",
                BudgetThresholdCrossed: "a budget's state changed (alert, exceeded, ok) in its current period",
                TaskPreempted: "an admitted task preempted for a pending one (the queue's preemption policy)",
                CancelRequested: "the preempted (or budget-stopped) task's job, with the reason",
                TaskBudgetStopped: "an admitted task of a spent `on_limit: stop` budget, once",
                ManagedJobCancelRequested: "a budget-stopped managed job: cancelled for good, not recovered"},
    # `queue`, `share`, `budgets`: the reads of `spz dispatch` and the API (events/dispatch_queries.py).
    bus=BusAccess(answers=dispatch_queries.SERVICE),
)
QUERY_CONCURRENCY = 4  # one answer waiting for its min_seq does not hold up the others


def fold_subjects(stage: str, types: tuple[type, ...] = FOLDED + OWN) -> list[str]:
    """Every subject the fold reads (default): what the service consumes and its own decisions."""
    return [naming.event_filter(stage, cls.AGGREGATE, cls.EVENT_NAME) for cls in types]


async def load_state(bus: Bus) -> DispatchState:
    """The fold of the whole log as it is now (the service's start, and the CLI's answers)."""
    state = DispatchState()
    async for s in bus.replay(filter_subjects=fold_subjects(bus.stage)):
        state.apply(s)
    return state


class DispatchService:
    contract = CONTRACT
    name = CONTRACT.name

    def __init__(self, clock: Clock = SYSTEM_CLOCK):
        self.clock = clock
        self.state = DispatchState()
        self._bus: Bus | None = None
        self._queries: list[Any] = []  # the request-reply subscriptions
        self._folded = asyncio.Event()  # set (and replaced) on every event folded: what a read waits on
        self._current_to = 0  # every event the fold reads up to this stream sequence is folded

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self.state = await load_state(bus)
        log.info("dispatch: policy %s, %d pending, %d admitted holding quota",
                 "active" if self.state.policy else "none", len(self.state.pending), len(self.state.admitted))
        if not self._queries:
            self._queries = await bus.serve_queries(
                dispatch_queries.SERVICE, {q: self._answerer(q) for q in reads.VIEWS}, concurrency=QUERY_CONCURRENCY)

    async def close(self) -> None:
        for sub in self._queries:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection is already gone: nothing left to answer on
                pass
        self._queries = []

    @handles(*FOLDED)
    async def on_event(self, stored: Stored, ctx: EmitContext) -> Reactions:
        self.state.apply(stored)  # idempotent: a redelivered event was folded at start
        self._folded.set()
        self._folded = asyncio.Event()
        return self.react()

    # ------------------------------------------------------------------ reads (queries)

    def _answerer(self, query: str):
        async def answer(params: dict[str, Any]) -> dict[str, Any]:
            if not isinstance(params, dict):
                raise ValueError("a query's parameters are an object")
            min_seq = params.pop("min_seq", None)
            if min_seq is not None:
                if not isinstance(min_seq, int) or isinstance(min_seq, bool) or min_seq < 0:
                    raise ValueError("min_seq: a stream sequence (an integer >= 0)")
                await self._current(min_seq)
            return reads.view(self.state, query, self.clock.now(), params)
        return answer

    async def _current(self, min_seq: int, wait_s: float = dispatch_queries.WAIT_S) -> None:
        """Return once every event the fold consumes up to `min_seq` is folded; raise past `wait_s`
        (the caller then folds the log itself). The newest such event is looked up, not waited
        for: most of the log (a node's events, job output) is nothing dispatch reads."""
        if self.state.through >= min_seq or self._current_to >= min_seq:
            return
        assert self._bus is not None
        newest = await self._bus.last_seq_of(fold_subjects(self._bus.stage, FOLDED))
        target = min(min_seq, newest)
        deadline = asyncio.get_running_loop().time() + wait_s
        while self.state.through < target:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise TimeoutError(f"dispatch has folded the log to {self.state.through}, not yet to {target}")
            try:
                await asyncio.wait_for(self._folded.wait(), left)
            except asyncio.TimeoutError:
                pass
        self._current_to = max(self._current_to, min_seq)

    def react(self) -> Reactions:
        """Emit what changed: an admission for each newly admitted task, a hold whose reason changed."""
        out: Reactions = []
        state = self.state
        now = self.clock.now()
        out += self._crossings(now)
        decided = state.decisions(now, coalesce=True)
        for d in decided:
            p = state.pending.get(d.task_id)
            if p is None:
                continue
            if isinstance(d, admit.Admit):
                ev = TaskAdmitted(task_id=p.task_id, cluster=p.cluster, submitted_seq=p.seq,
                                  managed_job_id=p.managed_job_id, queue=d.queue, flavor=d.flavor, infra=d.infra,
                                  borrowing=d.borrowing, reason=d.reason, reservation=d.reservation)
                state.admitted_decision(ev)
                out.append(Emit(ev, key=f"admit-{p.task_id}"))
            elif state.held.get(d.task_id) != (d.kind, d.reason):
                state.held[d.task_id] = (d.kind, d.reason)
                out.append(Emit(TaskHeld(task_id=p.task_id, cluster=p.cluster, submitted_seq=p.seq,
                                         managed_job_id=p.managed_job_id, queue=d.queue, kind=d.kind,
                                         reason=d.reason), key=f"held-{p.task_id}"))
        out += self._preemptions(decided)
        out += self._budget_stops(now)
        return out

    def _budget_stops(self, now) -> Reactions:
        """Stop the running work of a spent `on_limit: stop` budget: a TaskBudgetStopped per task
        and the cancel that ends it. A managed job gets ManagedJobCancelRequested (a cancel for
        good), never a TaskPreempted, which recovery answers with a relaunch."""
        state = self.state
        out: Reactions = []
        for st in state.budget_stops(now):
            book = state.admitted[st.task_id]
            cluster = st.job[0] if st.job is not None else state.cluster_of.get(st.task_id, "")
            out.append(Emit(TaskBudgetStopped(task_id=st.task_id, cluster=cluster, submitted_seq=book.submitted_seq,
                                              managed_job_id=st.managed_job_id, queue=book.queue,
                                              budget_id=st.budget_id, period_key=st.period_key,
                                              job_id=st.job[1] if st.job is not None else None, reason=st.reason),
                            key=f"budget-stop-{st.task_id}"))
            state.stopped.add(st.task_id)
            if st.managed_job_id is not None:
                if st.managed_job_id not in state.stopped_managed:
                    state.stopped_managed.add(st.managed_job_id)
                    out.append(Emit(ManagedJobCancelRequested(managed_job_id=st.managed_job_id,
                                                              requested_by=f"dispatch: {st.reason}"),
                                    key=f"budget-stop-mjob-{st.managed_job_id}"))
            elif st.job is not None:
                out.append(Emit(CancelRequested(cluster=st.job[0], job_id=st.job[1], requested_by=f"dispatch: {st.reason}"),
                                key=f"budget-stop-cancel-{st.task_id}"))
        return out

    def _preemptions(self, decided: list[admit.Decision]) -> Reactions:
        """For the first held task (highest priority first) that may preempt: a TaskPreempted
        and a CancelRequested for each of its targets. One preemptor per reaction: the next is
        planned once these tasks' quota is back (their jobs' ends trigger a whole pass)."""
        state = self.state
        for d in decided:
            if not isinstance(d, admit.Hold):
                continue
            plan = state.preemption_for(d)
            if plan is None:
                continue
            out: Reactions = []
            for v in plan.targets:
                cluster, job_id = state.job_of[v.task_id]
                book = state.admitted[v.task_id]
                ev = TaskPreempted(task_id=v.task_id, cluster=cluster, submitted_seq=book.submitted_seq,
                                   managed_job_id=book.managed_job_id, queue=v.queue, by_task=d.task_id, job_id=job_id,
                                   reason=plan.reason)
                state.preempted.add(v.task_id)
                state.preempting.setdefault(d.task_id, set()).add(v.task_id)
                out.append(Emit(ev, key=f"preempt-{v.task_id}"))
                if book.managed_job_id is not None:
                    continue  # the recovery service takes the cluster down and launches it again
                out.append(Emit(CancelRequested(cluster=cluster, job_id=job_id, requested_by=f"dispatch: {plan.reason}"),
                                key=f"preempt-cancel-{v.task_id}"))
            return out
        return []

    def _crossings(self, now) -> Reactions:
        """Announce the budget states that changed, in their current period only (a crossing
        folded from months ago is history, not news)."""
        out: Reactions = []
        pending, self.state.crossings = self.state.crossings, []
        for st, alert_at in pending:
            if budgets.period_key(st.period, now) != st.period_key:
                continue
            ev = BudgetThresholdCrossed(budget_id=budget_id(st.team, st.user, st.period), team=st.team, user=st.user,
                                        period=st.period, period_key=st.period_key, state=st.state,
                                        spent_usd=st.spent_usd, limit_usd=st.limit_usd, fraction=st.fraction,
                                        hard=st.hard, alert_at=alert_at)
            out.append(Emit(ev, key=f"budget-{ev.budget_id}-{st.period_key}-{st.state}"))
        return out
