"""Spot prices that cannot be right, found before they reach a placement.

AWS caps a spot price at the on-demand price of the same type in the same region, and its
published spot prices do not go below about a tenth of it (the floor of an idle pool: 71 rows
of the shipped facts sit at exactly 10%, p5en.48xlarge in eu-south-2 among them, $6.836 against
$68.36 there). So, for one instance type in one region:

- spot above on-demand (beyond the rounding of the published prices) is wrong;
- spot below `FLOOR_FRACTION` (5%) of on-demand is below anything AWS publishes: a unit or
  parsing mistake (a price per GPU, a missing digit), not a bargain.

Pure: `spot_anomalies(catalog)` lists them; the build refuses such facts and `catalog refresh`
notes them (the optimizer would otherwise choose them first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .model import Offering, micros_to_dollars

FLOOR_FRACTION = 0.05
# Published prices are rounded to 4-6 decimals: 27.43298 on demand, 27.433 spot is one price.
ROUNDING = 1e-4


@dataclass(frozen=True)
class PriceAnomaly:
    instance_type: str
    region: str
    zone: str
    spot_micros: int
    ondemand_micros: int
    kind: str  # "above_ondemand" | "below_floor"

    def message(self) -> str:
        spot, od = micros_to_dollars(self.spot_micros), micros_to_dollars(self.ondemand_micros)
        what = ("above the on-demand price" if self.kind == "above_ondemand"
                else f"below {FLOOR_FRACTION:.0%} of the on-demand price")
        return (f"{self.instance_type} in {self.region} ({self.zone}): spot ${spot:,.4f}/h is {what} "
                f"${od:,.4f}/h of the same type and region")


def spot_anomalies(offerings: Iterable[Offering]) -> list[PriceAnomaly]:
    out = []
    for o in offerings:
        if not o.ondemand_micros:
            continue  # not sold on demand there (p5e.48xlarge): nothing to compare with
        for z in o.zones:
            if z.spot_micros is None:
                continue
            if z.spot_micros > o.ondemand_micros * (1 + ROUNDING):
                kind = "above_ondemand"
            elif z.spot_micros < o.ondemand_micros * FLOOR_FRACTION:
                kind = "below_floor"
            else:
                continue
            out.append(PriceAnomaly(o.instance_type, o.region, z.zone, z.spot_micros, o.ondemand_micros, kind))
    return out
