"""Slurm allocations billed as Slurm bills them: a SlurmAllocationAccounted (what sacct said the
allocation used) → its billing under the partition's TRESBillingWeights and PriorityFlags, and
the one UsageRecorded that puts it in `usage`. Pure.

Why one usage row per allocation, at its end, and none by the tick: Slurm's billing-seconds are
`int(billing(AllocTRES)) × ElapsedRaw` of the whole allocation (sreport's and GrpTRESMins'
basis). Neither factor is known before the allocation ends, and a per-node split of a MAX_TRES
billing does not add up to the allocation's. So the meter's intervals of a Slurm node carry its
money (our price × our times) and no billing-seconds, and this row carries the billing-seconds
and no money: the sums of both are right, and the row is zero-length, so nothing that adds up
time (GPU-seconds, fairshare's billing × seconds) counts the allocation twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from skypurza.events.envelope import derive_id
from skypurza.events.models import SlurmAllocationAccounted, UsageRecorded

from .billing import billing

__all__ = ["HANDLER", "SlurmBilling", "allocation_billing", "billing_usage", "usage_event_id"]

HANDLER = "ledger-meter"


@dataclass(frozen=True)
class SlurmBilling:
    billing_int: int  # the integer Slurm stores (AllocTRES billing=)
    billing_double: float  # the untruncated billable_tres
    billing_seconds: int  # billing_int × elapsed
    error: str = ""  # why Slurm's own stored billing was used instead of the weights


def allocation_billing(ev: SlurmAllocationAccounted) -> SlurmBilling:
    """The allocation's billing under the weights and flags it carries.

    When the weights or flags cannot be read here (a form Slurm accepts that we do not), the
    billing Slurm itself stored is used and the reason kept: Slurm's number is the one to match.
    """
    try:
        res = billing(ev.billing_weights, dict(ev.alloc_tres), ev.priority_flags)
        b_int, b_dbl, error = res.billing_int, res.billing_double, ""
    except ValueError as exc:
        if ev.slurm_billing is None:
            b_int, b_dbl = int(ev.alloc_tres.get("cpu", 0)), float(ev.alloc_tres.get("cpu", 0))
            error = f"{exc}; billed by CPUs"
        else:
            b_int, b_dbl = ev.slurm_billing, float(ev.slurm_billing)
            error = f"{exc}; billed with Slurm's stored billing"
    return SlurmBilling(b_int, b_dbl, b_int * ev.elapsed_s, error)


def usage_event_id(accounted_event_id: str) -> str:
    """The id of the usage row that bills an accounted allocation (the same for every meter)."""
    return derive_id(accounted_event_id, HANDLER, "slurm-billing")


def billing_usage(row: dict[str, Any], cluster: dict[str, Any] | None, team: str | None) -> UsageRecorded:
    """The zero-length usage row, at the allocation's end, that carries its billing-seconds."""
    c = cluster or {}
    tres = json.loads(row["alloc_tres"] or "{}")
    seconds = row["elapsed_s"] or 0
    return UsageRecorded(
        cluster=row["cluster"], rank=0, instance_id=f"{row['slurm_job_id']}.0", start=row["end_at"],
        end=row["end_at"], instance_type=c.get("instance_type"), infra="slurm", region=row["slurm_cluster"],
        zone=row["partition"] or None, hourly_price_micros=0, cost_micros=0, tres=tres,
        billing_seconds=row["billing_seconds"], billing=(row["billing_seconds"] / seconds) if seconds else 0.0,
        user=c.get("user") or "", team=team, project=c.get("project"), final=False, correction=False,
        lifetime_id="")
