"""Client side of the GPU health manager's query (NATS request-reply), for a reader that is not
the manager (the API server's `GET /api/v1/observability/gpus`; `spz health` asks the same).

The manager (platform: services/observability/gpuhealth/) answers on
`naming.query_subject(stage, "gpuhealth", "nodes")` with one row per node it has heard from:
`{cluster, rank, sample: NodeSample as JSON | null, findings: [...]}` (docs/gpu-health.md).
"""

from __future__ import annotations

from typing import Any

from .bus import Bus

SERVICE = "gpuhealth"


async def nodes(bus: Bus, cluster: str | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
    return await bus.request(SERVICE, "nodes", {"cluster": cluster} if cluster else {}, timeout=timeout)
