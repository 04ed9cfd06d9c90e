"""Client side of the metrics service's one query (NATS request-reply): the `/metrics` page, for
a server that shows it without being the metrics service (the API server's `GET /metrics`).

The observability service (platform) answers on `naming.query_subject(stage, "observability",
"render")` with `{content_type, body}`: the same bytes its own endpoint serves for that Accept
header (docs/observability.md).
"""

from __future__ import annotations

from typing import Any

from .bus import Bus

SERVICE = "observability"
MAX_ACCEPT_CHARS = 512


async def render(bus: Bus, accept: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    return await bus.request(SERVICE, "render", {"accept": (accept or "")[:MAX_ACCEPT_CHARS]}, timeout=timeout)
