"""Placement inside a reservation, pure (docs/dispatch.md, *Reservations*): the candidates of a
ranked plan that a reservation can hold, pinned to it.

An AWS reservation (ODCR or capacity block) is one instance type in one zone of one region, on
demand: a candidate of that type in that region is pinned to the reservation's zone (the
reservation is there whatever zones the catalog lists). A Slurm reservation is on one cluster:
a candidate of that cluster, any partition. Nothing else survives; the ranking is kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from skypurza.events.types import ReservationRef

from .placement import Candidate


def restrict(c: Candidate, ref: ReservationRef) -> Candidate | None:
    """`c` confined to the reservation, or None when the reservation cannot hold it."""
    if ref.kind == "slurm":
        return c if c.infra == "slurm" and c.region == ref.cluster else None
    if c.infra != "aws" or c.use_spot or c.region != ref.region or c.instance_type != ref.instance_type:
        return None
    return c._replace(zone=ref.zone, zones=(ref.zone,)) if ref.zone else c


def within(candidates: Sequence[Candidate], ref: ReservationRef) -> list[Candidate]:
    return [r for c in candidates if (r := restrict(c, ref)) is not None]


def refusal(ref: ReservationRef, why: str) -> str:
    where = (f"{ref.instance_type} in {ref.zone or ref.region}" if ref.kind != "slurm"
             else f"Slurm cluster {ref.cluster}")
    return f"admitted to reservation {ref.id} ({where}), but no placement of the task fits there: {why}"
