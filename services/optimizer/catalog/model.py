"""The in-memory AWS catalog: instance types and where each is offered, at what price.

Prices are integer micro-dollars per hour (1 USD = 1,000,000). On-demand prices are per region
(AWS charges the same in every zone of a region); spot prices are per zone, keyed by the zone
ID (`use1-az4`), because zone names (`us-east-1a`) differ between AWS accounts.

The catalog is built for lookups, not for editing: `offerings(type)` returns tuples sorted by
region, and its own indexes (by accelerator, zone -> region) are computed once, lazily. Nothing
outside it writes to it: what placement precomputes per catalog is placement's `CatalogIndex`,
keyed by the catalog's `fingerprint`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

MICROS_PER_DOLLAR = 1_000_000

# A Local Zone ID has a location part between the region code and the zone number
# (`use1-atl2-az1`, `usw2-lax1-az2`); a regular zone ID does not (`use1-az4`).
_LOCAL_ZONE_ID = re.compile(r"^[a-z]+[0-9]+-[a-z]+[0-9]+-az[0-9]+$")


@functools.lru_cache(maxsize=4096)
def is_local_zone_id(zone_id: str) -> bool:
    """Local Zones need an account opt-in before use, so placement avoids them unless named."""
    return bool(_LOCAL_ZONE_ID.match(zone_id))


class InstanceType(NamedTuple):
    name: str
    vcpus: float
    memory_gib: float
    accelerator: str | None  # catalog spelling (A100-80GB), None for CPU-only types
    accelerator_count: int  # 0 for CPU-only types
    gpu_memory_mib: int | None  # memory of one GPU
    arch: str

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


class ZoneOffer(NamedTuple):
    zone: str  # zone ID
    spot_micros: int | None  # None: no spot price known for this zone


class Offering(NamedTuple):
    instance_type: str
    region: str
    ondemand_micros: int | None  # None: not sold on demand in this region (p5e.48xlarge)
    zones: tuple[ZoneOffer, ...]  # sorted by zone ID


@dataclass
class Catalog:
    """One cloud's catalog. Build with `from_parts` or the codec; treat as immutable."""

    cloud: str
    built_at: str  # ISO 8601 UTC
    source: str
    types: dict[str, InstanceType]
    # type -> Offerings sorted by region (or, straight from the file, raw rows decoded on access)
    _offerings: dict[str, tuple[Offering, ...] | list]
    accelerator_clouds: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # Account-specific zone name -> zone ID mapping (filled by `catalog refresh`); empty when the
    # catalog was built from public facts only.
    zone_names: dict[str, str] = field(default_factory=dict)
    # Zones known to be Local Zones / Wavelength (need opt-in): from AWS on refresh, else by ID shape.
    local_zones: frozenset[str] = frozenset()
    # Hook: default image per region. Not in the public facts; the provisioner may fill it by
    # asking AWS, or `catalog refresh` may record it. None means "ask AWS at launch time".
    images: dict[str, str] = field(default_factory=dict)
    # When spot prices of a region were last refreshed live (region -> ISO time).
    spot_refreshed_at: dict[str, str] = field(default_factory=dict)
    # What the catalog holds, as a digest fixed when it is made (never recomputed): equal
    # fingerprints mean equal content, so caches of derived values (the optimizer's plans,
    # placement's CatalogIndex) key on it instead of on the object's identity. Built from parts
    # or derived (`with_offerings`): a digest of the content; decoded from a file (codec.loads):
    # a digest of the file's bytes, which is cheaper and just as exact.
    fingerprint: str = ""
    _by_accelerator: dict[str, tuple[InstanceType, ...]] | None = field(default=None, repr=False)
    _zone_region: dict[str, str] | None = field(default=None, repr=False)
    _canonical: dict[str, str] | None = field(default=None, repr=False)
    _regions: tuple[str, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.fingerprint:
            self.fingerprint = content_fingerprint(self)

    # ------------------------------------------------------------------ lookups

    def offerings(self, instance_type: str) -> tuple[Offering, ...]:
        offs = self._offerings.get(instance_type, ())
        if offs.__class__ is list:
            # Decoded lazily from the file's rows: a placement touches a few types, not all.
            offs = tuple(Offering(instance_type, region, od, tuple(ZoneOffer(z, sp) for z, sp in zones))
                         for region, od, zones in offs)
            self._offerings[instance_type] = offs
        return offs  # type: ignore[return-value]

    def all_offerings(self) -> Iterable[Offering]:
        for name in list(self._offerings):
            yield from self.offerings(name)

    @property
    def regions(self) -> tuple[str, ...]:
        if self._regions is None:
            self._regions = tuple(sorted({o.region if isinstance(o, Offering) else o[0]
                                          for offs in self._offerings.values() for o in offs}))
        return self._regions

    def zone_region(self, zone_id: str) -> str | None:
        if self._zone_region is None:
            idx: dict[str, str] = {}
            for offs in self._offerings.values():
                for o in offs:  # raw rows and Offerings alike: (type?,) region, price, zones
                    region, zones = (o.region, o.zones) if isinstance(o, Offering) else (o[0], o[2])
                    for z in zones:
                        idx[z[0]] = region
            self._zone_region = idx
        return self._zone_region.get(zone_id)

    def types_with_accelerator(self, name: str) -> tuple[InstanceType, ...]:
        if self._by_accelerator is None:
            idx: dict[str, list[InstanceType]] = {}
            for t in sorted(self.types.values()):
                if t.accelerator:
                    idx.setdefault(t.accelerator, []).append(t)
            self._by_accelerator = {k: tuple(v) for k, v in idx.items()}
        return self._by_accelerator.get(name, ())

    def accelerators(self) -> tuple[str, ...]:
        """Accelerator names this catalog has instance types for."""
        self.types_with_accelerator("")
        assert self._by_accelerator is not None
        return tuple(sorted(self._by_accelerator))

    def is_local_zone(self, zone_id: str) -> bool:
        return zone_id in self.local_zones or is_local_zone_id(zone_id)

    def resolve_zone(self, zone: str) -> str | None:
        """Zone ID for a zone ID or (with an account mapping) a zone name; None if unknown."""
        if self.zone_region(zone) is not None:
            return zone
        return self.zone_names.get(zone)

    # ------------------------------------------------------------------ names

    def canonical_accelerator(self, name: str) -> str | None:
        """Catalog spelling of an accelerator name, case-insensitively; None if unknown."""
        if self._canonical is None:
            names = set(self.accelerator_clouds) | set(self.accelerators())
            self._canonical = {n.lower(): n for n in names}
        return self._canonical.get(name.strip().lower())

    def normalize_accelerator(self, name: str) -> str:
        """Catalog spelling when known, else the name as given (so messages can quote it)."""
        return self.canonical_accelerator(name) or name.strip()

    # ------------------------------------------------------------------ derived copies

    def with_offerings(self, offerings: dict[str, tuple[Offering, ...]], **changes: object) -> "Catalog":
        """A copy with some instance types' offerings replaced (indexes recomputed lazily)."""
        merged: dict[str, tuple[Offering, ...] | list] = dict(self._offerings)
        merged.update(offerings)
        fields = dict(
            cloud=self.cloud, built_at=self.built_at, source=self.source, types=self.types,
            _offerings=merged, accelerator_clouds=self.accelerator_clouds, notes=self.notes,
            zone_names=self.zone_names, local_zones=self.local_zones, images=self.images,
            spot_refreshed_at=self.spot_refreshed_at,
        )
        fields.update(changes)
        return Catalog(**fields)  # type: ignore[arg-type]

    @classmethod
    def from_parts(cls, *, cloud: str, built_at: str, source: str, types: Iterable[InstanceType],
                   offerings: Iterable[Offering], **kw: object) -> "Catalog":
        by_type: dict[str, list[Offering]] = {}
        for o in offerings:
            by_type.setdefault(o.instance_type, []).append(
                o._replace(zones=tuple(sorted(o.zones))))
        return cls(cloud=cloud, built_at=built_at, source=source,
                   types={t.name: t for t in types},
                   _offerings={k: tuple(sorted(v, key=lambda o: o.region)) for k, v in by_type.items()},
                   **kw)  # type: ignore[arg-type]


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def content_fingerprint(cat: Catalog) -> str:
    """A digest of everything a catalog holds (the lazily decoded file rows and decoded
    Offerings are written the same way, so the digest does not depend on what was looked at)."""
    offerings = {name: [list(o) if o.__class__ is list else [o.region, o.ondemand_micros, o.zones]
                        for o in offs]
                 for name, offs in cat._offerings.items()}
    body = [cat.cloud, cat.built_at, cat.source, cat.types, offerings, cat.accelerator_clouds, cat.notes,
            cat.zone_names, sorted(cat.local_zones), cat.images, cat.spot_refreshed_at]
    return digest(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def dollars_to_micros(value: str | float | int) -> int:
    """Exact for decimal strings ("0.384", "21.957642"); rounds half up past the 6th decimal."""
    from decimal import ROUND_HALF_UP, Decimal

    d = Decimal(str(value).strip())
    return int((d * MICROS_PER_DOLLAR).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def micros_to_dollars(micros: int) -> float:
    """For display and JSON output only; never stored or summed."""
    return micros / MICROS_PER_DOLLAR


def format_dollars(micros: int | None) -> str:
    if micros is None:
        return "-"
    # Show cents, and more digits only when they matter (cheap spot prices).
    dollars = micros / MICROS_PER_DOLLAR
    return f"${dollars:,.2f}" if dollars >= 1 or micros % 10_000 == 0 else f"${dollars:,.4f}".rstrip("0")
