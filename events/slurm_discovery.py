"""What a Slurm cluster offers, from `scontrol show partition|node -o`: pure parsing, no I/O.

`scontrol ... -o` prints one record a line as `Key=Value` pairs in every Slurm version we meet
(`sinfo --json` exists only from 21.08 with the right plugins, and its shape changes between
releases); a value with spaces (`OS=Linux 6.1 #1 SMP`) continues until the next `Key=`.
A cluster is a region; each partition is a zone of it, with its nodes, their CPUs, memory,
GRES and the partition's MaxTime and TRESBillingWeights.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .slurm_config import ClusterConfig

MAX_RECORDS = 100_000
_PAIR_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_/:]*=")
# States in which a node takes no new work (scontrol prints e.g. IDLE+DRAIN, DOWN*, MIXED).
_UNUSABLE = ("DOWN", "DRAIN", "FAIL", "INVAL", "MAINT", "NOT_RESPONDING", "POWERED_DOWN", "FUTURE", "REBOOT")


@dataclass(frozen=True)
class SlurmNode:
    name: str
    addr: str
    cpus: int
    memory_mib: int
    gres: Mapping[str, int] = field(default_factory=dict)  # GRES gpu type -> count ("" for an untyped gpu)
    partitions: tuple[str, ...] = ()
    state: str = "UNKNOWN"

    @property
    def usable(self) -> bool:
        return not any(s in self.state.upper() for s in _UNUSABLE)


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    nodes: tuple[str, ...]
    max_time: str = "UNLIMITED"
    default: bool = False
    state: str = "UP"
    billing_weights: str = ""  # TRESBillingWeights, as configured (CPU=1.0,Mem=0.25G,GRES/gpu=2.0)


@dataclass(frozen=True)
class ZoneOffer:
    """One partition as a placement zone: what its largest usable node shape can take."""

    cluster: str
    partition: str
    nodes: int  # usable nodes
    cpus: int  # per node (the smallest usable node)
    memory_mib: int
    gpus: Mapping[str, int]  # GRES type -> count per node (the smallest usable node)
    max_time: str
    default: bool
    billing_weights: str


def key_values(line: str) -> dict[str, str]:
    """One `Key=Value Key=Value` record; a word without `Key=` continues the previous value."""
    out: dict[str, str] = {}
    last: str | None = None
    for word in line.split():
        if _PAIR_KEY.match(word):
            key, _, value = word.partition("=")
            out[key] = value
            last = key
        elif last is not None:
            out[last] += " " + word
    return out


def _records(text: str, first_key: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith(first_key + "="):
            out.append(key_values(line))
            if len(out) > MAX_RECORDS:
                raise ValueError(f"more than {MAX_RECORDS:,} records from scontrol")
    return out


def expand_hostlist(spec: str) -> list[str]:
    """Slurm's hostlist syntax: `n[1-3,5],gpu[01-02]` -> n1 n2 n3 n5 gpu01 gpu02."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", spec or ""):
        out.extend(_expand_one(part.strip()))
    return [h for h in out if h]


def _expand_one(part: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", part)
    if m is None:
        return [part]
    head, tail = part[:m.start()], part[m.end():]
    names: list[str] = []
    for rng in m.group(1).split(","):
        lo, _, hi = rng.partition("-")
        if not hi:
            names.append(lo)
            continue
        if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo) or int(hi) - int(lo) > MAX_RECORDS:
            raise ValueError(f"not a host range: [{rng}]")
        names.extend(str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1))
    return [n for name in names for n in _expand_one(head + name + tail)]


def parse_gres(text: str) -> dict[str, int]:
    """`gpu:h100:2,gpu:a100:1(S:0),shard:4` -> {h100: 2, a100: 1}; an untyped `gpu:2` -> {"": 2}."""
    out: dict[str, int] = {}
    if not text or text == "(null)":
        return out
    for item in text.split(","):
        item = re.sub(r"\(.*?\)", "", item).strip()
        parts = item.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        kind, count = (parts[1], parts[2]) if len(parts) >= 3 else ("", parts[1])
        try:
            out[kind] = out.get(kind, 0) + int(re.match(r"\d+", count).group())  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            continue
    return out


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(re.match(r"\d+", value or "").group())  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        return default


def parse_nodes(text: str) -> list[SlurmNode]:
    out = []
    for r in _records(text, "NodeName"):
        out.append(SlurmNode(
            name=r["NodeName"], addr=r.get("NodeAddr") or r["NodeName"],
            cpus=_int(r.get("CPUEfctv") or r.get("CPUTot")), memory_mib=_int(r.get("RealMemory")),
            gres=parse_gres(r.get("Gres", "")),
            partitions=tuple(p for p in r.get("Partitions", "").split(",") if p), state=r.get("State", "UNKNOWN")))
    return out


