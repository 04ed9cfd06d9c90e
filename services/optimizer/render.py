"""Rendering helpers: plain data (lists of dicts) for `gpus list` and `launch --dryrun`.

Pure functions; the CLI turns the rows into rich tables or JSON. Prices appear both as
integer micro-dollars (`*_micros`) and as dollars for display (`hourly_price` ...).
"""

from __future__ import annotations

import re
from typing import Any

from .catalog.model import Catalog, InstanceType, micros_to_dollars
from .local import LocalResources
from .placement import Candidate, PlacementPlan

# What `gpus list` shows without --all (SkyPilot shows "common" GPUs the same way).
COMMON_ACCELERATORS = frozenset({
    "A10G", "A100", "A100-80GB", "B200", "H100", "H200", "L4", "L40S", "T4", "V100", "V100-32GB",
})


def _d(micros: int | None) -> float | None:
    return None if micros is None else micros_to_dollars(micros)


def parse_accelerator_arg(text: str) -> tuple[str, float | None]:
    """`A100`, `a100:8`, `H100:0.5` -> (name, count or None)."""
    m = re.fullmatch(r"\s*([^:]+?)\s*(?::\s*([0-9]*\.?[0-9]+)\s*)?", text)
    if not m:
        raise ValueError(f"not an accelerator: {text!r} (use NAME or NAME:COUNT)")
    return m.group(1), float(m.group(2)) if m.group(2) else None


def spot_saving(spot_micros: int | None, ondemand_micros: int | None) -> float | None:
    """What spot saves against on-demand of the same type in the same region (0.9 = 90% less);
    None when either is unknown. Like with like: never the cheapest on-demand region against
    the cheapest spot zone elsewhere (`gpus list H100` once showed spot above on-demand so)."""
    if spot_micros is None or not ondemand_micros:
        return None
    return round(1 - spot_micros / ondemand_micros, 4)


def _prices(cat: Catalog, t: InstanceType, region: str | None) -> dict[str, Any]:
    """Cheapest on-demand (per region) and spot (per zone) of one type, and the cheapest regions.

    The two cheapest places differ (p5.4xlarge: on-demand cheapest in us-east-1, which sells no
    spot; spot cheapest in ap-south-1), so the spot price comes with its own region's on-demand
    price (`spot_region_hourly_price`) and the saving between those two (`spot_saving`)."""
    od: list[tuple[int, str]] = []
    spot: list[tuple[int, str, str]] = []
    od_in: dict[str, int] = {}
    for o in cat.offerings(t.name):
        if region and o.region != region:
            continue
        if o.ondemand_micros is not None:
            od.append((o.ondemand_micros, o.region))
            od_in[o.region] = o.ondemand_micros
        for z in o.zones:
            if z.spot_micros is not None and not cat.is_local_zone(z.zone):
                spot.append((z.spot_micros, o.region, z.zone))
    od.sort()
    spot.sort()
    spot_od = od_in.get(spot[0][1]) if spot else None
    return {
        "hourly_price_micros": od[0][0] if od else None,
        "hourly_price": _d(od[0][0]) if od else None,
        "region": od[0][1] if od else None,
        "hourly_spot_price_micros": spot[0][0] if spot else None,
        "hourly_spot_price": _d(spot[0][0]) if spot else None,
        "spot_region": spot[0][1] if spot else None,
        "spot_zone": spot[0][2] if spot else None,
        "spot_region_hourly_price_micros": spot_od,
        "spot_region_hourly_price": _d(spot_od),
        "spot_saving": spot_saving(spot[0][0] if spot else None, spot_od),
        "cheapest_regions": [r for _, r in od[:3]],
        "regions": len({o.region for o in cat.offerings(t.name) if not region or o.region == region}),
    }


