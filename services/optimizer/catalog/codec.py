"""The shipped catalog file format (JSON, pre-indexed by instance type) and its codec.

One JSON object, so a cold process pays one `json.loads` (C decoder) and no CSV parsing:

    {"format": "spz-catalog", "version": 1, "cloud": "aws",
     "built_at": "2026-11-30T16:00:00Z", "source": "...", "notes": [...],
     "price_unit": "micro-USD/hour",
     "accelerators": {"A100": ["AWS", "GCP", ...], ...},      # canonical names, for normalising
     "types": {"p4d.24xlarge": [96, 1152, "A100", 8, 40960, "x86_64"], ...},
               # vcpus, memory GiB, accelerator|null, count, GPU memory MiB|null, arch
     "offerings": {"p4d.24xlarge": [["us-east-1", 32772800, [["use1-az1", 9120300], ...]], ...]},
               # region, on-demand micro-USD/h|null, [[zone id, spot micro-USD/h|null], ...]
     "zone_names": {}, "local_zones": [...], "images": {}, "spot_refreshed_at": {}}
"""

from __future__ import annotations

import json
from typing import Any

from .model import Catalog, InstanceType, digest

FORMAT = "spz-catalog"
VERSION = 1


class CatalogFormatError(ValueError):
    pass


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def to_dict(cat: Catalog) -> dict[str, Any]:
    types = {
        t.name: [_num(t.vcpus), _num(t.memory_gib), t.accelerator, t.accelerator_count,
                 t.gpu_memory_mib, t.arch]
        for t in sorted(cat.types.values())
    }
    offerings = {
        name: [[o.region, o.ondemand_micros, [[z.zone, z.spot_micros] for z in o.zones]]
               for o in cat.offerings(name)]
        for name in sorted(cat.types) if cat.offerings(name)
    }
    return {
        "format": FORMAT, "version": VERSION, "cloud": cat.cloud, "built_at": cat.built_at,
        "source": cat.source, "notes": list(cat.notes), "price_unit": "micro-USD/hour",
        "accelerators": {k: list(v) for k, v in sorted(cat.accelerator_clouds.items())},
        "types": types, "offerings": offerings,
        "zone_names": dict(sorted(cat.zone_names.items())),
        "local_zones": sorted(cat.local_zones),
        "images": dict(sorted(cat.images.items())),
        "spot_refreshed_at": dict(sorted(cat.spot_refreshed_at.items())),
    }


def dumps(cat: Catalog) -> str:
    # One instance type per line: compact, yet a diff of a refresh stays readable.
    d = to_dict(cat)
    head = {k: v for k, v in d.items() if k not in ("types", "offerings")}
    lines = ["{"]
    for k, v in head.items():
        lines.append(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))},")
    for section in ("types", "offerings"):
        items = list(d[section].items())
        lines.append(f"{json.dumps(section)}: {{")
        for i, (name, val) in enumerate(items):
            sep = "," if i < len(items) - 1 else ""
            lines.append(f"{json.dumps(name)}: {json.dumps(val, separators=(',', ':'))}{sep}")
        lines.append("}," if section == "types" else "}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def from_dict(d: dict[str, Any], fingerprint: str = "") -> Catalog:
    """`fingerprint`: the digest of the bytes `d` was decoded from (`loads`); empty: of the content."""
    if d.get("format") != FORMAT:
        raise CatalogFormatError(f"not a catalog file (format={d.get('format')!r})")
    if d.get("version") != VERSION:
        raise CatalogFormatError(f"catalog version {d.get('version')!r} is not supported (want {VERSION})")
    types = {
        name: InstanceType(name, float(v[0]), float(v[1]), v[2], int(v[3]), v[4], v[5])
        for name, v in d["types"].items()
    }
    # Offerings stay raw rows until asked for (Catalog.offerings decodes and caches them).
    offerings = {name: rows for name, rows in d["offerings"].items() if isinstance(rows, list)}
    return Catalog(
        cloud=d["cloud"], built_at=d["built_at"], source=d["source"], types=types,
        _offerings=offerings,
        accelerator_clouds={k: tuple(v) for k, v in d.get("accelerators", {}).items()},
        notes=tuple(d.get("notes", ())),
        zone_names=dict(d.get("zone_names", {})),
        local_zones=frozenset(d.get("local_zones", ())),
        images=dict(d.get("images", {})),
        spot_refreshed_at=dict(d.get("spot_refreshed_at", {})),
        fingerprint=fingerprint,
    )


def loads(text: str | bytes) -> Catalog:
    data = text.encode() if isinstance(text, str) else text
    return from_dict(json.loads(data), fingerprint=digest(data))