def parse_partitions(text: str) -> list[SlurmPartition]:
    out = []
    for r in _records(text, "PartitionName"):
        nodes = r.get("Nodes", "")
        out.append(SlurmPartition(
            name=r["PartitionName"], nodes=tuple(expand_hostlist(nodes) if nodes not in ("", "(null)") else ()),
            max_time=r.get("MaxTime", "UNLIMITED"), default=r.get("Default", "NO").upper() == "YES",
            state=r.get("State", "UP"), billing_weights=r.get("TRESBillingWeights", "")))
    return out


def zone_offers(cluster: str, partitions: Iterable[SlurmPartition], nodes: Iterable[SlurmNode]) -> list[ZoneOffer]:
    """Each UP partition with a usable node, shaped by its smallest usable node (a gang of N
    nodes must fit on any N of them)."""
    by_name = {n.name: n for n in nodes}
    out = []
    for p in partitions:
        if p.state.upper() != "UP":
            continue
        usable = [by_name[n] for n in p.nodes if n in by_name and by_name[n].usable]
        if not usable:
            continue
        kinds = set.intersection(*(set(n.gres) for n in usable))
        gpus = {k: min(n.gres[k] for n in usable) for k in sorted(kinds)}
        out.append(ZoneOffer(cluster=cluster, partition=p.name, nodes=len(usable), cpus=min(n.cpus for n in usable),
                             memory_mib=min(n.memory_mib for n in usable), gpus=gpus, max_time=p.max_time,
                             default=p.default, billing_weights=p.billing_weights))
    return out


def accelerator_name(kind: str, gres_map: Mapping[str, str], known: Iterable[str] = ()) -> str:
    """The catalog name of a GRES type: the configured map read backwards, else a known name
    equal to it but for case, else the type in upper case (h100 -> H100)."""
    for name, k in gres_map.items():
        if k == kind:
            return name
    for name in known:
        if name.lower() == kind.lower():
            return name
    return kind.upper()


# ---------------------------------------------------------------------------------- placement

DEFAULT_CPUS = 1  # a task that names no CPUs gets one per node (sbatch's own default)
DEFAULT_MEM_PER_CPU_MIB = 1024  # = services/provisioner/slurm_sbatch.DEFAULT_MEM_PER_CPU_MIB


@dataclass(frozen=True)
class SlurmCluster:
    """One cluster of ~/.slurm/config as the optimizer sees it: its partitions, or why not."""

    cluster: str
    offers: tuple[ZoneOffer, ...] = ()
    error: str = ""  # the login node did not answer, or scontrol failed
    config: ClusterConfig = ClusterConfig()  # its `slurm:` settings: GRES map, pricing

    def price_micros(self, partition: str, cpus: int, mem_mib: int, accelerator: str | None, gpus: int) -> int:
        pricing = self.config.for_partition(partition).pricing
        return pricing.hourly_micros(cpus, mem_mib / 1024, accelerator, gpus)

    @property
    def reachable(self) -> bool:
        return not self.error


def node_shape(cpus: float | None, memory_gib: float | None, accelerator: str | None,
               accelerator_count: float | None) -> tuple[int, int, int]:
    """(CPUs, MiB, GPUs) per node of a request: whole CPUs and GPUs, a bounded default memory."""
    import math

    c = max(1, int(math.ceil(cpus))) if cpus else DEFAULT_CPUS
    mem = int(math.ceil(memory_gib * 1024)) if memory_gib else c * DEFAULT_MEM_PER_CPU_MIB
    g = int(math.ceil(accelerator_count or 1)) if accelerator else 0
    return c, mem, g


def fits(offer: ZoneOffer, n: int, cpus: int, mem_mib: int, accelerator: str | None, gpus: int,
         gres: Mapping[str, str]) -> str:
    """"" when `n` nodes of this shape fit the partition's nodes, else why not."""
    if offer.nodes < n:
        return f"{offer.partition}: {offer.nodes} usable nodes, the task needs {n}"
    if offer.cpus < cpus:
        return f"{offer.partition}: {offer.cpus} CPUs per node, the task asks {cpus}"
    if offer.memory_mib < mem_mib:
        return f"{offer.partition}: {offer.memory_mib} MiB per node, the task asks {mem_mib}"
    if accelerator:
        kind = next((gres[a] for a in (accelerator, accelerator.upper()) if a in gres), accelerator.lower())
        have = offer.gpus.get(kind, 0)
        if have < gpus:
            shown = ", ".join(f"{accelerator_name(k, gres)}:{c}" for k, c in offer.gpus.items()) or "no GPU"
            return f"{offer.partition}: {shown} per node, the task asks {accelerator}:{gpus}"
    return ""
