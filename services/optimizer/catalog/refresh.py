"""Rebuild the catalog from AWS itself, and refresh spot prices live before ranking.

`refresh_catalog` asks EC2, per region: `describe_availability_zones` (zone name <-> ID, Local
Zones), `describe_instance_type_offerings` (LocationType availability-zone-id, falling back to
availability-zone + the mapping), `describe_instance_types`, `describe_spot_price_history`
(latest price per zone); on-demand prices come from a pluggable `OnDemandPriceSource` (the
Price List API by default) and, for what it cannot price, from the previous catalog.

`refresh_spot_prices` is the cheap, region-scoped call the optimizer makes before it ranks:
one `describe_spot_price_history` for the types it is about to rank.

The botocore clients honour AWS_ENDPOINT_URL (and AWS_ENDPOINT_URL_EC2 / _PRICING), so the
same code runs against moto_server in tests.
"""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable

from .model import Catalog, InstanceType, Offering, ZoneOffer, dollars_to_micros
from .names import gpu_catalog_name
from .pricing import CatalogPriceSource, OnDemandPriceSource, PriceSourceError, PricingApiSource
from .sanity import spot_anomalies

Progress = Callable[[str], None]


@dataclass
class RefreshResult:
    catalog: Catalog
    notes: list[str] = field(default_factory=list)
    regions_refreshed: list[str] = field(default_factory=list)
    regions_failed: dict[str, str] = field(default_factory=dict)


@dataclass
class _RegionData:
    region: str
    zone_names: dict[str, str]  # name -> id
    local_zones: set[str]
    offered: dict[str, set[str]]  # type -> zone ids
    spot: dict[tuple[str, str], int]  # (type, zone id) -> micros
    ondemand: dict[str, int]
    ondemand_source: str
    notes: list[str]


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _session(session: Any = None) -> Any:
    if session is not None:
        return session
    import boto3

    return boto3.session.Session()


def ec2_client(session: Any, region: str, endpoint_url: str | None = None, max_attempts: int = 5) -> Any:
    from botocore.config import Config

    return session.client("ec2", region_name=region, endpoint_url=endpoint_url,
                          config=Config(retries={"max_attempts": max_attempts, "mode": "standard"},
                                        connect_timeout=10, read_timeout=60))


# ------------------------------------------------------------------------------ EC2 calls

def describe_zones(ec2: Any) -> tuple[dict[str, str], set[str]]:
    """(zone name -> zone ID, IDs of Local/Wavelength Zones) of the client's region."""
    resp = ec2.describe_availability_zones(AllAvailabilityZones=True)
    names: dict[str, str] = {}
    local: set[str] = set()
    for z in resp.get("AvailabilityZones", []):
        if z.get("ZoneName") and z.get("ZoneId"):
            names[z["ZoneName"]] = z["ZoneId"]
            if z.get("ZoneType", "availability-zone") != "availability-zone":
                local.add(z["ZoneId"])
    return names, local


def describe_offerings(ec2: Any, wanted: Callable[[str], bool],
                       zone_names: dict[str, str]) -> dict[str, set[str]]:
    """Instance type -> zone IDs offering it, for the types `wanted` accepts."""
    def collect(location_type: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for page in ec2.get_paginator("describe_instance_type_offerings").paginate(LocationType=location_type):
            for o in page.get("InstanceTypeOfferings", []):
                t = o["InstanceType"]
                if not wanted(t):
                    continue
                loc = o["Location"]
                zid = loc if location_type == "availability-zone-id" else zone_names.get(loc)
                if zid:
                    out.setdefault(t, set()).add(zid)
        return out

    from botocore.exceptions import ClientError

    try:
        by_id = collect("availability-zone-id")
    except ClientError:
        by_id = {}
    # Some endpoints do not answer per zone ID; zone names plus the account's mapping do.
    return by_id or collect("availability-zone")


def describe_types(ec2: Any, names: Collection[str], known: Iterable[str]) -> dict[str, InstanceType]:
    known = tuple(known)
    out: dict[str, InstanceType] = {}
    names = sorted(names)
    for i in range(0, len(names), 100):  # the API takes at most 100 types per call
        resp = ec2.describe_instance_types(InstanceTypes=names[i:i + 100])
        for it in resp.get("InstanceTypes", []):
            t = instance_type_from_aws(it, known)
            out[t.name] = t
    return out


def instance_type_from_aws(it: dict[str, Any], known_accelerators: Iterable[str]) -> InstanceType:
    name = it["InstanceType"]
    vcpus = float(it.get("VCpuInfo", {}).get("DefaultVCpus", 0))
    mem = round(it.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024, 2)
    archs = it.get("ProcessorInfo", {}).get("SupportedArchitectures", []) or ["x86_64"]
    arch = "x86_64" if "x86_64" in archs else archs[0]
    acc: str | None = None
    count = 0
    gpu_mem: int | None = None
    gpus = (it.get("GpuInfo") or {}).get("Gpus") or []
    if gpus:
        g = gpus[0]
        gpu_mem = int(g.get("MemoryInfo", {}).get("SizeInMiB") or 0) or None
        acc = gpu_catalog_name(g.get("Name", ""), gpu_mem, known_accelerators)
        count = int(sum(int(x.get("Count", 0)) for x in gpus))
    else:
        neuron = (it.get("NeuronInfo") or {}).get("NeuronDevices") or []
        if neuron:
            acc = neuron[0].get("Name") or None
            count = int(sum(int(x.get("Count", 0)) for x in neuron))
            gpu_mem = int(neuron[0].get("MemoryInfo", {}).get("SizeInMiB") or 0) or None
    return InstanceType(name, vcpus, float(mem), acc, count, gpu_mem, arch)


def fetch_spot_prices(ec2: Any, instance_types: Collection[str],
                      zone_names: dict[str, str] | None = None) -> dict[tuple[str, str], int]:
    """Latest Linux spot price per (instance type, zone ID) in the client's region."""
    if not instance_types:
        return {}
    latest: dict[tuple[str, str], tuple[Any, int]] = {}
    names = sorted(instance_types)
    now = dt.datetime.now(dt.timezone.utc)
    for i in range(0, len(names), 100):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=names[i:i + 100], ProductDescriptions=["Linux/UNIX"], StartTime=now)
        for page in pages:
            for p in page.get("SpotPriceHistory", []):
                if not str(p.get("ProductDescription", "Linux/UNIX")).startswith("Linux/UNIX"):
                    continue
                zid = p.get("AvailabilityZoneId")
                if not zid:
                    if zone_names is None:
                        zone_names = describe_zones(ec2)[0]
                    zid = zone_names.get(p.get("AvailabilityZone", ""))
                if not zid:
                    continue
                key = (p["InstanceType"], zid)
                ts = p.get("Timestamp") or now
                if key not in latest or ts > latest[key][0]:
                    latest[key] = (ts, dollars_to_micros(p["SpotPrice"]))
    return {k: v for k, (_, v) in latest.items()}


