"""What a submission asks of the quota, pure: its first resource alternative times its nodes
(`cpu`, `memory` in GiB, `gpu` and the GPU model by name), where it is pinned (infra) and
whether it runs on spot. The quota charges the first alternative: a task with `any_of` is
charged for its first choice, which is what the optimizer tries first as well."""

from __future__ import annotations

from dataclasses import dataclass, field

from skypurza.events.jobdemand import demand_options
from skypurza.events.models import TaskSubmitted


@dataclass(frozen=True)
class Pending:
    """A submission waiting for admission, as admit.py decides on it."""

    task_id: str
    cluster: str
    seq: int
    team: str | None
    user: str
    request: dict[str, float] = field(default_factory=dict)
    infra: str | None = None
    spot: bool = False
    managed_job_id: int | None = None
    priority: float = 0.0
    # What Slurm's multifactor priority reads (order.py): when it was stored (epoch seconds:
    # the age factor), its nodes, its priority class (the QOS factor) and SkyPilot's integer
    # `priority` (-1000..1000), added to the sum as Slurm's `nice` is subtracted.
    submitted_at: float = 0.0
    nodes: int = 1
    priority_class: str | None = None
    boost: int = 0
    # Where the task pins itself beyond the infra: a reservation of another region or type
    # cannot take it (reserve.py).
    region: str | None = None
    instance_type: str | None = None


def request_of(ev: TaskSubmitted) -> dict[str, float]:
    d = demand_options(ev.task)[0]
    nodes = max(1, ev.num_nodes)
    out = {"cpu": d.cpus * nodes}
    if d.memory_gib:
        out["memory"] = d.memory_gib * nodes
    if d.accelerator and d.accelerator_count > 0:
        out["gpu"] = d.accelerator_count * nodes
        out[d.accelerator] = d.accelerator_count * nodes
    return out


def infra_of(ev: TaskSubmitted) -> str | None:
    res = ev.task.resources
    if res is None:
        return None
    pin = res.infra or res.cloud
    return pin.split("/", 1)[0].strip().lower() or None if pin else None


def region_of(ev: TaskSubmitted) -> str | None:
    """The region the task pins (`infra: aws/REGION[/ZONE]`, or the legacy `region`)."""
    res = ev.task.resources
    if res is None:
        return None
    parts = (res.infra or "").split("/")
    pin = parts[1].strip() if len(parts) > 1 else (res.region or "")
    return pin if pin and pin != "*" else None


def pending_of(ev: TaskSubmitted, seq: int, user: str, team: str | None, submitted_at: float = 0.0) -> Pending:
    res = ev.task.resources
    return Pending(task_id=ev.task_id, cluster=ev.cluster, seq=seq, team=team, user=user, request=request_of(ev),
                   infra=infra_of(ev), spot=bool(res is not None and res.use_spot),
                   managed_job_id=ev.managed_job_id, submitted_at=submitted_at, nodes=max(1, ev.num_nodes),
                   priority_class=res.priority_class if res is not None else None,
                   boost=(res.priority or 0) if res is not None else 0,
                   region=region_of(ev), instance_type=res.instance_type if res is not None else None)
