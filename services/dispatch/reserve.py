"""Reservation flavors, pure (docs/dispatch.md, *Reservations*): which tasks a reservation can
take, how much of it is left, and what the admitted task carries to placement.

A reservation's capacity is its flavor's quota, in nodes (instances), over every queue that
lists the flavor: an ODCR of 2 p4d.24xlarge holds two nodes whoever uses them. A queue's own
quota for that flavor, where it gives one, applies as well; what it does not give is not
limited there (the reservation is). A reservation is on-demand capacity of one infra (and, on
AWS, one region, zone and instance type): a spot task, or one pinned elsewhere, skips it.
"""

from __future__ import annotations

from collections.abc import Mapping

from skypurza.events.dispatch_policy import AwsReservation, Flavor, Reservation
from skypurza.events.types import ReservationRef

from .demand import Pending

NODES = "nodes"  # the resource a reservation is charged in: the task's node count
UsageRows = Mapping[str, Mapping[tuple[str, str], float]]  # quota.Usage


def kind_of(r: Reservation) -> str:
    """The kind the reservation names (the policy loader has checked there is exactly one)."""
    return "aws" if r.aws is not None else "aws_capacity_block" if r.aws_capacity_block is not None else "slurm"


def infra_of(f: Flavor) -> str | None:
    """The flavor's infra: the reservation's when it has one."""
    if f.reservation is None:
        return f.infra
    return "slurm" if f.reservation.slurm is not None else "aws"


def _aws(r: Reservation) -> AwsReservation | None:
    return r.aws or r.aws_capacity_block


def capacity(f: Flavor) -> int | None:
    """The reservation's nodes (None: not limited here: a Slurm reservation without `nodes`)."""
    r = f.reservation
    if r is None:
        return None
    aws = _aws(r)
    if aws is not None:
        return aws.count
    return r.slurm.nodes if r.slurm is not None else None


def compatible(f: Flavor, p: Pending) -> bool:
    """Whether the task may run in the flavor's reservation at all (not whether it fits now)."""
    r = f.reservation
    if r is None:
        return True
    if p.spot:
        return False  # reserved capacity is on-demand (and a capacity block its own market)
    if p.infra and p.infra != infra_of(f):
        return False
    aws = _aws(r)
    if aws is not None:
        return (p.region in (None, aws.region)) and (p.instance_type in (None, aws.instance_type))
    assert r.slurm is not None
    return p.region in (None, r.slurm.cluster)  # a Slurm task's "region" is its cluster


def used(usage: UsageRows, flavor: str) -> float:
    """Nodes of the flavor in use, over every queue."""
    return sum(row.get((flavor, NODES), 0.0) for row in usage.values())


def room(f: Flavor, p: Pending, usage: UsageRows) -> str:
    """Why the reservation cannot take the task now ("" when it can)."""
    cap = capacity(f)
    if cap is None:
        return ""
    now = used(usage, f.name)
    if now + p.nodes > cap + 1e-9:
        assert f.reservation is not None
        return (f"reservation {ref_of(f).id} (flavor {f.name}): {now:g}/{cap} nodes in use; needs {p.nodes}")
    return ""


def ref_of(f: Flavor) -> ReservationRef:
    """What the admitted task carries to placement."""
    r = f.reservation
    assert r is not None
    aws = _aws(r)
    if aws is not None:
        return ReservationRef(kind=kind_of(r), id=aws.id, region=aws.region, zone=aws.zone,  # type: ignore[arg-type]
                              instance_type=aws.instance_type)
    assert r.slurm is not None
    return ReservationRef(kind="slurm", id=r.slurm.name, cluster=r.slurm.cluster)


def booked(f: Flavor | None, p: Pending) -> dict[str, float]:
    """What admission under the flavor charges: the request, and its nodes on a reservation."""
    if f is None or f.reservation is None:
        return p.request
    return {**p.request, NODES: float(p.nodes)}