# ------------------------------------------------------------------------------ full refresh

def _families_of(cat: Catalog) -> set[str]:
    return {t.family for t in cat.types.values()}


def _refresh_region(session: Any, region: str, endpoint_url: str | None, wanted: Callable[[str], bool],
                    types_cache: dict[str, InstanceType], lock: threading.Lock, known_acc: tuple[str, ...],
                    price_source: OnDemandPriceSource | None, fallback: CatalogPriceSource,
                    max_attempts: int) -> _RegionData:
    ec2 = ec2_client(session, region, endpoint_url, max_attempts)
    zone_names, local = describe_zones(ec2)
    offered = describe_offerings(ec2, wanted, zone_names)
    with lock:
        missing = [t for t in offered if t not in types_cache]
    if missing:
        got = describe_types(ec2, missing, known_acc)
        with lock:
            types_cache.update(got)
    spot = fetch_spot_prices(ec2, list(offered), zone_names)
    notes: list[str] = []
    ondemand: dict[str, int] = {}
    source = "none"
    if price_source is not None:
        try:
            ondemand = price_source.prices(region, list(offered))
            source = price_source.name
        except PriceSourceError as e:
            notes.append(f"{region}: on-demand prices unavailable from {price_source.name} ({_short(e)})")
    unpriced = [t for t in offered if t not in ondemand]
    if unpriced:
        kept = fallback.prices(region, unpriced)
        ondemand.update(kept)
        if kept:
            notes.append(f"{region}: kept the previous catalog's on-demand price for {len(kept)} type(s) "
                         f"that {price_source.name if price_source else 'no price source'} did not price")
        still = sorted(set(unpriced) - set(kept))
        if still:
            notes.append(f"{region}: no on-demand price known for {len(still)} type(s) "
                         f"({', '.join(still[:5])}{' ...' if len(still) > 5 else ''}); they rank as spot only")
    return _RegionData(region, zone_names, local, offered, spot, ondemand, source, notes)


def _short(e: BaseException) -> str:
    s = str(e).splitlines()[0] if str(e) else type(e).__name__
    return s[:200]


