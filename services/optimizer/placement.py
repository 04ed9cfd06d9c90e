"""The placement decision: (requests, catalog, blocks) -> ranked candidates. Pure: no I/O.

Ranking (see docs/optimizer.md):
- Every feasible instance type is expanded, not only the cheapest one (SkyPilot expands the
  cheapest type only), so failover can move to the next-cheapest type when a type has no
  capacity anywhere.
- On-demand: one candidate per region (zone None = any zone of the region; `zones` lists the
  zones the provisioner may use). Spot: one candidate per zone (spot prices are per zone).
- Sort key: (order, total hourly price, region, zone, instance type, market, infra). `order`
  is the request's position in an `ordered` list (or 0), so `ordered` keeps the user's order
  and everything else (any_of, accelerator sets, spot and on-demand alike) interleaves by price.
- `local` costs 0, so it ranks first whenever it is enabled and the request fits.
- Kubernetes contexts rank by price too (`kubernetes.placement: by_price`, $0 by default), or,
  with `before_cloud` / `after_cloud`, ahead of / behind every other infra's candidates of the
  same `order` group whatever the prices (`rank_key`).

Blocks remove what failed: `block_for_error` maps the provisioner's error class to a scope,
and `next_placement` picks the next candidate: other zones of the same region first, then
the rest in rank order.
"""

from __future__ import annotations

import difflib
import heapq
import math
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple, Sequence

from skypurza.events.taskspec.request import ResourceRequest

from .catalog.model import Catalog, InstanceType, dollars_to_micros, format_dollars
from .local import LocalResources

if TYPE_CHECKING:  # imported where used: a placement with no Slurm or Kubernetes pays for neither (issue 21)
    from skypurza.events.k8s_capacity import ContextCapacity
    from skypurza.events.slurm_discovery import SlurmCluster

SUPPORTED_INFRAS = ("aws", "local", "kubernetes", "slurm")
# Clouds SkyPilot 0.14.1 knows (ALL_CLOUDS) plus the container/HPC backends: recognised, so
# we can say "not supported yet" instead of "unknown".
KNOWN_INFRAS = frozenset({
    "aws", "azure", "gcp", "ibm", "lambda", "scp", "oci", "runpod", "vast", "vsphere", "cudo",
    "fluidstack", "paperspace", "primeintellect", "do", "nebius", "ssh", "slurm", "hyperbolic",
    "seeweb", "shadeform", "yotta", "mithril", "verda", "kubernetes", "local",
})

# SkyPilot's default CPU instance: these families, cpus 8+, memory 4x vCPUs, cheapest first.
DEFAULT_CPU_FAMILIES = frozenset({"m6i", "m6id", "m7i", "r6i", "r6id", "r7i", "c6i", "c6id", "c7i"})
DEFAULT_CPUS = 8.0
DEFAULT_MEMORY_RATIO = 4.0
DEFAULT_DISK_SIZE_GB = 256  # SkyPilot's default disk size

LOCAL_INSTANCE_TYPE = "local"


class Candidate(NamedTuple):
    """One place a task can run (one node's price and the total for all nodes)."""

    infra: str  # "aws" | "local"
    region: str | None
    zone: str | None  # None: any zone of `zones` will do (on-demand)
    instance_type: str
    accelerators: dict[str, float] | None
    use_spot: bool
    hourly_price_micros: int
    total_hourly_price_micros: int
    vcpus: float
    memory_gib: float
    image_id: str | None
    disk_size_gb: int
    num_nodes: int
    zones: tuple[str, ...]  # zones the provisioner may try (zone IDs, or a requested zone name)
    request_index: int  # which ResourceRequest this came from (ports, labels, extra ...)
    order: int

    def key(self) -> tuple[str, str | None, str | None, str, bool]:
        return (self.infra, self.region, self.zone, self.instance_type, self.use_spot)

    def sort_key(self) -> tuple[Any, ...]:
        return (self.order, self.total_hourly_price_micros, self.region or "", self.zone or "",
                self.instance_type, self.use_spot, self.infra)

    @property
    def market(self) -> str:
        return "spot" if self.use_spot else "on-demand"

    def label(self) -> str:
        where = "/".join(p for p in (self.infra, self.region, self.zone) if p)
        return f"{where} {self.instance_type} {self.market}"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict; its keys are a superset of the events' `Candidate` model."""
        d = self._asdict()
        d["zones"] = list(self.zones)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Candidate":
        n = int(d.get("num_nodes") or 1)
        price = int(d.get("hourly_price_micros") or 0)
        return cls(
            infra=d["infra"], region=d.get("region"), zone=d.get("zone"),
            instance_type=d.get("instance_type") or LOCAL_INSTANCE_TYPE,
            accelerators=d.get("accelerators"), use_spot=bool(d.get("use_spot")),
            hourly_price_micros=price, total_hourly_price_micros=int(d.get("total_hourly_price_micros") or price * n),
            vcpus=float(d.get("vcpus") or 0), memory_gib=float(d.get("memory_gib") or 0),
            image_id=d.get("image_id"), disk_size_gb=int(d.get("disk_size_gb") or DEFAULT_DISK_SIZE_GB),
            num_nodes=n, zones=tuple(d.get("zones") or ((d["zone"],) if d.get("zone") else ())),
            request_index=int(d.get("request_index") or 0), order=int(d.get("order") or 0),
        )


