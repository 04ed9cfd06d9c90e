"""What the optimizer needs from a task: one flat, normalised resource request per alternative.

The task model (SkyPilot YAML, `skypurza.events.taskspec`) expands `resources` — with its
`accelerators` in all forms, `any_of`, `ordered`, `infra`, legacy `cloud/region/zone` — into a
list of `ResourceRequest`s. The optimizer ranks candidates for these; it never reads YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ResourceRequest:
    # Where: a lower-case cloud/infra name ("aws", "gcp", "local", "kubernetes", "ssh", ...)
    # or None for any; region and zone None for any. Zone may be a zone name or a zone id.
    cloud: str | None = None
    region: str | None = None
    zone: str | None = None
    # What: accelerator in the catalog's spelling (A100, A100-80GB, H100, T4 ...) and count.
    accelerator: str | None = None
    accelerator_count: float | None = None
    # Minimums. cpus=4, cpus_plus=False means exactly 4 vCPUs; cpus_plus=True means at least 4.
    cpus: float | None = None
    cpus_plus: bool = False
    # Memory in GiB (exact or at least), or as a ratio to vCPUs ("4x" -> memory_ratio=4).
    memory_gib: float | None = None
    memory_plus: bool = False
    memory_ratio: float | None = None
    instance_type: str | None = None
    use_spot: bool = False
    disk_size_gb: int | None = None
    disk_tier: str | None = None
    network_tier: str | None = None
    # A plain image id, or {region: image id}.
    image_id: str | dict[str, str] | None = None
    max_hourly_cost: float | None = None
    ports: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    # Position in an `ordered` list or in an accelerator list ([A100:8, H100:8]): the optimizer
    # tries lower numbers first and ignores price between them. None: rank by price (any_of, sets).
    order: int | None = None
    # Anything else carried for later stages (job_recovery, autostop, accelerator_args ...).
    extra: dict[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:  # dict fields are not hashable; identity by the visible fields
        return hash((self.cloud, self.region, self.zone, self.accelerator, self.accelerator_count,
                     self.cpus, self.cpus_plus, self.memory_gib, self.memory_plus, self.memory_ratio,
                     self.instance_type, self.use_spot, self.disk_size_gb, self.order))