def refresh_catalog(base: Catalog, regions: Iterable[str] | None = None, *,
                    families: Iterable[str] | None = None, instance_types: Iterable[str] | None = None,
                    session: Any = None, endpoint_url: str | None = None,
                    price_source: OnDemandPriceSource | None | str = "default",
                    pricing_endpoint_url: str | None = None, max_workers: int = 8,
                    max_attempts: int = 5, progress: Progress | None = None) -> RefreshResult:
    """A new catalog: `regions` (default: the base catalog's) rebuilt from AWS, the rest kept.

    Which instance types: `instance_types` if given, else every type of `families` (default:
    the families the base catalog has). A region that fails keeps its previous data (noted).
    """
    say = progress or (lambda _m: None)
    sess = _session(session)
    regions = sorted(set(regions)) if regions is not None else list(base.regions)
    if instance_types is not None:
        wanted_types = set(instance_types)
        wanted: Callable[[str], bool] = wanted_types.__contains__
    else:
        fams = set(families) if families is not None else _families_of(base)
        wanted = lambda t: t.split(".", 1)[0] in fams  # noqa: E731
    if price_source == "default":
        price_source = PricingApiSource.from_session(sess, endpoint_url=pricing_endpoint_url,
                                                     max_attempts=max_attempts)
    src = price_source if not isinstance(price_source, str) else None
    fallback = CatalogPriceSource(base)
    known_acc = tuple(set(base.accelerator_clouds) | set(base.accelerators()))
    types_cache: dict[str, InstanceType] = {}
    lock = threading.Lock()
    result = RefreshResult(catalog=base)
    data: dict[str, _RegionData] = {}
    say(f"refreshing {len(regions)} region(s) from AWS")
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(regions) or 1))) as pool:
        futs = {pool.submit(_refresh_region, sess, r, endpoint_url, wanted, types_cache, lock, known_acc,
                            src, fallback, max_attempts): r for r in regions}
        for i, fut in enumerate(as_completed(futs), 1):
            r = futs[fut]
            try:
                rd = fut.result()
            except Exception as e:  # noqa: BLE001 -- one region's failure must not lose the others
                result.regions_failed[r] = _short(e)
                result.notes.append(f"{r}: refresh failed, kept the previous data ({_short(e)})")
                say(f"[{i}/{len(regions)}] {r}: failed: {_short(e)}")
                continue
            data[r] = rd
            result.notes.extend(rd.notes)
            say(f"[{i}/{len(regions)}] {r}: {len(rd.offered)} instance types, "
                f"{len(rd.spot)} spot prices, {len(rd.ondemand)} on-demand prices")
    result.regions_refreshed = sorted(data)
    result.catalog = _merge(base, data, types_cache, src)
    odd = [a for a in spot_anomalies(result.catalog.all_offerings()) if a.region in data]
    result.notes.extend(f"suspicious price: {a.message()}" for a in odd[:10])
    if len(odd) > 10:
        result.notes.append(f"... and {len(odd) - 10} more suspicious spot prices")
    return result


def _merge(base: Catalog, data: dict[str, _RegionData], new_types: dict[str, InstanceType],
           src: OnDemandPriceSource | None) -> Catalog:
    offerings: list[Offering] = []
    for o in base.all_offerings():
        if o.region not in data:
            offerings.append(o)
    for r, rd in data.items():
        for t, zones in rd.offered.items():
            if t not in new_types:
                continue
            offerings.append(Offering(t, r, rd.ondemand.get(t),
                                      tuple(ZoneOffer(z, rd.spot.get((t, z))) for z in sorted(zones))))
    used = {o.instance_type for o in offerings}
    types = {**{k: v for k, v in base.types.items() if k in used}, **new_types}
    zone_names = dict(base.zone_names)
    local = set(base.local_zones)
    for rd in data.values():
        zone_names.update(rd.zone_names)
        local |= rd.local_zones
    refreshed = ", ".join(sorted(data)) or "none"
    source = (f"AWS EC2 APIs (regions refreshed: {refreshed}); on-demand prices: "
              f"{src.name if src else 'previous catalog'}; other regions from: {base.source}")
    return Catalog.from_parts(
        cloud=base.cloud, built_at=now_iso(), source=source, types=types.values(), offerings=offerings,
        accelerator_clouds=base.accelerator_clouds, notes=base.notes, zone_names=zone_names,
        local_zones=frozenset(local), images=base.images,
    )


# ------------------------------------------------------------------------------ live spot

def with_spot_prices(cat: Catalog, region: str, prices: dict[tuple[str, str], int],
                     instance_types: Collection[str], at: str | None = None) -> Catalog:
    """Pure: `cat` with the spot prices of `instance_types` in `region` replaced by `prices`.

    A zone AWS returned no price for is set to unknown (None): a stale price is worse than
    none, since the optimizer would rank a place it cannot buy.
    """
    changed: dict[str, tuple[Offering, ...]] = {}
    for t in instance_types:
        offs = cat.offerings(t)
        if not offs:
            continue
        new = []
        for o in offs:
            if o.region != region:
                new.append(o)
                continue
            zones = {z.zone: prices.get((t, z.zone)) for z in o.zones}
            for (pt, z), p in prices.items():
                if pt == t:
                    zones[z] = p
            new.append(o._replace(zones=tuple(ZoneOffer(z, p) for z, p in sorted(zones.items()))))
        changed[t] = tuple(new)
    stamps = dict(cat.spot_refreshed_at)
    stamps[region] = at or now_iso()
    return cat.with_offerings(changed, spot_refreshed_at=stamps)


def refresh_spot_prices(cat: Catalog, region: str, instance_types: Collection[str] | None = None, *,
                        session: Any = None, endpoint_url: str | None = None, ec2: Any = None) -> Catalog:
    """Live spot prices for `instance_types` (default: every type offered in `region`)."""
    if instance_types is None:
        instance_types = [t for t in cat.types if any(o.region == region for o in cat.offerings(t))]
    client = ec2 or ec2_client(_session(session), region, endpoint_url)
    region_names = {n: z for n, z in cat.zone_names.items() if cat.zone_region(z) == region} or None
    prices = fetch_spot_prices(client, instance_types, region_names)
    return with_spot_prices(cat, region, prices, instance_types)