def gpus_list_rows(cat: Catalog, accelerator: str | None = None, count: float | None = None,
                   region: str | None = None, show_all: bool = False,
                   all_regions: bool = False) -> list[dict[str, Any]]:
    """Rows like `sky gpus list`.

    Without `accelerator`: one row per accelerator (counts, instance types, cheapest regions)
    priced by one of its instance types, the cheapest on demand (`priced_instance_type`): its
    cheapest on-demand and spot prices. With it: one row per instance type that has it
    (optionally only `count`), priced at its cheapest region -- or one row per region when
    `all_regions`. `region` restricts everything to one region.
    """
    if accelerator is None:
        rows = []
        for acc in cat.accelerators():
            if not show_all and acc not in COMMON_ACCELERATORS:
                continue
            types = [t for t in cat.types_with_accelerator(acc)
                     if not region or any(o.region == region for o in cat.offerings(t.name))]
            if not types:
                continue
            priced = [(t, _prices(cat, t, region)) for t in types]
            od = [(p["hourly_price_micros"], p["region"], t.name) for t, p in priced if p["hourly_price_micros"]]
            od.sort()
            regions: list[str] = []
            for _, r, _n in od:
                if r not in regions:
                    regions.append(r)
            # Both prices are one instance type's (the cheapest on demand, else the cheapest spot):
            # the minimum of each over all types mixed sizes (a 1-GPU on-demand price beside an
            # 8-GPU spot one) and so could show spot above on-demand.
            by_name = {t.name: p for t, p in priced}
            sp = sorted((p["hourly_spot_price_micros"], t.name) for t, p in priced if p["hourly_spot_price_micros"])
            first = od[0][2] if od else (sp[0][1] if sp else None)
            p = by_name.get(first) if first else None
            rows.append({
                "accelerator": acc,
                "counts": sorted({t.accelerator_count for t in types}),
                "instance_types": sorted(t.name for t in types),
                "priced_instance_type": first,
                "hourly_price_micros": p["hourly_price_micros"] if p else None,
                "hourly_price": p["hourly_price"] if p else None,
                "hourly_spot_price_micros": p["hourly_spot_price_micros"] if p else None,
                "hourly_spot_price": p["hourly_spot_price"] if p else None,
                "spot_zone": p["spot_zone"] if p else None,
                "spot_saving": p["spot_saving"] if p else None,
                "cheapest_regions": regions[:3],
            })
        return rows
    name = cat.canonical_accelerator(accelerator) or accelerator
    rows = []
    for t in cat.types_with_accelerator(name):
        if count is not None and t.accelerator_count != count:
            continue
        base = {
            "accelerator": name, "count": t.accelerator_count, "instance_type": t.name,
            "gpu_memory_gib": round(t.gpu_memory_mib / 1024, 1) if t.gpu_memory_mib else None,
            "vcpus": t.vcpus, "memory_gib": t.memory_gib,
        }
        if all_regions:
            for o in cat.offerings(t.name):
                if region and o.region != region:
                    continue
                rows.append({**base, **_prices(cat, t, o.region)})
        else:
            p = _prices(cat, t, region)
            if p["regions"]:
                rows.append({**base, **p})
    rows.sort(key=lambda r: (r["count"], r["hourly_price_micros"] is None, r["hourly_price_micros"] or 0,
                             r["instance_type"], r.get("region") or ""))
    return rows


def local_gpus_rows(local: LocalResources) -> list[dict[str, Any]]:
    return [{"accelerator": n, "count": c, "instance_type": "local", "hourly_price_micros": 0,
             "hourly_price": 0.0, "region": None} for n, c in sorted(local.gpus.items())]


def candidate_json(c: Candidate) -> dict[str, Any]:
    return {
        "infra": c.infra, "region": c.region, "zone": c.zone, "zones": list(c.zones),
        "instance_type": c.instance_type, "accelerators": c.accelerators, "use_spot": c.use_spot,
        "vcpus": c.vcpus, "memory_gib": c.memory_gib, "image_id": c.image_id,
        "disk_size_gb": c.disk_size_gb, "num_nodes": c.num_nodes,
        "hourly_price": micros_to_dollars(c.hourly_price_micros),
        "total_hourly_price": micros_to_dollars(c.total_hourly_price_micros),
        "hourly_price_micros": c.hourly_price_micros,
        "total_hourly_price_micros": c.total_hourly_price_micros,
    }


def dryrun_rows(plan: PlacementPlan, limit: int | None = 10) -> list[dict[str, Any]]:
    """Table rows: rank, chosen mark, place, type, accelerators, market, $/h one node and total."""
    rows = []
    for i, c in enumerate(plan.candidates[:limit] if limit else plan.candidates):
        accs = ", ".join(f"{n}:{v:g}" for n, v in (c.accelerators or {}).items()) or "-"
        rows.append({
            "rank": i + 1, "chosen": i == 0, "infra": c.infra, "region": c.region or "-",
            "zone": c.zone or "-", "instance_type": c.instance_type, "accelerators": accs,
            "vcpus": c.vcpus, "memory_gib": c.memory_gib, "market": c.market,
            "hourly_price": micros_to_dollars(c.hourly_price_micros),
            "total_hourly_price": micros_to_dollars(c.total_hourly_price_micros),
        })
    return rows


def dryrun_json(plan: PlacementPlan, catalog: Catalog | None = None, limit: int | None = None) -> dict[str, Any]:
    """`launch --dryrun -o json`: `chosen` and the ranked `candidates` (chosen first)."""
    cands = plan.candidates[:limit] if limit else plan.candidates
    out: dict[str, Any] = {
        "chosen": candidate_json(plan.chosen) if plan.chosen else None,
        "candidates": [candidate_json(c) for c in cands],
        "num_candidates": len(plan.candidates),
        "num_nodes": plan.num_nodes,
        "feasible": plan.feasible,
        "reason": plan.reason,
        "notes": list(plan.notes),
    }
    if catalog is not None:
        out["catalog"] = {"built_at": catalog.built_at, "source": catalog.source,
                          "spot_refreshed_at": dict(catalog.spot_refreshed_at)}
    return out
