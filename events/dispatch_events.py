"""Events of dispatch: admission of a task (the `task` aggregate, so a task's history says why it
waited) and the dispatch policy (the `dispatch` aggregate, one instance: `policy`).

Emitted by: the dispatch service (TaskAdmitted, TaskHeld, TaskPreempted, TaskBudgetStopped,
BudgetThresholdCrossed), `spz dispatch policy apply`
(DispatchPolicyApplied). The optimizer folds DispatchPolicyApplied: while a policy is active
it places a TaskSubmitted only once a TaskAdmitted names it (docs/dispatch.md).
"""

from __future__ import annotations

from typing import Literal

from .dispatch_policy import DispatchPolicy
from .registry import Event, register
from .types import ReservationRef

HoldKind = Literal["quota", "user_limit", "budget", "order", "no_queue", "no_flavor", "policy"]
POLICY_ID = "policy"


class _TaskDispatchEvent(Event):
    AGGREGATE = "task"
    AGGREGATE_KEY = "task_id"
    task_id: str
    cluster: str
    # The stream sequence of the TaskSubmitted: the optimizer's gate reads which policy was
    # active when it was stored, so both sides agree without sharing any state.
    submitted_seq: int
    managed_job_id: int | None = None


@register
class TaskAdmitted(_TaskDispatchEvent):
    """Quota reserved for the task: the optimizer may place it (on `infra` when a flavor names one)."""

    EVENT_NAME = "task_admitted"
    queue: str | None = None
    flavor: str | None = None
    infra: str | None = None
    borrowing: bool = False
    reason: str = ""
    # The flavor's reservation: the optimizer places the task only there (docs/dispatch.md)
    reservation: ReservationRef | None = None


@register
class TaskHeld(_TaskDispatchEvent):
    """The task waits; `reason` says what would let it go, and a newer TaskHeld replaces it."""

    EVENT_NAME = "task_held"
    queue: str | None = None
    kind: HoldKind = "quota"
    reason: str


@register
class TaskPreempted(_TaskDispatchEvent):
    """Dispatch preempts this admitted task for a pending one (Kueue's semantics,
    docs/dispatch.md *Preemption*); its job is cancelled with `reason` (a CancelRequested of
    `job_id`), and its quota frees when the job ends."""

    EVENT_NAME = "task_preempted"
    queue: str | None = None
    by_task: str
    job_id: int
    reason: str


@register
class TaskBudgetStopped(_TaskDispatchEvent):
    """Dispatch stops this admitted task: a budget with `on_limit: stop` is spent (docs/dispatch.md
    *Budgets*). Said once per task (the service folds it back at a restart). A cluster job is
    cancelled (CancelRequested of `job_id`); a managed job is cancelled for good
    (ManagedJobCancelRequested: recovery does not relaunch it, as it would after a TaskPreempted)."""

    EVENT_NAME = "task_budget_stopped"
    queue: str | None = None
    budget_id: str  # `<team>[/<user>]/<period>`
    period_key: str
    job_id: int | None = None  # None: a managed job's launch with no job queued yet
    reason: str


@register
class BudgetThresholdCrossed(Event):
    """A budget's state changed in its period: `alert` at its alert fraction, `exceeded` at
    100% (a hard one holds new work), `ok` again (a higher limit). The alerts service raises
    the soft budget alert from it. One budget, one aggregate: `<team>[/<user>]/<period>`."""

    EVENT_NAME = "budget_threshold_crossed"
    AGGREGATE = "budget"
    AGGREGATE_KEY = "budget_id"
    budget_id: str
    team: str
    user: str | None = None
    period: Literal["day", "month"]
    period_key: str  # 2026-12 or 2026-12-01 (UTC)
    state: Literal["ok", "alert", "exceeded"]
    spent_usd: float
    limit_usd: float
    fraction: float
    hard: bool
    alert_at: float = 0.8


def budget_id(team: str, user: str | None, period: str) -> str:
    return "/".join(x for x in (team, user, period) if x)


@register
class DispatchPolicyApplied(Event):
    """The policy from now on; `policy` None removes it (every held task is admitted)."""

    EVENT_NAME = "dispatch_policy_applied"
    AGGREGATE = "dispatch"
    AGGREGATE_KEY = "name"
    name: str = POLICY_ID
    policy: DispatchPolicy | None = None
    source: str = ""  # the file it came from, for `policy show`
    applied_by: str = ""
