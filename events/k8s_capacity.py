"""What a Kubernetes context can take, from its nodes and pods (pure: plain dicts in, values out).

The optimizer places on it (allocatable minus what scheduled pods request, per node) and the
provisioner asks for the same pod size: both read the size from the candidate's instance type,
SkyPilot's spelling `<cpus>CPU--<memory>GB[--<GPU>:<count>]`.

GPUs are `nvidia.com/gpu`; which GPU a node has is read from its labels, the first of
`GPU_LABEL_KEYS` it carries (NVIDIA's GPU feature discovery, GKE, Karpenter, EKS, SkyPilot's
own), mapped to the catalog's spelling (`gpu_name`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
GPU_LABEL_KEYS = (
    "nvidia.com/gpu.product",  # NVIDIA GPU feature discovery: NVIDIA-H100-80GB-HBM3
    "cloud.google.com/gke-accelerator",  # GKE: nvidia-h100-80gb, nvidia-tesla-a100
    "karpenter.k8s.aws/instance-gpu-name",  # Karpenter on AWS: h100, a10g
    "k8s.amazonaws.com/accelerator",  # EKS: nvidia-tesla-v100
    "skypilot.co/accelerator",  # SkyPilot's own labeller: h100
)
# Names spelled apart from their base (A100 is the 40 GB one): the most specific known name wins.
KNOWN_GPUS = ("A100", "A100-80GB", "A10", "A10G", "B200", "GB200", "H100", "H200", "K80", "L4", "L40", "L40S",
              "P100", "RTX4090", "RTX6000", "T4", "V100", "V100-32GB")
_VENDOR = {"nvidia", "tesla", "geforce"}
DEFAULT_CPUS = 2.0  # SkyPilot's default pod: 2 CPUs, 2 GiB per CPU
DEFAULT_MEMORY_PER_CPU_GIB = 2.0
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def quantity(value: Any) -> float:
    """A Kubernetes quantity ("500m", "128Gi", "2", 4) as a float; 0 for what does not parse."""
    m = _QUANTITY.match(str(value).strip())
    if not m:
        return 0.0
    number, suffix = float(m.group(1)), m.group(2)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    return number * _DECIMAL.get(suffix, 0.0)


def _tokens(value: str) -> list[str]:
    return [t for t in re.split(r"[-_\s]+", value.lower()) if t and t not in _VENDOR]


def gpu_name(label_value: str, known: Iterable[str] = KNOWN_GPUS) -> str | None:
    """A node label's GPU in the catalog's spelling: "NVIDIA-A100-SXM4-80GB" -> A100-80GB,
    "nvidia-tesla-v100" -> V100, "h100" -> H100; None when no known name matches."""
    toks = set(_tokens(label_value))
    best: tuple[int, str] | None = None
    for name in known:
        parts = _tokens(name)
        if parts and set(parts) <= toks and (best is None or len(parts) > best[0]):
            best = (len(parts), name)
    return best[1] if best else None


def gpu_of_node(labels: Mapping[str, str], known: Iterable[str] = KNOWN_GPUS) -> tuple[str, str, str] | None:
    """(label key, label value, GPU name) of the first GPU label of a node that names a known GPU."""
    for key in GPU_LABEL_KEYS:
        value = labels.get(key)
        if value:
            name = gpu_name(value, known)
            if name:
                return key, value, name
    return None


@dataclass(frozen=True)
class PodSize:
    cpus: float
    memory_gib: float
    gpu: str | None = None
    gpus: int = 0

    def instance_type(self) -> str:
        """SkyPilot's virtual instance type for Kubernetes: 4CPU--16GB--H100:1."""
        base = f"{_num(self.cpus)}CPU--{_num(self.memory_gib)}GB"
        return f"{base}--{self.gpu}:{self.gpus}" if self.gpu and self.gpus else base


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


_TYPE = re.compile(r"^([0-9.]+)CPU--([0-9.]+)GB(?:--([A-Za-z0-9][A-Za-z0-9_.-]*):([0-9]+))?$")


def parse_instance_type(value: str) -> PodSize | None:
    m = _TYPE.match(value or "")
    if not m:
        return None
    cpus, mem = float(m.group(1)), float(m.group(2))
    if not (0 < cpus <= 4096 and 0 < mem <= 65536):
        return None
    gpus = int(m.group(4)) if m.group(4) else 0
    return PodSize(cpus, mem, m.group(3) if gpus else None, min(gpus, 64))


