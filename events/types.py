"""Value types shared by several events (not events themselves)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Market = Literal["spot", "on-demand"]

# How the provisioner classifies a failed launch; the optimizer maps each to a block scope.
ErrorClass = Literal[
    "capacity",  # the zone has no capacity for the type: block the zone
    "spot_capacity",  # no spot capacity / price too low: block the spot market there
    "quota",  # quota or vCPU limit: block the region
    "unsupported",  # the configuration cannot work there: block the candidate
    "auth",  # credentials/permissions: fatal, actionable
    "transient",  # throttling/5xx: retried by the provisioner, surfaced only when retries run out
    "other",
]


class Value(BaseModel):
    # defer_build: a model's validator is built the first time it is used, not at import: a
    # command that reads a few event types does not pay for the hundred others (issue 21).
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)


ReservationKind = Literal["aws", "aws_capacity_block", "slurm"]


class ReservationRef(Value):
    """The reservation a placement launches into (docs/dispatch.md, *Reservations*): an AWS
    capacity reservation or capacity block (`id`: cr-…), or a Slurm reservation (`id`: its name,
    on `cluster`)."""

    kind: ReservationKind
    id: str = Field(min_length=1, max_length=128)
    cluster: str | None = Field(default=None, max_length=63)
    # AWS: where the reservation is, so placement is confined to it
    region: str | None = Field(default=None, max_length=63)
    zone: str | None = Field(default=None, max_length=63)
    instance_type: str | None = Field(default=None, max_length=63)


def _is_none(value: object) -> bool:
    return value is None


class Candidate(Value):
    """One place a task can run: what the optimizer ranks and the provisioner launches."""

    infra: str  # "aws", "local"
    region: str | None = None
    zone: str | None = None  # None: any zone of the region will do
    zones: list[str] = []  # zones the provisioner may try in this region (ids), cheapest first
    instance_type: str | None = None
    accelerators: dict[str, float] | None = None
    use_spot: bool = False
    vcpus: float | None = None
    memory_gib: float | None = None
    hourly_price_micros: int = 0  # one node, integer micro-dollars per hour
    num_nodes: int = 1
    image_id: str | None = None
    disk_size_gb: int | None = None
    # Launch into this reservation (dispatch's flavor). A placement with no reservation is written
    # exactly as before the field existed, so old logs, goldens and every reader that compares
    # candidates see no change. A field-level `exclude_if`, not a wrap serializer: that one ran a
    # Python hook around every candidate's whole dump (2.5x the cost of a PlacementChosen's JSON,
    # issue 21).
    reservation: ReservationRef | None = Field(default=None, exclude_if=_is_none)

    @property
    def market(self) -> Market:
        return "spot" if self.use_spot else "on-demand"

    @property
    def total_hourly_price_micros(self) -> int:
        return self.hourly_price_micros * self.num_nodes

    def label(self) -> str:
        where = "/".join(p for p in (self.infra, self.region, self.zone) if p)
        return f"{where} {self.instance_type or ''} {self.market}".strip()


class NodeInfo(Value):
    rank: int
    instance_id: str
    private_ip: str | None = None
    public_ip: str | None = None
    zone: str | None = None
    # local infra: where this node's agent keeps its files
    workdir: str | None = None


class Attempt(Value):
    """One placement that was tried and what came of it (for PlacementFailed)."""

    candidate: Candidate
    error_class: ErrorClass
    code: str
    message: str
