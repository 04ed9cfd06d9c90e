"""Budget stops, pure: which running work a spent `on_limit: stop` budget cancels now.

A budget with `on_limit: stop` that is exceeded in its current period stops every admitted task
it is charged for (its team's, or its one user's): a cluster task once its job is queued (there
is a job to cancel), a managed job's task at once (its managed job is cancelled for good). Each
task is stopped once: `stopped` is what was already said, folded back from the log at a restart.
A task already preempted as a cluster job is being cancelled already and is left alone; a
preempted managed job is not (recovery would relaunch it: the stop cancels it for good).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime

from skypurza.events.dispatch_events import budget_id
from skypurza.events.dispatch_policy import Budget

from . import budgets
from .admit import Book


@dataclass(frozen=True)
class Stop:
    task_id: str
    budget_id: str
    period_key: str
    job: tuple[str, int] | None  # (cluster, job id) to cancel; None: a managed job's launch
    managed_job_id: int | None
    reason: str


def reason(st: budgets.BudgetStatus) -> str:
    """What the stopped work is told: `budget team-a/month: $100.00 of $100.00 spent`."""
    return f"budget {budget_id(st.team, st.user, st.period)}: ${st.spent_usd:,.2f} of ${st.limit_usd:,.2f} spent"


def spent_stops(all_budgets: list[Budget], spend: Mapping[budgets.SpendKey, int],
                now: datetime) -> list[budgets.BudgetStatus]:
    """The `stop` budgets exceeded in their current period, in the policy's order."""
    out = []
    for b in all_budgets:
        if b.on_limit == "stop" and b.hard:
            st = budgets.status(b, spend, now)
            if st.state == "exceeded":
                out.append(st)
    return out


def stops(spent: list[budgets.BudgetStatus], admitted: Mapping[str, Book], job_of: Mapping[str, tuple[str, int]],
          stopped: Collection[str], preempted: Collection[str]) -> list[Stop]:
    """Every admitted task a spent budget stops now and that was not stopped before; a task
    charged to two spent budgets is stopped once, for the first (the policy's order)."""
    if not spent:
        return []
    out: list[Stop] = []
    taken: set[str] = set()
    for st in spent:
        for task, book in admitted.items():
            if task in stopped or task in taken or book.team != st.team or (st.user is not None and book.user != st.user):
                continue
            managed = book.managed_job_id is not None
            job = job_of.get(task)
            if not managed and (job is None or task in preempted):
                continue  # no job to cancel yet (its JobQueued brings it back here), or cancelled already
            taken.add(task)
            out.append(Stop(task, budget_id(st.team, st.user, st.period), st.period_key, job,
                            book.managed_job_id, reason(st)))
    return out
