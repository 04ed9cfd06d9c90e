"""The dispatch policy as the log carries it (DispatchPolicyApplied.policy): quotas with Kueue's
semantics, budgets in dollars. Validated from YAML, with positions, by services/dispatch/policy.py;
here only the shape and its bounds, so every reader of the log (the optimizer's gate, the
dispatch service, `spz dispatch policy show`) decodes the same model.

Lenient about keys it does not declare (a newer writer's keys survive, like every event model);
the YAML loader refuses unknown keys before it gets here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_POLICY_ITEMS = 1000  # queues, cohorts, flavors or budgets in one policy: a company, not a fleet
MAX_QUOTA = 1e9  # units of any one resource (CPUs, GiB, GPUs): past any real fleet

Quantity = Field(ge=0, le=MAX_QUOTA)
Strategy = Literal["BestEffortFIFO", "StrictFIFO"]
Market = Literal["spot", "on-demand"]


class _PolicyModel(BaseModel):
    # defer_build: a model's validator is built the first time it is used, not at import: a
    # command that reads a few event types does not pay for the hundred others (issue 21).
    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True)


class ResourceQuota(_PolicyModel):
    """Kueue's per flavor and resource: nominal quota, borrowing and lending limits (None: none)."""

    nominal: float = Quantity
    borrowing_limit: float | None = Field(default=None, ge=0, le=MAX_QUOTA)
    lending_limit: float | None = Field(default=None, ge=0, le=MAX_QUOTA)


class FlavorQuota(_PolicyModel):
    flavor: str = Field(min_length=1, max_length=63)
    # resource -> quota: `cpu`, `memory` (GiB), `gpu` (any model), or a GPU model (`A100`)
    resources: dict[str, ResourceQuota] = Field(default={}, max_length=64)  # a reservation flavor may give none


AWS_RESERVATION_ID = r"^cr-[0-9a-f]{8,32}$"  # EC2's capacity reservation ids (capacity blocks too)
MAX_RESERVED_NODES = 100_000


class AwsReservation(_PolicyModel):
    """An EC2 capacity reservation (ODCR) or capacity block: `count` instances of one type in
    one zone. Its capacity is the flavor's quota (docs/dispatch.md, *Reservations*)."""

    id: str = Field(pattern=AWS_RESERVATION_ID)
    region: str = Field(min_length=1, max_length=63)
    zone: str = Field(min_length=1, max_length=63)  # a zone name (us-east-1a) or id (use1-az4)
    instance_type: str = Field(min_length=1, max_length=63)
    count: int = Field(ge=1, le=MAX_RESERVED_NODES)


class SlurmReservation(_PolicyModel):
    """A Slurm reservation (`scontrol create reservation`) on one cluster; `nodes`: how many
    nodes it holds, the flavor's quota (None: Slurm alone decides what fits)."""

    cluster: str = Field(min_length=1, max_length=63)
    name: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    nodes: int | None = Field(default=None, ge=1, le=MAX_RESERVED_NODES)


class Reservation(_PolicyModel):
    """Exactly one of: an ODCR, a capacity block, a Slurm reservation (policy.py checks one)."""

    aws: AwsReservation | None = None
    aws_capacity_block: AwsReservation | None = None
    slurm: SlurmReservation | None = None


class Flavor(_PolicyModel):
    """Where a task may run under this flavor: an infra (`local`, `aws`), a market; None: any.
    With a reservation, only there (its infra, and for AWS its region, zone and type)."""

    name: str = Field(min_length=1, max_length=63)
    infra: str | None = Field(default=None, max_length=63)
    market: Market | None = None
    reservation: Reservation | None = None


class Cohort(_PolicyModel):
    name: str = Field(min_length=1, max_length=63)
    parent: str | None = Field(default=None, max_length=63)
    # A cohort's own quota is an extra pool its members may borrow (Kueue's Cohort nominalQuota).
    quotas: list[FlavorQuota] = Field(default=[], max_length=64)


class UserLimit(_PolicyModel):
    """A cap on what one user of the queue's team holds at once, over every flavor."""

    user: str = Field(min_length=1, max_length=63)
    resources: dict[str, float] = Field(max_length=64)


class Preemption(_PolicyModel):
    """Kueue's ClusterQueue `.spec.preemption` (services/dispatch/preempt.py)."""

    within_queue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = "Never"
    reclaim_within_cohort: Literal["Never", "LowerPriority", "Any"] = "Never"


