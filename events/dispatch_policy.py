"""The dispatch policy as the log carries it (DispatchPolicyApplied.policy): quotas with Kueue's
semantics, budgets in dollars. Validated from YAML, with positions, by services/dispatch/policy.py;
here only the shape and its bounds, so every reader of the log (the optimizer's gate, the
dispatch service, `spz dispatch policy show`) decodes the same model.

Lenient about keys it does not declare (a newer writer's keys survive, like every event model);
the YAML loader refuses unknown keys before it gets here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_POLICY_ITEMS = 1000  # queues, cohorts, flavors or budgets in one policy: a company, not a fleet
MAX_QUOTA = 1e9  # units of any one resource (CPUs, GiB, GPUs): past any real fleet

Quantity = Field(ge=0, le=MAX_QUOTA)
Strategy = Literal["BestEffortFIFO", "StrictFIFO"]
Market = Literal["spot", "on-demand"]


class _PolicyModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")


class ResourceQuota(_PolicyModel):
    """Kueue's per flavor and resource: nominal quota, borrowing and lending limits (None: none)."""

    nominal: float = Quantity
    borrowing_limit: float | None = Field(default=None, ge=0, le=MAX_QUOTA)
    lending_limit: float | None = Field(default=None, ge=0, le=MAX_QUOTA)


class FlavorQuota(_PolicyModel):
    flavor: str = Field(min_length=1, max_length=63)
    # resource -> quota: `cpu`, `memory` (GiB), `gpu` (any model), or a GPU model (`A100`)
    resources: dict[str, ResourceQuota] = Field(max_length=64)


class Flavor(_PolicyModel):
    """Where a task may run under this flavor: an infra (`local`, `aws`), a market; None: any."""

    name: str = Field(min_length=1, max_length=63)
    infra: str | None = Field(default=None, max_length=63)
    market: Market | None = None


class Cohort(_PolicyModel):
    name: str = Field(min_length=1, max_length=63)
    parent: str | None = Field(default=None, max_length=63)
    # A cohort's own quota is an extra pool its members may borrow (Kueue's Cohort nominalQuota).
    quotas: list[FlavorQuota] = Field(default=[], max_length=64)


class UserLimit(_PolicyModel):
    """A cap on what one user of the queue's team holds at once, over every flavor."""

    user: str = Field(min_length=1, max_length=63)
    resources: dict[str, float] = Field(max_length=64)


class Queue(_PolicyModel):
    """A ClusterQueue: one team's quota, in a cohort or alone."""

    name: str = Field(min_length=1, max_length=63)
    team: str = Field(min_length=1, max_length=63)
    cohort: str | None = Field(default=None, max_length=63)
    strategy: Strategy = "BestEffortFIFO"
    quotas: list[FlavorQuota] = Field(default=[], max_length=64)
    users: list[UserLimit] = Field(default=[], max_length=MAX_POLICY_ITEMS)


class Budget(_PolicyModel):
    """Dollars per period for a team (or one user of it), from the ledger's recorded cost."""

    team: str = Field(min_length=1, max_length=63)
    user: str | None = Field(default=None, max_length=63)
    period: Literal["day", "month"]
    limit_usd: float = Field(gt=0, le=1e12)
    hard: bool = True  # hold new work at 100% (soft: alert only)
    alert_at: float = Field(default=0.8, gt=0, le=1)


class DispatchPolicy(_PolicyModel):
    version: Literal[1] = 1
    flavors: list[Flavor] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    cohorts: list[Cohort] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    queues: list[Queue] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    budgets: list[Budget] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    # A task whose team has no queue: admitted without quota, or held until one is added.
    unqueued: Literal["admit", "hold"] = "admit"
