"""GPU health findings, on the `cluster` aggregate (keyed by cluster name).

Emitted by the GPU health manager (platform: services/observability/gpuhealth/), read by the
node agents of the cluster (a node with a fatal finding is drained: no new job is admitted on the
cluster) and by whoever tells the cluster's owner. The samples the findings come from are not
events: they go on core NATS (`naming.sample_subject`, events/nodesample.py; docs/DESIGN.md,
*Node samples*).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from .registry import Event, register

# The rules of services/observability/gpuhealth/rules.py (docs/gpu-health.md).
HealthRule = Literal["xid", "ecc_uncorrected", "ecc_corrected", "gpu_missing", "gpu_idle", "thermal_throttle", "power_throttle"]
# fatal: the node is drained and a managed job on it recovered elsewhere; warning: reported only.
Severity = Literal["fatal", "warning"]


@register
class GpuUnhealthy(Event):
    EVENT_NAME = "gpu_unhealthy"
    AGGREGATE = "cluster"
    AGGREGATE_KEY = "cluster"
    cluster: str
    rank: int
    gpu_index: int | None = None  # None: the node as a whole (a GPU missing, nvidia-smi failing)
    rule: HealthRule
    severity: Severity = "fatal"
    detail: str = ""  # one line for people: "GPU 0: Xid 79 (GPU has fallen off the bus)"
    evidence: dict[str, Any] = {}
    detected_at: datetime
