"""Build the shipped catalog file from public AWS facts (SkyPilot-style `vms.csv` columns).

    python -m skypurza.services.optimizer.catalog.build   # facts from facts/ beside this module

writes `aws.json` next to this module. Only what the facts say goes in: an empty Price or
SpotPrice stays unknown (null), zone IDs stay zone IDs, and no default image is invented.
"""

from __future__ import annotations

import argparse
import ast
import csv
import datetime as dt
import sys
from pathlib import Path
from typing import Iterable

from . import codec
from .model import Catalog, InstanceType, Offering, ZoneOffer, dollars_to_micros, is_local_zone_id
from .sanity import spot_anomalies

SHIPPED_FILE = Path(__file__).with_name("aws.json")
# The public facts the shipped file is built from, kept in the repository (facts/README.md says
# what they are): the build and its test need nothing outside the checkout.
FACTS_DIR = Path(__file__).with_name("facts")


def _gpu_memory_mib(gpu_info: str) -> int | None:
    if not gpu_info.strip():
        return None
    info = ast.literal_eval(gpu_info)  # a Python-literal dict, never code: literal_eval only
    gpus = info.get("Gpus") or []
    if not gpus:
        return None
    return int(gpus[0].get("MemoryInfo", {}).get("SizeInMiB") or 0) or None


def _count(value: str) -> int:
    f = float(value)
    if not f.is_integer():
        raise ValueError(f"fractional accelerator count {value!r} in an AWS row")
    return int(f)


def catalog_from_rows(rows: Iterable[dict[str, str]], *, accelerator_clouds: dict[str, tuple[str, ...]],
                      source: str, built_at: str | None = None) -> Catalog:
    types: dict[str, InstanceType] = {}
    # (type, region) -> [on-demand micros | None, {zone: spot | None}]
    per_region: dict[tuple[str, str], tuple[set[int | None], dict[str, int | None]]] = {}
    for r in rows:
        name = r["InstanceType"].strip()
        acc = r["AcceleratorName"].strip() or None
        t = InstanceType(
            name=name, vcpus=float(r["vCPUs"]), memory_gib=float(r["MemoryGiB"]),
            accelerator=acc, accelerator_count=_count(r["AcceleratorCount"]) if acc else 0,
            gpu_memory_mib=_gpu_memory_mib(r.get("GpuInfo", "")), arch=r.get("Arch", "").strip() or "x86_64",
        )
        if types.setdefault(name, t) != t:
            raise ValueError(f"instance type {name} has conflicting rows: {types[name]} vs {t}")
        od = dollars_to_micros(r["Price"]) if r["Price"].strip() else None
        spot = dollars_to_micros(r["SpotPrice"]) if r["SpotPrice"].strip() else None
        prices, zones = per_region.setdefault((name, r["Region"].strip()), (set(), {}))
        prices.add(od)
        zones[r["AvailabilityZone"].strip()] = spot
    offerings = []
    for (name, region), (prices, zones) in per_region.items():
        known = {p for p in prices if p is not None}
        if len(known) > 1:
            raise ValueError(f"{name} in {region}: on-demand price differs between zones: {sorted(known)}")
        od = known.pop() if known else None
        offerings.append(Offering(name, region, od, tuple(ZoneOffer(z, s) for z, s in zones.items())))
    odd = spot_anomalies(offerings)
    if odd:  # the optimizer would place on them first: refuse the facts, naming each price
        raise ValueError("implausible spot prices: " + "; ".join(a.message() for a in odd[:10])
                         + (f"; and {len(odd) - 10} more" if len(odd) > 10 else ""))
    local = frozenset(z for o in offerings for z, _ in o.zones if is_local_zone_id(z))
    return Catalog.from_parts(
        cloud="aws", built_at=built_at or now_iso(), source=source, types=types.values(),
        offerings=offerings, accelerator_clouds=accelerator_clouds, local_zones=local,
        notes=("on-demand price is per region; spot price per zone ID; "
               "null price = not sold in that market or not known",),
    )


def read_accelerators(path: Path) -> dict[str, tuple[str, ...]]:
    with path.open(newline="") as f:
        return {
            r["AcceleratorName"].strip(): tuple(ast.literal_eval(r["Clouds"]) if r["Clouds"].strip() else ())
            for r in csv.DictReader(f)
        }


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def build(vms: Path, accelerators: Path, out: Path = SHIPPED_FILE, built_at: str | None = None) -> Catalog:
    with vms.open(newline="") as f:
        cat = catalog_from_rows(
            csv.DictReader(f), accelerator_clouds=read_accelerators(accelerators),
            source=(f"public AWS facts ({vms.name}: SkyPilot catalog schema v8, AWS subset) "
                    "built by skypurza.services.optimizer.catalog.build"),
            built_at=built_at,
        )
    out.write_text(codec.dumps(cat))
    return cat


def main(argv: list[str] | None = None) -> int:
    default_facts = FACTS_DIR
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vms", type=Path, default=default_facts / "aws_vms.csv")
    p.add_argument("--accelerators", type=Path, default=default_facts / "accelerators.csv")
    p.add_argument("--out", type=Path, default=SHIPPED_FILE)
    p.add_argument("--built-at", default=None, help="ISO time to record (default: now)")
    a = p.parse_args(argv)
    cat = build(a.vms, a.accelerators, a.out, a.built_at)
    n_off = sum(1 for _ in cat.all_offerings())
    print(f"wrote {a.out}: {len(cat.types)} instance types, {n_off} region offerings, "
          f"{len(cat.regions)} regions, built {cat.built_at}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