def pod_size(cpus: float | None, memory_gib: float | None, memory_ratio: float | None,
             gpu: str | None, gpu_count: float | None) -> PodSize:
    """A request's pod: SkyPilot's defaults where it says nothing (2 CPUs, 2 GiB per CPU)."""
    c = float(cpus) if cpus else DEFAULT_CPUS
    mem = float(memory_gib) if memory_gib else c * (memory_ratio or DEFAULT_MEMORY_PER_CPU_GIB)
    n = int(math.ceil(gpu_count or 1)) if gpu else 0
    return PodSize(c, mem, gpu if gpu else None, n)


@dataclass(frozen=True)
class NodeFree:
    name: str
    cpus: float
    memory_gib: float
    gpus: int
    gpu: str | None  # catalog name
    gpu_label: tuple[str, str] | None  # (key, value) of the label that named it
    taints: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class ContextCapacity:
    context: str
    nodes: tuple[NodeFree, ...]
    reachable: bool = True
    error: str = ""
    gpu_hourly_usd: float = 0.0  # prices from config ($0 by default, as SkyPilot)
    cpu_hourly_usd: float = 0.0
    placement: str = "by_price"  # kubernetes.placement: by_price, before_cloud or after_cloud

    def gpus(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            if n.gpu and n.gpus:
                out[n.gpu] = out.get(n.gpu, 0) + n.gpus
        return out

    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    def gpu_labels(self, gpu: str) -> list[tuple[str, str]]:
        return sorted({n.gpu_label for n in self.nodes if n.gpu == gpu and n.gpu_label})

    def fits(self, size: PodSize, num_nodes: int) -> bool:
        """Whether `num_nodes` pods of `size` can be placed now (first fit, biggest nodes first)."""
        free = [[n.cpus, n.memory_gib, n.gpus] for n in self.nodes if not size.gpu or n.gpu == size.gpu]
        free.sort(key=lambda f: (f[2], f[0]), reverse=True)
        for _ in range(num_nodes):
            for f in free:
                if f[0] >= size.cpus and f[1] >= size.memory_gib and f[2] >= size.gpus:
                    f[0] -= size.cpus
                    f[1] -= size.memory_gib
                    f[2] -= size.gpus
                    break
            else:
                return False
        return True


def _ready(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


def _requests(pod: Mapping[str, Any]) -> tuple[float, float, int]:
    cpu = mem = 0.0
    gpus = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        cpu += quantity(req.get("cpu", 0))
        mem += quantity(req.get("memory", 0))
        gpus += int(quantity(req.get(GPU_RESOURCE, 0)))
    return cpu, mem, gpus


def context_capacity(context: str, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
                     known: Iterable[str] = KNOWN_GPUS) -> ContextCapacity:
    """Each ready node's allocatable minus what the pods bound to it request (finished pods free theirs)."""
    known = tuple(known)
    used: dict[str, list[float]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        cpu, mem, gpus = _requests(pod)
        u = used.setdefault(node, [0.0, 0.0, 0.0])
        u[0] += cpu
        u[1] += mem
        u[2] += gpus
    out = []
    for node in nodes:
        if not _ready(node):
            continue
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        alloc = (node.get("status") or {}).get("allocatable") or {}
        u = used.get(name, [0.0, 0.0, 0.0])
        gpu = gpu_of_node(meta.get("labels") or {}, known)
        gpus = max(0, int(quantity(alloc.get(GPU_RESOURCE, 0)) - u[2]))
        out.append(NodeFree(
            name=name, cpus=max(0.0, quantity(alloc.get("cpu", 0)) - u[0]),
            memory_gib=max(0.0, (quantity(alloc.get("memory", 0)) - u[1]) / 2**30),
            gpus=gpus if gpu else 0, gpu=gpu[2] if gpu else None, gpu_label=(gpu[0], gpu[1]) if gpu else None,
            taints=tuple((node.get("spec") or {}).get("taints") or ()),
        ))
    return ContextCapacity(context, tuple(out))


def hourly_price_micros(size: PodSize, gpu_hourly_usd: float, cpu_hourly_usd: float) -> int:
    """Price from config: per GPU-hour and per CPU-hour ($0 by default, as SkyPilot)."""
    return int(round((size.gpus * gpu_hourly_usd + size.cpus * cpu_hourly_usd) * 1_000_000))
