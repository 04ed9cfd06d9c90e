"""Whether a task fits a cluster that already exists: `spz launch -c NAME` and `spz exec NAME`.

As SkyPilot's `check_resources_fit_cluster`: a task is run on an existing cluster only when one
of its resource alternatives is no more demanding than what the cluster was launched with —
same infra, region, zone and instance type when the task names them, spot when it asks for spot,
each accelerator it asks for present in at least that count, CPUs and memory no more than a node
has, and no more nodes than the cluster has. Otherwise the command is refused (exit 1, as sky's
ResourcesMismatchError) with what was asked, what the cluster has, and how to go on.

Pure: the cluster as the log has it (anything with a `FitShape`'s attributes: the CLI's
`clusterlog.Cluster`, the API server's `ClusterShape` of the latest ClusterProvisioned) and the
task's requests (`Task.resource_requests()`). One copy for both: `spz exec` / `spz launch -c`
decide with it on the embedded bus, `POST /api/v1/clusters/{name}/jobs` through a server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .taskspec.request import ResourceRequest

_ANY = ("*", "", None)


class FitShape(Protocol):
    """What the check reads of a cluster: where it is and what each node has, as placed."""

    name: str
    num_nodes: int
    infra: str | None
    region: str | None
    zone: str | None
    instance_type: str | None
    use_spot: bool
    accelerators: Mapping[str, float] | None
    vcpus: float | None
    memory_gib: float | None


@dataclass(frozen=True)
class ClusterShape:
    """A cluster's `FitShape` from its ClusterProvisioned (the API server's reading of the log)."""

    name: str
    num_nodes: int
    infra: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    use_spot: bool = False
    accelerators: Mapping[str, float] | None = None
    vcpus: float | None = None
    memory_gib: float | None = None

    @classmethod
    def of_provisioned(cls, event: Any) -> "ClusterShape":
        from .fold import cluster_nodes_of

        c = event.candidate
        return cls(event.cluster, cluster_nodes_of(event), c.infra, c.region, c.zone, c.instance_type,
                   bool(c.use_spot), dict(c.accelerators) if c.accelerators else None, c.vcpus, c.memory_gib)


@dataclass(frozen=True)
class Misfit:
    cluster: str
    asked: str  # what the closest alternative asks for that the cluster lacks
    has: str  # what the cluster has, in the same words

    def message(self) -> str:
        return (f"the task asks for {self.asked}; cluster {self.cluster} has {self.has}. "
                f"Use another cluster name (-c), or take this one down first: spz down {self.cluster}")


def misfit(cluster: FitShape, requests: Sequence[ResourceRequest], nodes: int) -> Misfit | None:
    """None when the task fits; else why its first alternative does not (sky reports the task's
    resources as a whole; the first alternative is the one the user wrote first)."""
    if nodes > cluster.num_nodes:
        return Misfit(cluster.name, f"{nodes} nodes", f"{cluster.num_nodes}")
    reasons = [_mismatch(cluster, r) for r in (requests or [ResourceRequest()])]
    if any(r is None for r in reasons):
        return None
    asked, has = reasons[0]  # type: ignore[misc]
    return Misfit(cluster.name, asked, has)


def _same(a: str | None, b: str | None) -> bool:
    return (a or "").lower() == (b or "").lower()


def _mismatch(c: FitShape, r: ResourceRequest) -> tuple[str, str] | None:
    if r.cloud not in _ANY and not _same(r.cloud, c.infra):
        return f"infra {r.cloud}", f"infra {c.infra or 'unknown'}"
    if r.region not in _ANY and not _same(r.region, c.region):
        return f"region {r.region}", f"region {c.region or 'none'}"
    if r.zone not in _ANY and not _same(r.zone, c.zone):
        return f"zone {r.zone}", f"zone {c.zone or 'none'}"
    if r.instance_type not in _ANY and not _same(r.instance_type, c.instance_type):
        return f"instance type {r.instance_type}", f"instance type {c.instance_type or 'unknown'}"
    if r.use_spot and not c.use_spot:
        return "spot instances", "on-demand instances"
    if r.accelerator:
        want = r.accelerator_count if r.accelerator_count is not None else 1.0
        have = {k.lower(): v for k, v in (c.accelerators or {}).items()}.get(r.accelerator.lower(), 0.0)
        if have < want:
            return f"{r.accelerator}:{_num(want)} per node", _accelerators(c)
    if r.cpus is not None and c.vcpus is not None and r.cpus > c.vcpus:
        return f"{_num(r.cpus)}{'+' if r.cpus_plus else ''} CPUs per node", f"{_num(c.vcpus)} CPUs per node"
    memory = r.memory_gib
    if r.memory_ratio is not None and r.cpus is not None:
        memory = max(memory or 0.0, r.memory_ratio * r.cpus)
    if memory is not None and c.memory_gib is not None and memory > c.memory_gib:
        return f"{_num(memory)} GiB memory per node", f"{_num(c.memory_gib)} GiB per node"
    return None


def _accelerators(c: FitShape) -> str:
    if not c.accelerators:
        return "no accelerators"
    return ", ".join(f"{k}:{_num(v)}" for k, v in sorted(c.accelerators.items())) + " per node"


def _num(x: float) -> str:
    return f"{x:g}"
