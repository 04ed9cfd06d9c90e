"""A node's sample: CPU, memory, disk and each GPU, as the node agent measured it.

Samples are not events: an agent sends one every `SKYPURZA_AGENT_SAMPLE_S` seconds on core NATS
(`naming.sample_subject`), fire and forget, and whoever listens (the GPU health manager) keeps the
last one per node. Why not the log: 500 nodes every 10 s is 4.3 million events a day on a stream
that denies delete and purge, for values that matter for a minute; a finding drawn from them is
an event (events/health_events.py). docs/DESIGN.md, *Node samples*.

Bounded at the edge: a sample is at most MAX_SAMPLE_BYTES, lists are capped, and an unreadable
one is dropped by the listener (one bad node never stops it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_GPUS = 64  # per node (an HGX node has 8; headroom for odd hardware, never unbounded)
MAX_XIDS = 32  # distinct Xid codes kept per GPU
MAX_THROTTLE_REASONS = 16
MAX_SAMPLE_BYTES = 64 * 1024
MAX_NOTE_CHARS = 300


class XidCount(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    code: int = Field(ge=0, le=100_000)
    count: int = Field(ge=1)


class GpuSample(BaseModel):
    """One GPU. A field nvidia-smi reports as [N/A] or [Not Supported] (DCGM: N/A) is None."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    index: int = Field(ge=0, lt=MAX_GPUS)
    name: str = Field(default="", max_length=100)
    pci_bus_id: str = Field(default="", max_length=40)
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None  # single-bit, volatile: DCGM only (nvidia-smi's query has no column)
    throttle_reasons: list[str] = Field(default_factory=list, max_length=MAX_THROTTLE_REASONS)
    xids: list[XidCount] = Field(default_factory=list, max_length=MAX_XIDS)  # since boot, from the kernel log


class UnlistedDevice(BaseModel):
    """A GPU that answers no query: a PCI device the kernel logged Xids for that nvidia-smi does
    not list, or one DCGM lists without readings (fell off the bus)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    pci_bus_id: str = Field(max_length=40)
    xids: list[XidCount] = Field(default_factory=list, max_length=MAX_XIDS)


class NodeSample(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    cluster: str = Field(max_length=200)
    rank: int = Field(ge=0)
    instance_id: str | None = Field(default=None, max_length=200)
    ts: str = Field(max_length=40)  # ISO 8601 UTC, the agent's clock
    cpu_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    disk_used_gib: float | None = None
    disk_total_gib: float | None = None
    # What the node was provisioned with (its ClusterProvisioned's accelerators per node) and
    # which GPU indices the jobs running on it hold: the rules compare them with `gpus`.
    expected_gpus: int = Field(default=0, ge=0, le=MAX_GPUS)
    busy_gpus: list[int] = Field(default_factory=list, max_length=MAX_GPUS)
    gpus: list[GpuSample] = Field(default_factory=list, max_length=MAX_GPUS)
    unlisted: list[UnlistedDevice] = Field(default_factory=list, max_length=MAX_GPUS)
    gpu_error: str = Field(default="", max_length=MAX_NOTE_CHARS)  # the GPU source failed: why, in one line
    gpu_source: str = Field(default="", max_length=40)  # where GPUs were read ("dcgm", "nvidia-smi", "")
    xid_source: str = Field(default="", max_length=40)  # where Xids were read ("dmesg", "journalctl", "")


def decode_sample(data: bytes) -> NodeSample | None:
    """A sample from the wire, or None when it is too big or does not validate."""
    if len(data) > MAX_SAMPLE_BYTES:
        return None
    try:
        return NodeSample.model_validate_json(data)
    except ValueError:
        return None