class Queue(_PolicyModel):
    """A ClusterQueue: one team's quota, in a cohort or alone."""

    name: str = Field(min_length=1, max_length=63)
    team: str = Field(min_length=1, max_length=63)
    cohort: str | None = Field(default=None, max_length=63)
    strategy: Strategy = "BestEffortFIFO"
    quotas: list[FlavorQuota] = Field(default=[], max_length=64)
    users: list[UserLimit] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    preemption: Preemption = Preemption()


class Budget(_PolicyModel):
    """Dollars per period for a team (or one user of it), from the ledger's recorded cost."""

    team: str = Field(min_length=1, max_length=63)
    user: str | None = Field(default=None, max_length=63)
    period: Literal["day", "month"]
    limit_usd: float = Field(gt=0, le=1e12)
    hard: bool = True  # hold new work at 100% (soft: alert only)
    alert_at: float = Field(default=0.8, gt=0, le=1)
    # At 100%: `hold` new work only; `stop` also cancels the running work it is charged for
    # (services/dispatch/budgetstop.py). `stop` needs `hard` (policy.py says so with a position).
    on_limit: Literal["hold", "stop"] = "hold"


UINT32 = 0xFFFFFFFF
MAX_DURATION_S = 10 * 365 * 86400  # ten years: any PriorityMaxAge or half-life beyond is a typo


class PriorityWeights(_PolicyModel):
    """Slurm's PriorityWeight* (unsigned 32-bit integers); a factor whose weight is 0 adds nothing."""

    age: int = Field(default=0, ge=0, le=UINT32)
    fairshare: int = Field(default=0, ge=0, le=UINT32)
    jobsize: int = Field(default=0, ge=0, le=UINT32)
    qos: int = Field(default=0, ge=0, le=UINT32)


class TeamShares(_PolicyModel):
    """A team's RawShares in the fairshare tree, and its users' (a user left out has 1)."""

    team: str = Field(min_length=1, max_length=63)
    shares: int = Field(default=1, ge=0, le=UINT32 - 1)
    users: dict[str, Annotated[int, Field(ge=0, le=UINT32 - 1)]] = Field(default={}, max_length=100_000)


class PriorityClass(_PolicyModel):
    """A task's `priority_class` (SkyPilot's resources key): Slurm's QOS priority, Kueue's
    WorkloadPriorityClass value; the QOS factor is the value over the highest class's."""

    name: str = Field(min_length=1, max_length=63)
    value: int = Field(ge=0, le=UINT32)


class PriorityConfig(_PolicyModel):
    """Slurm's multifactor priority (docs/dispatch.md, *Priority in admission*): the order in
    which pending tasks are admitted. Durations are seconds."""

    weights: PriorityWeights = PriorityWeights()
    # PriorityWeightTRES, per resource of a request (`cpu`, `memory`, `gpu`, a GPU model)
    tres_weights: dict[str, Annotated[float, Field(ge=0, le=UINT32)]] = Field(default={}, max_length=64)
    max_age_s: int = Field(default=7 * 86400, ge=1, le=MAX_DURATION_S)  # PriorityMaxAge
    half_life_s: int = Field(default=7 * 86400, ge=0, le=MAX_DURATION_S)  # PriorityDecayHalfLife (0: none)
    calc_period_s: int = Field(default=300, ge=1, le=86400)  # PriorityCalcPeriod
    algorithm: Literal["fair_tree", "classic"] = "fair_tree"
    favor_small: bool = False  # PriorityFavorSmall
    # The job size and TRES factors' denominators (Slurm: the cluster's totals); None: the
    # largest of the pending tasks' requests.
    cpus_total: float | None = Field(default=None, gt=0, le=MAX_QUOTA)
    nodes_total: int | None = Field(default=None, gt=0, le=1_000_000)
    tres_totals: dict[str, Annotated[float, Field(gt=0, le=MAX_QUOTA)]] = Field(default={}, max_length=64)
    shares: list[TeamShares] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    classes: list[PriorityClass] = Field(default=[], max_length=MAX_POLICY_ITEMS)


class DispatchPolicy(_PolicyModel):
    version: Literal[1] = 1
    flavors: list[Flavor] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    cohorts: list[Cohort] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    queues: list[Queue] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    budgets: list[Budget] = Field(default=[], max_length=MAX_POLICY_ITEMS)
    # A task whose team has no queue: admitted without quota, or held until one is added.
    unqueued: Literal["admit", "hold"] = "admit"
    # Slurm's multifactor priority orders admission; None: submission order (all factors 0).
    priority: PriorityConfig | None = None