@dataclass(frozen=True)
class PlacementPlan:
    candidates: tuple[Candidate, ...]
    num_nodes: int
    reason: str | None = None  # why nothing is feasible (None when there are candidates)
    notes: tuple[str, ...] = ()  # why some requests gave nothing (e.g. the first `ordered` entry)

    @property
    def chosen(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    @property
    def feasible(self) -> bool:
        return bool(self.candidates)


# ---------------------------------------------------------------------------------- blocks

BLOCK_SCOPES = ("zone", "region", "spot_market", "candidate", "infra")


@dataclass(frozen=True)
class Block:
    """A place not to try again. None fields are wildcards.

    scope names what the block covers: `zone` (an instance type in a zone, both markets),
    `spot_market` (the spot market of a type in a zone), `region` (a quota class and market
    in a region), `candidate` (exactly one candidate), `infra` (a whole infra).
    """

    scope: str
    infra: str
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    use_spot: bool | None = None
    quota_class: str | None = None  # AWS quota class ("P", "G", "Standard" ...), for region blocks
    error_class: str | None = None  # what caused it (for messages)

    def covers(self, infra: str, region: str | None, zone: str | None, instance_type: str,
               use_spot: bool) -> bool:
        return (self.infra == infra
                and (self.region is None or self.region == region)
                and (self.zone is None or self.zone == zone)
                and (self.instance_type is None or self.instance_type == instance_type)
                and (self.use_spot is None or self.use_spot == use_spot)
                and (self.quota_class is None or self.quota_class == quota_class(instance_type)))

    def to_dict(self) -> dict[str, Any]:
        """The block as the log carries it (`events.payloads.FailoverBlock`)."""
        return asdict(self)


_QUOTA_CLASSES = {"p": "P", "g": "G", "vt": "G", "f": "F", "inf": "Inf", "x": "X", "dl": "DL",
                  "trn": "Trn", "hpc": "HPC", "u": "HighMemory"}


def quota_class(instance_type: str) -> str:
    """AWS's vCPU quota class of an instance type (quotas are per class, region and market)."""
    fam = instance_type.split(".", 1)[0]
    letters = ""
    for ch in fam:
        if not ch.isalpha():
            break
        letters += ch
    for n in range(len(letters), 0, -1):
        if letters[:n] in _QUOTA_CLASSES:
            return _QUOTA_CLASSES[letters[:n]]
    return "Standard"


def block_for_error(candidate: Candidate, error_class: str, zone: str | None = None) -> Block:
    """The block a failed launch of `candidate` earns. `zone`: where it failed, if known.

    - capacity: that instance type in that zone, both markets (spot capacity is the spare
      on-demand capacity: when on-demand has none, spot has none). Without a zone, the region.
    - spot_capacity (or capacity on a spot candidate): the spot market of that type in that
      zone; on-demand in the same zone stays available.
    - quota: the region, for that market and quota class (AWS vCPU quotas are per class of
      family, per region, separately for spot and on-demand).
    - unsupported, transient, other: exactly that candidate (its zone, or the whole region
      for a region-level candidate).
    - auth: the whole infra (credentials are per cloud).
    """
    infra, region, it = candidate.infra, candidate.region, candidate.instance_type
    z = zone or candidate.zone
    if error_class == "auth":
        return Block("infra", infra, error_class=error_class)
    if error_class == "spot_capacity" or (error_class == "capacity" and candidate.use_spot):
        return Block("spot_market", infra, region, z, it, True, error_class=error_class)
    if error_class == "capacity":
        return Block("zone" if z else "region", infra, region, z, it, None, error_class=error_class)
    if error_class == "quota":
        return Block("region", infra, region, None, None, candidate.use_spot, quota_class(it),
                     error_class=error_class)
    return Block("candidate", infra, region, z, it, candidate.use_spot, error_class=error_class)


def _surviving_zones(blocks: Sequence[Block], infra: str, region: str | None, zones: tuple[str, ...],
                     it: str, spot: bool) -> tuple[str, ...]:
    return tuple(z for z in zones if not any(b.covers(infra, region, z, it, spot) for b in blocks))


def apply_blocks(c: Candidate, blocks: Sequence[Block]) -> Candidate | None:
    """The candidate with blocked zones removed, or None when nothing of it is left."""
    if not blocks:
        return c
    if not c.zones:  # local: no zones
        return None if any(b.covers(c.infra, c.region, c.zone, c.instance_type, c.use_spot) for b in blocks) else c
    left = _surviving_zones(blocks, c.infra, c.region, c.zones, c.instance_type, c.use_spot)
    if not left:
        return None
    return c if left == c.zones else c._replace(zones=left)


def next_placement(plan: PlacementPlan, blocks: Sequence[Block], last: Candidate | None = None,
                   same_region_first: bool = True) -> PlacementPlan:
    """What to try after a failure: the plan minus blocked places, reordered so that [0] is next.

    Order rule: first the remaining candidates of the same infra, region, instance type and
    market as the one that failed (`last`; by default inferred from the newest block that
    names a region and an instance type), within the same `order` group, in rank order -- that
    is, the other zones of the region; then all other remaining candidates in rank order (the
    next cheapest region). An on-demand candidate whose failed zone was blocked stays, with
    fewer `zones`, so its region is tried again in the zones left. With
    `same_region_first=False` the order is plain rank order (cheapest remaining first).
    """
    remaining = [c2 for c in plan.candidates if (c2 := apply_blocks(c, blocks)) is not None]
    if not remaining:
        tried = len(plan.candidates)
        reason = (f"all {tried} candidate place(s) were tried and are blocked" if tried
                  else (plan.reason or "no candidates"))
        return PlacementPlan((), plan.num_nodes, reason, plan.notes)
    affinity: tuple[Any, ...] | None = None
    if not same_region_first:
        pass
    elif last is not None:
        affinity = (last.infra, last.region, last.instance_type, last.use_spot, last.order)
    else:
        for b in reversed(blocks):
            if b.region and b.instance_type:
                # The order group of the failed candidate, if it is still in the plan.
                order = next((c.order for c in plan.candidates if c.infra == b.infra and c.region == b.region
                              and c.instance_type == b.instance_type
                              and (b.use_spot is None or c.use_spot == b.use_spot)), None)
                affinity = (b.infra, b.region, b.instance_type, b.use_spot, order)
                break
    if affinity is not None:
        infra, region, it, spot, order = affinity
        same = [c for c in remaining if c.infra == infra and c.region == region and c.instance_type == it
                and (spot is None or c.use_spot == spot) and (order is None or c.order == order)]
        if same:
            ids = {id(c) for c in same}
            remaining = same + [c for c in remaining if id(c) not in ids]
    return PlacementPlan(tuple(remaining), plan.num_nodes, None, plan.notes)


# ---------------------------------------------------------------------------------- place

def normalize_infra(cloud: str | None) -> str | None:
    if cloud is None:
        return None
    c = cloud.strip().lower()
    if c in ("", "*"):
        return None
    return "kubernetes" if c == "k8s" else c


def default_enabled_infras(clouds_enabled: Iterable[str], allowed_infras: Iterable[str] | None = None) -> frozenset[str]:
    """Infras a task without an explicit infra may use.

    `local` is enabled by default only while no cloud is; `allowed_infras` (config) overrides.
    An explicit `infra: local` is always honoured by `place`, whatever this returns.
    """
    clouds = {normalize_infra(c) for c in clouds_enabled} - {None, "local"}
    if allowed_infras is not None:
        allowed = {normalize_infra(a) for a in allowed_infras}
        return frozenset(a for a in allowed if a in clouds or a == "local")  # type: ignore[misc]
    return frozenset(clouds) if clouds else frozenset({"local"})


def enabled_infras(forced: Iterable[str] | None, aws_is_configured: bool,
                   allowed: Iterable[str] | None = None, kubernetes_configured: bool = False,
                   slurm_configured: bool = False) -> frozenset[str]:
    """Pure: `forced` (SKYPURZA_ENABLED_INFRAS) wins; else AWS when it is configured
    (events/awsconfig.py), Kubernetes when a kubeconfig is (events/k8s_config.py), and `local`
    only while no cloud is enabled (or when `allowed`, config's `allowed_infras`, names it).
    The looking is world.py's. (Here, not in decide.py, so that `--dryrun` and world.py do not
    import the event models decide.py needs.)"""
    if forced:
        return frozenset(x.strip().lower() for x in forced if x.strip())
    clouds = (["aws"] if aws_is_configured else []) + (["kubernetes"] if kubernetes_configured else []) + (
        ["slurm"] if slurm_configured else [])
    return default_enabled_infras(clouds, allowed)


def place(requests: Sequence[ResourceRequest], num_nodes: int, catalog: Catalog,
          blocks: Sequence[Block] = (), enabled_infras: Iterable[str] = ("aws",),
          local_resources: LocalResources | None = None, limit: int | None = None,
          index: CatalogIndex | None = None, kubernetes: Sequence[ContextCapacity] = (),
          slurm: Sequence[SlurmCluster] = ()) -> PlacementPlan:
    """Rank every feasible candidate for `requests` (alternatives of one task) over `catalog`.

    With `limit`, only the `limit` best candidates of each request are guaranteed to be in the
    plan (exactly the ones a full ranking puts first): instance types are visited cheapest first
    and the expansion stops once no type left can beat the limit-th price found. The optimizer
    service uses this (with the task's blocks applied up front) so a failover plan costs the
    same as a first one; `--dryrun` ranks everything.

    Pure: the result depends on the arguments only, and none of them is written to. `index`
    is the catalog's precomputation (default: `index_for(catalog)`, shared by equal catalogs).
    `kubernetes`: each enabled context's free capacity and prices (events/k8s_capacity.py).
    `slurm`: each enabled Slurm cluster's partitions and prices (events/slurm_discovery.py).
    """
    if num_nodes < 1:
        raise ValueError("num_nodes must be at least 1")
    if index is None or index.fingerprint != catalog.fingerprint:
        index = index_for(catalog)
    reqs = list(requests) or [ResourceRequest()]
    enabled = frozenset(normalize_infra(e) for e in enabled_infras) - {None}
    cands: list[Candidate] = []
    failures: list[tuple[int, str]] = []
    for i, req in enumerate(reqs):
        got, why = _expand(i, req, num_nodes, catalog, index, blocks, enabled, local_resources, limit, kubernetes,
                           slurm)
        if got:
            cands.extend(got)
        else:
            failures.append((i, why))
    tiers = {ctx.context: K8S_PLACEMENT_TIER.get(ctx.placement, 0) for ctx in kubernetes}
    if len(reqs) == 1 and isinstance(got, _Ranked) and not any(tiers.values()):
        unique = cands  # one request, one infra's list, already ranked exactly as below
    else:
        # Without a tier other than 0 the rank key is the sort key (one call per candidate, not three).
        unique = _rank(cands, (lambda c: rank_key(c, tiers)) if any(tiers.values()) else _sort_key)
    notes = tuple(f"{describe_request(reqs[i])}: {why}" for i, why in failures)
    if unique:
        return PlacementPlan(tuple(unique), num_nodes, None, notes)
    if len(reqs) == 1:
        return PlacementPlan((), num_nodes, failures[0][1], notes)
    return PlacementPlan((), num_nodes, "no alternative is feasible: " + "; ".join(notes), notes)


def _rank(cands: list[Candidate], key: Callable[[Candidate], Any]) -> list[Candidate]:
    """`cands` sorted by `key` (stable), each place (`Candidate.key`) kept once, where it ranks first."""
    cands.sort(key=key)
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for c in cands:
        k = (c[0], c[1], c[2], c[3], c[5])  # c.key(), inlined: this runs per candidate
        if k not in seen:
            seen.add(k)
            unique.append(c)
    return unique


class _Ranked(list):  # type: ignore[type-arg]
    """Candidates already as `_rank(..., _sort_key)` leaves them. Ranking them again with more
    (a stable sort by the same key, then the first of each place) gives the same order as
    ranking the unranked list with them, so `place` takes a lone one as it is."""


# kubernetes.placement -> where a context's candidates go among the others of their order group.
K8S_PLACEMENT_TIER = {"before_cloud": -1, "by_price": 0, "after_cloud": 1}


def rank_key(c: Candidate, k8s_tiers: dict[str, int]) -> tuple[Any, ...]:
    """`Candidate.sort_key` with the Kubernetes placement tier between the order group and the
    price: `ordered` still wins, and within a tier price ranks as before."""
    tier = k8s_tiers.get(c.region or "", 0) if c.infra == "kubernetes" else 0
    order, *rest = c.sort_key()
    return (order, tier, *rest)


def _sort_key(c: Candidate) -> tuple[Any, ...]:
    """`Candidate.sort_key`, by position (the same order as `rank_key` when every tier is 0)."""
    return (c[15], c[7], c[1] or "", c[2] or "", c[3], c[5], c[0])


def describe_request(req: ResourceRequest) -> str:
    parts = []
    if req.accelerator:
        parts.append(f"{req.accelerator}:{_fmt_count(req.accelerator_count or 1)}")
    if req.instance_type:
        parts.append(req.instance_type)
    if req.cpus is not None:
        parts.append(f"cpus {req.cpus:g}{'+' if req.cpus_plus else ''}")
    if req.memory_gib is not None:
        parts.append(f"memory {req.memory_gib:g}{'+' if req.memory_plus else ''} GiB")
    if req.memory_ratio is not None:
        parts.append(f"memory {req.memory_ratio:g}x")
    if not parts:
        parts.append("default CPU instance")
    where = "/".join(p for p in (req.cloud, req.region, req.zone) if p)
    if where:
        parts.append(f"on {where}")
    parts.append("spot" if req.use_spot else "on-demand")
    return " ".join(parts)


def _fmt_count(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _expand(i: int, req: ResourceRequest, n: int, cat: Catalog, index: CatalogIndex, blocks: Sequence[Block],
            enabled: frozenset[str], local: LocalResources | None,
            limit: int | None = None, kubernetes: Sequence[ContextCapacity] = (),
            slurm: Sequence[SlurmCluster] = ()) -> tuple[list[Candidate], str]:
    cloud = normalize_infra(req.cloud)
    if cloud is not None and cloud not in SUPPORTED_INFRAS:
        known = "" if cloud in KNOWN_INFRAS else " (unknown infra)"
        return [], (f"infra {req.cloud!r}{known} is not supported yet: SkyPurza places work on "
                    f"AWS, Kubernetes and on this machine (local) today; use infra: aws, k8s or local")
    out: list[Candidate] = []
    whys: list[str] = []
    if cloud == "kubernetes" or (cloud is None and "kubernetes" in enabled):
        got_k8s, why_k8s = _k8s_candidates(i, req, n, kubernetes, blocks)
        out.extend(got_k8s)
        if not got_k8s and (cloud == "kubernetes" or why_k8s):
            whys.append(why_k8s)
    if cloud == "slurm" or (cloud is None and "slurm" in enabled):
        got_slurm, why_slurm = _slurm_candidates(i, req, n, slurm, blocks)
        out.extend(got_slurm)
        if not got_slurm and (cloud == "slurm" or why_slurm):
            whys.append(why_slurm)
    if cloud == "local" or (cloud is None and "local" in enabled):
        c, why = _local_candidate(i, req, n, local, blocks)
        if c is not None:
            out.append(c)
        elif why:
            whys.append(why)
    if cloud in (None, "aws"):
        if "aws" not in enabled:
            whys.append("AWS is not enabled (no credentials found, or AWS did not answer): run `spz check`")
        else:
            got, why = _aws_candidates(i, req, n, cat, index, blocks, limit)
            if out:
                out.extend(got)
            else:
                out = got  # alone: kept as it is (ranked already when it is a `_Ranked`)
            if not got:
                whys.insert(0, why)
    return out, "; ".join(whys) if whys else "no infra is enabled: run `spz check`"


# ---------------------------------------------------------------------------------- local

def _local_candidate(i: int, req: ResourceRequest, n: int, local: LocalResources | None,
                     blocks: Sequence[Block]) -> tuple[Candidate | None, str]:
    def no(why: str) -> tuple[None, str]:
        return None, f"local: {why}"

    if req.region not in (None, "local") or req.zone:
        return no("this machine has no regions or zones: drop region/zone")
    if req.instance_type:
        return no("this machine has no instance types: drop instance_type")
    if req.use_spot:
        return no("this machine has no spot market: use use_spot: false")
    if req.image_id:
        return no("tasks run on this machine's own OS: image_id is not supported there")
    if local is None:
        return no("this machine's resources are not known")
    if req.cpus is not None and local.cpus < req.cpus:
        return no(f"the task asks for {req.cpus:g} CPUs, this machine has {local.cpus}")
    need_mem = req.memory_gib
    if req.memory_ratio is not None and req.cpus is not None:
        need_mem = max(need_mem or 0.0, req.memory_ratio * req.cpus)
    if need_mem is not None and local.memory_gib < need_mem:
        return no(f"the task asks for {need_mem:g} GiB memory, this machine has {local.memory_gib:g} GiB")
    accs: dict[str, float] | None = None
    if req.accelerator:
        count = req.accelerator_count or 1
        have = local.gpus.get(req.accelerator, 0)
        # Each local "node" is an agent on this one machine: GPUs are not shared between them.
        need = math.ceil(count) * n
        if have < need:
            has = ", ".join(f"{g}:{c}" for g, c in sorted(local.gpus.items())) or "no NVIDIA GPU"
            return no(f"the task asks for {req.accelerator}:{_fmt_count(count)}"
                      f"{f' x {n} nodes' if n > 1 else ''}, this machine has {has}")
        accs = {req.accelerator: count}
    if any(b.covers("local", None, None, LOCAL_INSTANCE_TYPE, False) for b in blocks):
        return no("blocked after a failed attempt")
    return Candidate(
        infra="local", region=None, zone=None, instance_type=LOCAL_INSTANCE_TYPE, accelerators=accs,
        use_spot=False, hourly_price_micros=0, total_hourly_price_micros=0, vcpus=float(local.cpus),
        memory_gib=local.memory_gib, image_id=None, disk_size_gb=req.disk_size_gb or DEFAULT_DISK_SIZE_GB,
        num_nodes=n, zones=(), request_index=i, order=req.order or 0,
    ), ""


# ---------------------------------------------------------------------------------- Kubernetes

def _k8s_candidates(i: int, req: ResourceRequest, n: int, contexts: Sequence[ContextCapacity],
                    blocks: Sequence[Block]) -> tuple[list[Candidate], str]:
    """One candidate per context (a "region") whose nodes fit `n` pods of the request's size now."""
    from skypurza.events.k8s_capacity import hourly_price_micros, pod_size

    def no(why: str) -> tuple[list[Candidate], str]:
        return [], f"kubernetes: {why}"

    if req.instance_type or req.use_spot or req.zone or req.image_id:
        return no("pods have no instance types, spot market, zones or machine images: drop them")
    size = pod_size(req.cpus, req.memory_gib, req.memory_ratio, req.accelerator, req.accelerator_count)
    wanted = [c for c in contexts if req.region in (None, c.context)]
    if not wanted:
        known = ", ".join(c.context for c in contexts) or "none"
        return no(f"context {req.region!r} is not enabled (enabled: {known}): kubernetes.allowed_contexts"
                  if req.region else "no context is enabled: run `spz check kubernetes`")
    out, whys = [], []
    for ctx in wanted:
        if not ctx.reachable:
            whys.append(f"{ctx.context}: not reachable ({ctx.error})")
            continue
        itype = size.instance_type()
        if any(b.covers("kubernetes", ctx.context, None, itype, False) for b in blocks):
            whys.append(f"{ctx.context}: blocked after a failed attempt")
            continue
        if not ctx.fits(size, n):
            has = ", ".join(f"{g}:{c}" for g, c in sorted(ctx.gpus().items())) or "no GPU"
            whys.append(f"{ctx.context}: no room for {n} x {itype} now (free: {ctx.cpus():g} CPUs, {has})")
            continue
        price = hourly_price_micros(size, ctx.gpu_hourly_usd, ctx.cpu_hourly_usd)
        out.append(Candidate(
            infra="kubernetes", region=ctx.context, zone=None, instance_type=itype,
            accelerators={size.gpu: float(size.gpus)} if size.gpu else None, use_spot=False,
            hourly_price_micros=price, total_hourly_price_micros=price * n, vcpus=size.cpus,
            memory_gib=size.memory_gib, image_id=None, disk_size_gb=req.disk_size_gb or DEFAULT_DISK_SIZE_GB,
            num_nodes=n, zones=(), request_index=i, order=req.order or 0))
    return out, "" if out else "kubernetes: " + "; ".join(whys)


# ---------------------------------------------------------------------------------- Slurm

def _slurm_candidates(i: int, req: ResourceRequest, n: int, clusters: Sequence[SlurmCluster],
                      blocks: Sequence[Block]) -> tuple[list[Candidate], str]:
    """One candidate per partition (a zone of the cluster, its region) whose nodes take the
    shape; priced by `slurm.pricing` ($0.00 when none, as sky)."""
    from skypurza.events.slurm_discovery import accelerator_name, fits as slurm_fits, node_shape

    def no(why: str) -> tuple[list[Candidate], str]:
        return [], f"slurm: {why}"

    if req.instance_type or req.use_spot or req.image_id:
        return no("Slurm partitions have no instance types, spot market or machine images: drop them")
    wanted = [c for c in clusters if req.region in (None, c.cluster)]
    if not wanted:
        known = ", ".join(c.cluster for c in clusters) or "none"
        return no(f"cluster {req.region!r} is not in ~/.slurm/config or slurm.allowed_clusters (known: {known})"
                  if req.region else "no Slurm cluster is configured: see `spz check slurm`")
    cpus, mem_mib, gpus = node_shape(req.cpus, req.memory_gib, req.accelerator, req.accelerator_count)
    out, whys = [], []
    for cl in wanted:
        if not cl.reachable:
            whys.append(f"{cl.cluster}: not reachable ({cl.error})")
            continue
        offers = [o for o in cl.offers if req.zone in (None, o.partition)]
        if req.zone and not offers:
            whys.append(f"{cl.cluster}: no partition {req.zone!r} (partitions: "
                        f"{', '.join(o.partition for o in cl.offers) or 'none'})")
        for o in offers:
            why = slurm_fits(o, n, cpus, mem_mib, req.accelerator, gpus, cl.config.for_partition(o.partition).gres)
            acc = accelerator_name(req.accelerator.lower(), {}) if req.accelerator else None
            itype = f"{cpus}cpu-{mem_mib}mb" + (f"-{req.accelerator}x{gpus}" if req.accelerator else "")
            if why:
                whys.append(f"{cl.cluster}/{why}")
                continue
            if any(b.covers("slurm", cl.cluster, o.partition, itype, False) for b in blocks):
                whys.append(f"{cl.cluster}/{o.partition}: blocked after a failed attempt")
                continue
            price = cl.price_micros(o.partition, cpus, mem_mib, req.accelerator, gpus)
            out.append(Candidate(
                infra="slurm", region=cl.cluster, zone=o.partition, instance_type=itype,
                accelerators={req.accelerator: float(gpus)} if acc else None, use_spot=False,
                hourly_price_micros=price, total_hourly_price_micros=price * n, vcpus=float(cpus),
                memory_gib=mem_mib / 1024, image_id=None, disk_size_gb=req.disk_size_gb or DEFAULT_DISK_SIZE_GB,
                num_nodes=n, zones=(o.partition,), request_index=i, order=req.order or 0))
    return out, "" if out else "slurm: " + "; ".join(whys)


# ---------------------------------------------------------------------------------- AWS

@dataclass
class _Need:
    cpus: float | None
    cpus_plus: bool
    mem: float | None
    mem_plus: bool
    ratio: float | None

    def fits(self, t: InstanceType) -> bool:
        if self.cpus is not None:
            if self.cpus_plus:
                if t.vcpus < self.cpus:
                    return False
            elif t.vcpus != self.cpus:
                return False
        if self.mem is not None:
            if self.mem_plus:
                if t.memory_gib < self.mem:
                    return False
            elif t.memory_gib != self.mem:
                return False
        if self.ratio is not None and t.memory_gib < self.ratio * t.vcpus:
            return False
        return True

    def describe(self) -> str:
        parts = []
        if self.cpus is not None:
            parts.append(f"{self.cpus:g}{'+' if self.cpus_plus else ''} vCPUs")
        if self.mem is not None:
            parts.append(f"{self.mem:g}{'+' if self.mem_plus else ''} GiB memory")
        if self.ratio is not None:
            parts.append(f"memory >= {self.ratio:g}x vCPUs")
        return ", ".join(parts) or "no minimums"


def _need(req: ResourceRequest, defaults: bool) -> _Need:
    cpus, cpus_plus = req.cpus, req.cpus_plus
    mem, mem_plus, ratio = req.memory_gib, req.memory_plus, req.memory_ratio
    if defaults:
        if cpus is None:
            cpus, cpus_plus = DEFAULT_CPUS, True
        if mem is None and ratio is None:
            ratio = DEFAULT_MEMORY_RATIO
    return _Need(cpus, cpus_plus, mem, mem_plus, ratio)


def _close(word: str, options: Iterable[str]) -> str:
    m = difflib.get_close_matches(word, list(options), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(m)}?" if m else ""


def _aws_types(req: ResourceRequest, cat: Catalog,
               index: CatalogIndex | None = None) -> tuple[list[InstanceType], str, str]:
    """(instance types, what-was-asked, why-none)."""
    acc = None
    count = req.accelerator_count or 1
    mem_form = _GPU_MEMORY_FORM.match(req.accelerator or "")
    if mem_form and not req.instance_type:
        return _types_by_gpu_memory(req, cat, float(mem_form.group(1)), bool(mem_form.group(2)), count)
    if req.accelerator:
        acc = cat.canonical_accelerator(req.accelerator)
        if acc is None:
            return [], req.accelerator, (f"unknown accelerator {req.accelerator!r}"
                                         f"{_close(req.accelerator.upper(), cat.accelerators())}"
                                         f" (AWS accelerators in the catalog: {', '.join(cat.accelerators())})")
    asked_acc = f"{acc}:{_fmt_count(count)}" if acc else ""
    if req.instance_type:
        t = cat.types.get(req.instance_type)
        if t is None:
            return [], req.instance_type, (
                f"instance type {req.instance_type} is not in the AWS catalog (built {cat.built_at})"
                f"{_close(req.instance_type, cat.types)}")
        if acc and (t.accelerator != acc or t.accelerator_count != count):
            has = f"{t.accelerator}:{t.accelerator_count}" if t.accelerator else "no accelerator"
            return [], t.name, f"{t.name} has {has}, not {asked_acc}: drop one of instance_type and accelerators"
        need = _need(req, defaults=False)
        if not need.fits(t):
            return [], t.name, (f"{t.name} has {t.vcpus:g} vCPUs and {t.memory_gib:g} GiB, "
                                f"which does not meet {need.describe()}")
        return [t], t.name, ""
    if acc:
        pool = cat.types_with_accelerator(acc)
        if not pool:
            clouds = cat.accelerator_clouds.get(acc, ())
            where = (f"{acc} is offered by {', '.join(clouds)}, which SkyPurza does not run yet"
                     if clouds and "AWS" not in clouds else f"no AWS instance type in the catalog has {acc}")
            return [], asked_acc, (f"{where} (AWS accelerators in the catalog: {', '.join(cat.accelerators())}); "
                                   f"if AWS added it, run `spz catalog refresh`")
        exact = [t for t in pool if t.accelerator_count == count]
        if not exact:
            return [], asked_acc, _closest_count(cat, acc, count, pool, req.use_spot)
        need = _need(req, defaults=False)
        fits = [t for t in exact if need.fits(t)]
        if not fits:
            biggest = max(exact, key=lambda t: (t.vcpus, t.memory_gib))
            return [], asked_acc, (f"no {asked_acc} instance type meets {need.describe()} "
                                   f"(largest: {biggest.name}, {biggest.vcpus:g} vCPUs, {biggest.memory_gib:g} GiB)")
        return fits, asked_acc, ""
    need = _need(req, defaults=True)
    cpu_types, default_family = (index or index_for(cat)).cpu_types()
    pool = [t for t in default_family if need.fits(t)]
    if not pool:
        # Better than SkyPilot, which gives up here: any CPU-only type that meets the minimums.
        pool = [t for t in cpu_types if need.fits(t)]
    if not pool:
        biggest = max(cpu_types, key=lambda t: (t.vcpus, t.memory_gib), default=None)
        extra = (f" (largest CPU type: {biggest.name}, {biggest.vcpus:g} vCPUs, {biggest.memory_gib:g} GiB)"
                 if biggest else "")
        return [], "a CPU instance", f"no CPU-only AWS instance type has {need.describe()}{extra}"
    return pool, f"a CPU instance with {need.describe()}", ""


# `80GB+:8` (SkyPilot's GPU-memory form): any GPU with at least (or about) that much memory.
_GPU_MEMORY_FORM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GB(\+)?\s*$", re.IGNORECASE)
# Marketed "48GB" is 45,776 MiB as AWS reports it: allow 10% below the nominal size.
_GPU_MEMORY_SLACK = 0.9


def _types_by_gpu_memory(req: ResourceRequest, cat: Catalog, gb: float, plus: bool,
                         count: float) -> tuple[list[InstanceType], str, str]:
    low = gb * 1024 * _GPU_MEMORY_SLACK
    high = float("inf") if plus else gb * 1024 / _GPU_MEMORY_SLACK
    what = f"{gb:g}GB{'+' if plus else ''}:{_fmt_count(count)}"
    need = _need(req, defaults=False)
    pool = [t for t in cat.types.values() if t.accelerator and t.gpu_memory_mib
            and low <= t.gpu_memory_mib <= high and t.accelerator_count == count and need.fits(t)]
    if not pool:
        sizes = sorted({f"{t.accelerator} ({t.gpu_memory_mib / 1024:.0f} GiB)" for t in cat.types.values()
                        if t.accelerator and t.gpu_memory_mib})
        return [], what, (f"no AWS instance type has {_fmt_count(count)} GPU(s) with "
                          f"{'at least ' if plus else ''}{gb:g} GB each meeting {need.describe()}; "
                          f"GPUs in the catalog: {', '.join(sizes)}")
    return sorted(pool), what, ""


def _cheapest(cat: Catalog, types: Iterable[InstanceType], use_spot: bool,
              region: str | None = None) -> tuple[int, str, str, str | None] | None:
    best: tuple[int, str, str, str | None] | None = None
    for t in types:
        for o in cat.offerings(t.name):
            if region and o.region != region:
                continue
            if use_spot:
                for z in o.zones:
                    if z.spot_micros is not None and not cat.is_local_zone(z.zone):
                        cand = (z.spot_micros, o.region, t.name, z.zone)
                        if best is None or cand < best:
                            best = cand
            elif o.ondemand_micros is not None:
                cand2 = (o.ondemand_micros, o.region, t.name, None)
                if best is None or cand2 < best:
                    best = cand2
    return None if best is None else (best[0], best[2], best[1], best[3])


def _closest_count(cat: Catalog, acc: str, count: float, pool: Sequence[InstanceType], use_spot: bool) -> str:
    counts = sorted({t.accelerator_count for t in pool})
    near = min(counts, key=lambda c: (abs(c - count), -c))
    types = [t for t in pool if t.accelerator_count == near]
    best = _cheapest(cat, types, use_spot) or _cheapest(cat, types, not use_spot)
    offered = ", ".join(f"{acc}:{c}" for c in counts)
    msg = f"no AWS region offers {acc}:{_fmt_count(count)}"
    if best:
        price, it, region, zone = best
        market = "spot" if (zone is not None) else "on demand"
        msg += (f"; closest: {acc}:{near} on {it} in {region}{'/' + zone if zone else ''} "
                f"({format_dollars(price)}/h {market})")
    msg += f". AWS offers {acc} as {offered}"
    if near < count:
        msg += f"; ask for {acc}:{near} per node and use num_nodes for more"
    return msg


def _region_of_zone_name(zone: str, regions: Iterable[str]) -> str | None:
    best = None
    for r in regions:
        if zone.startswith(r) and zone != r and (best is None or len(r) > len(best)):
            best = r
    return best


class CatalogIndex:
    """What placement precomputes per catalog, as a value of its own: the catalog is an input
    and is never written to. Built from a catalog (`index_for` keeps the last few, keyed by the
    catalog's content fingerprint, so an equal catalog shares one); filled lazily, per instance
    type, because a placement touches a few types, not all.

    - `floor_price(type, spot)`: the lowest price of a type anywhere in that market, a lower
      bound for every candidate of the type, which is what makes top-K pruning exact;
    - `regular_zones(type)`: per offering of the type (in `catalog.offerings` order), its zones
      without Local Zones (which need an opt-in);
    - `places(type, spot)`: the places of a type in a market that a request naming no region,
      zone or per-region image can use, in the order the expansion visits them (`_Places`);
    - `cpu_types()`: the CPU-only types, and those of SkyPilot's default families;
    - `anywhere`: the last ANYWHERE_MEMO_SIZE results of `_candidates_anywhere`, keyed by all of
      its inputs (the types by name: within one catalog a name is one type). Distinct requests
      that select the same types (a sweep over cpus and memory minimums) share one expansion.
    """

    __slots__ = ("catalog", "fingerprint", "_floors", "_regular", "_places", "_cpu_types", "anywhere")

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.fingerprint = catalog.fingerprint
        self._floors: dict[tuple[str, bool], int | None] = {}
        self._regular: dict[str, tuple[tuple[Any, ...], ...]] = {}
        self._places: dict[tuple[str, bool], _Places] = {}
        self._cpu_types: tuple[list[InstanceType], list[InstanceType]] | None = None
        self.anywhere: OrderedDict[tuple[Any, ...], _Anywhere] = OrderedDict()

    def cpu_types(self) -> tuple[list[InstanceType], list[InstanceType]]:
        """(every CPU-only type, those of DEFAULT_CPU_FAMILIES), in catalog order; callers copy
        before changing them."""
        if self._cpu_types is None:
            cpu = [t for t in self.catalog.types.values() if not t.accelerator]
            self._cpu_types = (cpu, [t for t in cpu if t.family in DEFAULT_CPU_FAMILIES])
        return self._cpu_types

    def places(self, name: str, spot: bool) -> _Places:
        key = (name, spot)
        got = self._places.get(key)
        if got is None:
            rows: list[tuple[str, int, str | None, tuple[str, ...]]] = []
            n_loc = 0
            for off, regular in zip(self.catalog.offerings(name), self.regular_zones(name)):
                if not regular:
                    continue
                n_loc += 1
                if spot:
                    rows.extend((off.region, z.spot_micros, z.zone, (z.zone,)) for z in regular
                                if z.spot_micros is not None)
                elif off.ondemand_micros is not None:
                    rows.append((off.region, off.ondemand_micros, None, tuple(z.zone for z in regular)))
            got = self._places[key] = _Places(tuple(rows), n_loc, min((r[1] for r in rows), default=None))
        return got

    def floor_price(self, name: str, spot: bool) -> int | None:
        key = (name, spot)
        try:
            return self._floors[key]
        except KeyError:
            pass
        offs = self.catalog.offerings(name)
        prices = [z.spot_micros for o in offs for z in o.zones if z.spot_micros is not None] if spot \
            else [o.ondemand_micros for o in offs if o.ondemand_micros is not None]
        floor = self._floors[key] = min(prices) if prices else None
        return floor

    def regular_zones(self, name: str) -> tuple[tuple[Any, ...], ...]:
        got = self._regular.get(name)
        if got is None:
            is_local_zone = self.catalog.is_local_zone
            got = self._regular[name] = tuple(tuple(z for z in o.zones if not is_local_zone(z.zone))
                                              for o in self.catalog.offerings(name))
        return got


class _Places(NamedTuple):
    """A type's places in one market for a request that names no region, zone or per-region
    image: what `_aws_candidates`' general loop would visit, precomputed once per catalog."""

    rows: tuple[tuple[str, int, str | None, tuple[str, ...]], ...]  # (region, price, zone, zones)
    n_loc: int  # offerings with a regular zone (the loop's `n_loc` for this type)
    cheapest: int | None  # the lowest price among `rows`


_INDEXES: OrderedDict[str, CatalogIndex] = OrderedDict()
INDEX_CACHE_SIZE = 4  # a spot refresh makes a new catalog every few minutes; older ones go


def index_for(catalog: Catalog) -> CatalogIndex:
    """The CatalogIndex of `catalog`'s content (shared by every catalog with its fingerprint)."""
    key = catalog.fingerprint
    index = _INDEXES.get(key)
    if index is None:
        index = _INDEXES[key] = CatalogIndex(catalog)
        if len(_INDEXES) > INDEX_CACHE_SIZE:
            _INDEXES.popitem(last=False)
    return index


def _aws_candidates(i: int, req: ResourceRequest, n: int, cat: Catalog, index: CatalogIndex,
                    blocks: Sequence[Block], limit: int | None = None) -> tuple[list[Candidate], str]:
    types, what, why = _aws_types(req, cat, index)
    if not types:
        return [], why
    if limit is not None:
        # Cheapest types first; a type without any price in this market cannot produce a candidate.
        floors = {t.name: index.floor_price(t.name, req.use_spot) for t in types}
        types = sorted((t for t in types if floors[t.name] is not None), key=lambda t: (floors[t.name], t.name)) \
            or types
    region = req.region
    zone_id: str | None = None
    zone_name: str | None = None  # a zone name we cannot map to an ID (no account mapping)
    if req.zone:
        zid = cat.resolve_zone(req.zone)
        zr = cat.zone_region(zid) if zid else None
        if zid and zr:
            zone_id = zid
        else:
            zr = _region_of_zone_name(req.zone, cat.regions)
            if zr is None:
                return [], (f"unknown AWS zone {req.zone!r}: give a zone ID (e.g. use1-az4) "
                            f"or a zone name of a catalog region")
            if req.use_spot:
                ids = sorted({z.zone for t in types for o in cat.offerings(t.name) if o.region == zr
                              for z in o.zones})
                return [], (f"spot prices are per zone ID, and zone name {req.zone} cannot be mapped to an ID "
                            f"without this account's mapping: give the zone ID (in {zr}: {', '.join(ids)}) "
                            f"or run `spz catalog refresh` with AWS credentials")
            zone_name = req.zone
        if region and region != zr:
            return [], f"zone {req.zone} is in region {zr}, not {region}"
        region = zr
    if region and region not in cat.regions:
        return [], (f"AWS region {region!r} is not in the catalog{_close(region, cat.regions)} "
                    f"(regions: {', '.join(cat.regions)})")
    image_regions: frozenset[str] | None = None
    if isinstance(req.image_id, dict):
        image_regions = frozenset(req.image_id)
    max_micros = dollars_to_micros(req.max_hourly_cost) if req.max_hourly_cost is not None else None
    spot = req.use_spot
    disk = req.disk_size_gb or DEFAULT_DISK_SIZE_GB
    order = req.order or 0
    if region is None and zone_id is None and zone_name is None and image_regions is None:
        # Most requests name no place: visit the index's precomputed places (same order, same result).
        out, n_loc, n_market, n_price, cheapest_seen = _candidates_anywhere(
            i, types, n, index, blocks, limit, bool(spot), req.image_id, disk, order, max_micros)
        if out:
            return out, ""
        return [], _why_empty(req, cat, types, what, region, None, image_regions,
                              n_loc, n_market, n_price, cheapest_seen, max_micros)
    n_loc = n_market = n_price = 0
    cheapest_seen: int | None = None
    out: list[Candidate] = []
    append = out.append
    best: list[int] = []  # max-heap (negated) of the `limit` lowest one-node prices found so far
    for t in types:
        if limit is not None and len(out) >= limit:
            floor = index.floor_price(t.name, spot)
            if floor is not None and floor > -best[0]:
                break  # this type and every later one cost more than the limit-th candidate
        accs = {t.accelerator: float(t.accelerator_count)} if t.accelerator else None
        name = t.name
        # Each offering's zones without Local Zones (which need an opt-in), from the index.
        for off, regular in zip(cat.offerings(name), index.regular_zones(name)):
            r = off.region
            if region is not None and r != region:
                continue
            if image_regions is not None and r not in image_regions:
                continue
            if zone_id is not None:
                zs = tuple(z for z in off.zones if z.zone == zone_id)
            elif zone_name is not None:
                zs = ()
            else:
                zs = regular
            if not zs and zone_name is None:
                continue
            n_loc += 1
            image = req.image_id[r] if image_regions is not None else req.image_id  # type: ignore[index]
            if spot:
                for z in zs:
                    p = z.spot_micros
                    if p is None:
                        continue
                    n_market += 1
                    if cheapest_seen is None or p < cheapest_seen:
                        cheapest_seen = p
                    if max_micros is not None and p > max_micros:
                        continue
                    n_price += 1
                    if limit is not None and len(best) >= limit and p > -best[0]:
                        continue  # cannot enter the top `limit`
                    if blocks and any(b.covers("aws", r, z.zone, name, True) for b in blocks):
                        continue
                    append(Candidate("aws", r, z.zone, name, accs, True, p, p * n, t.vcpus, t.memory_gib,
                                     image, disk, n, (z.zone,), i, order))
                    if limit is not None:
                        _keep_lowest(best, p, limit)
            else:
                p = off.ondemand_micros
                if p is None:
                    continue
                n_market += 1
                if cheapest_seen is None or p < cheapest_seen:
                    cheapest_seen = p
                if max_micros is not None and p > max_micros:
                    continue
                n_price += 1
                if limit is not None and len(best) >= limit and p > -best[0]:
                    continue  # cannot enter the top `limit`
                zones = (zone_name,) if zone_name is not None else tuple(z.zone for z in zs)
                if blocks:
                    zones = _surviving_zones(blocks, "aws", r, zones, name, False)
                    if not zones:
                        continue
                append(Candidate("aws", r, zone_id or zone_name, name, accs, False, p, p * n, t.vcpus,
                                 t.memory_gib, image, disk, n, zones, i, order))
                if limit is not None:
                    _keep_lowest(best, p, limit)
    if out:
        return out, ""
    return [], _why_empty(req, cat, types, what, region, zone_id or zone_name, image_regions,
                          n_loc, n_market, n_price, cheapest_seen, max_micros)


_new_tuple = tuple.__new__  # a Candidate from a ready tuple, without NamedTuple's __new__ in Python

# `_candidates_anywhere`'s answer: (candidates, n_loc, n_market, n_price, cheapest seen).
_Anywhere = tuple[list[Candidate], int, int, int, "int | None"]
ANYWHERE_MEMO_SIZE = 1024


def _candidates_anywhere(i: int, types: Sequence[InstanceType], n: int, index: CatalogIndex,
                         blocks: Sequence[Block], limit: int | None, spot: bool, image: Any, disk: int,
                         order: int, max_micros: int | None) -> _Anywhere:
    """`_scan_anywhere`, ranked (`_rank` by `_sort_key`: the order `place` puts them in) and
    remembered per catalog (`CatalogIndex.anywhere`): a pure function of these arguments, so a
    hit is what a scan would give (a fresh list of the same candidates: callers may extend or
    sort what they get; the candidates are immutable tuples)."""
    key = (tuple([t.name for t in types]), i, n, limit, spot, image, disk, order, max_micros, tuple(blocks))
    memo = index.anywhere
    got = memo.get(key)
    if got is None:
        cands, *counts = _scan_anywhere(i, types, n, index, blocks, limit, spot, image, disk, order, max_micros)
        # Kept ranked: `place` ranks again only what has more than this list (issue 21).
        got = memo[key] = (_rank(cands, _sort_key), *counts)  # type: ignore[assignment]
        if len(memo) > ANYWHERE_MEMO_SIZE:
            memo.popitem(last=False)
    else:
        memo.move_to_end(key)
    return _Ranked(got[0]), got[1], got[2], got[3], got[4]


def _scan_anywhere(i: int, types: Sequence[InstanceType], n: int, index: CatalogIndex,
                   blocks: Sequence[Block], limit: int | None, spot: bool, image: Any, disk: int,
                   order: int, max_micros: int | None) -> _Anywhere:
    """`_aws_candidates`' loop for a request that names no region, zone or per-region image,
    over `index.places`: the same candidates in the same order, and the same counts for
    `_why_empty` (this runs once per placement: issue 21)."""
    out: list[Candidate] = []
    append = out.append
    best: list[int] = []  # max-heap (negated) of the `limit` lowest one-node prices found so far
    full = limit is not None and limit <= 0  # the heap holds `limit` prices ...
    worst = 0  # ... and this is the highest of them (-best[0]) once it does
    n_loc = n_market = n_price = 0
    cheapest_seen: int | None = None
    push, replace = heapq.heappush, heapq.heapreplace
    for t in types:
        name = t.name
        if full:
            floor = index.floor_price(name, spot)
            if floor is not None and floor > worst:
                break  # this type and every later one cost more than the limit-th candidate
        places = index.places(name, spot)
        n_loc += places.n_loc
        rows = places.rows
        if not rows:
            continue
        n_market += len(rows)
        if cheapest_seen is None or places.cheapest < cheapest_seen:  # type: ignore[operator]
            cheapest_seen = places.cheapest
        if max_micros is None:
            n_price += len(rows)
        accs = {t.accelerator: float(t.accelerator_count)} if t.accelerator else None
        vcpus, memory = t.vcpus, t.memory_gib
        for r, p, z, zones in rows:
            if max_micros is not None:
                if p > max_micros:
                    continue
                n_price += 1
            if full and p > worst:
                continue  # cannot enter the top `limit`
            if blocks:
                if spot:
                    if any(b.covers("aws", r, z, name, True) for b in blocks):
                        continue
                else:
                    zones = _surviving_zones(blocks, "aws", r, zones, name, False)
                    if not zones:
                        continue
            append(_new_tuple(Candidate, ("aws", r, z, name, accs, spot, p, p * n, vcpus, memory, image, disk, n,
                                          zones, i, order)))
            if limit is not None:  # `_keep_lowest`, inlined
                if not full:
                    push(best, -p)
                    full = len(best) >= limit
                elif p < worst:
                    replace(best, -p)
                else:
                    continue
                if full:
                    worst = -best[0]
    return out, n_loc, n_market, n_price, cheapest_seen


def _keep_lowest(heap: list[int], price: int, limit: int) -> None:
    if len(heap) < limit:
        heapq.heappush(heap, -price)
    elif price < -heap[0]:
        heapq.heapreplace(heap, -price)


def _why_empty(req: ResourceRequest, cat: Catalog, types: Sequence[InstanceType], what: str,
               region: str | None, zone: str | None, image_regions: frozenset[str] | None,
               n_loc: int, n_market: int, n_price: int, cheapest: int | None, max_micros: int | None) -> str:
    market = "spot" if req.use_spot else "on demand"
    names = ", ".join(sorted({t.name for t in types})[:6])
    what_full = what if what in names else f"{what} ({names})"
    where = "/".join(p for p in (region, zone) if p) or "any AWS region"
    if n_loc == 0:
        offered = sorted({o.region for t in types for o in cat.offerings(t.name)})
        if image_regions is not None:
            return (f"image_id names only {', '.join(sorted(image_regions))}, where {what_full} is not offered"
                    f"{' in ' + where if region else ''}; it is offered in: {', '.join(offered)}")
        return f"{what_full} is not offered in {where}; it is offered in: {', '.join(offered)}"
    if n_market == 0:
        other = _cheapest(cat, types, not req.use_spot, region)
        hint = ""
        if other:
            hint = (f"; {'spot' if not req.use_spot else 'on demand'} it is {format_dollars(other[0])}/h "
                    f"in {other[2]}{'/' + other[3] if other[3] else ''}"
                    f" (set use_spot: {'true' if not req.use_spot else 'false'})")
        return f"{what_full} is not sold {market} in {where}{hint}"
    if n_price == 0 and max_micros is not None:
        return (f"the cheapest {what_full} {market} in {where} costs {format_dollars(cheapest)}/h, "
                f"above max_hourly_cost {format_dollars(max_micros)}/h")
    return f"every place for {what_full} {market} in {where} was tried and is blocked"
