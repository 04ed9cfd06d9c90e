"""The control plane's monthly compute cost per stage, from the catalog's on-demand prices for the
instances the stacks create (3 bus nodes, the service hosts). Pure: prices come in as a function."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import BUS_NODES, InfraConfig, StageConfig

HOURS_PER_MONTH = 730  # AWS's own monthly convention (8,760 h / 12)


@dataclass(frozen=True)
class Line:
    stage: str
    region: str
    what: str
    instance_type: str
    count: int
    hourly_micros: int

    @property
    def monthly_micros(self) -> int:
        return self.count * self.hourly_micros * HOURS_PER_MONTH


def stage_lines(cfg: StageConfig, price: Callable[[str, str], int]) -> list[Line]:
    return [Line(cfg.stage, cfg.region, "bus nodes", cfg.bus_instance_type, BUS_NODES,
                 price(cfg.region, cfg.bus_instance_type)),
            Line(cfg.stage, cfg.region, "service hosts", cfg.service_instance_type, cfg.service_instances,
                 price(cfg.region, cfg.service_instance_type))]


def monthly_costs(infra: InfraConfig, price: Callable[[str, str], int]) -> list[Line]:
    return [line for cfg in infra.stages for line in stage_lines(cfg, price)]


def catalog_price(catalog) -> Callable[[str, str], int]:
    """On-demand micro-dollars per hour of a type in a region, from a SkyPurza catalog."""
    def price(region: str, instance_type: str) -> int:
        for o in catalog.offerings(instance_type):
            if o.region == region and o.ondemand_micros is not None:
                return o.ondemand_micros
        raise LookupError(f"the catalog has no on-demand price of {instance_type} in {region}")
    return price


def render(lines: list[Line]) -> str:
    """A Markdown table, one row per line and a total per stage (dollars, two decimals)."""
    out = ["| stage | region | what | type | count | $/hour each | $/month |", "|---|---|---|---|---|---|---|"]
    totals: dict[str, int] = {}
    for ln in lines:
        out.append(f"| {ln.stage} | {ln.region} | {ln.what} | {ln.instance_type} | {ln.count} | "
                   f"{ln.hourly_micros / 1e6:.3f} | {ln.monthly_micros / 1e6:,.2f} |")
        totals[ln.stage] = totals.get(ln.stage, 0) + ln.monthly_micros
    for stage, micros in totals.items():
        out.append(f"| **{stage}** | | **compute total** | | | | **{micros / 1e6:,.2f}** |")
    return "\n".join(out) + "\n"


def main() -> None:
    from skypurza.services.optimizer.catalog.loader import shipped_catalog

    from .config import load

    print(render(monthly_costs(load(), catalog_price(shipped_catalog()))), end="")
