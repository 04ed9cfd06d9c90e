"""Client side of the metrics service's queries (NATS request-reply): the `/metrics` page, for
a server that shows it without being the metrics service (the API server's `GET /metrics`), and
goodput by team and job (the console's observability page).

The observability service (platform) answers on `naming.query_subject(stage, "observability",
"render")` with `{content_type, body}`: the same bytes its own endpoint serves for that Accept
header (docs/observability.md); `goodput` with `{ledger, team: [...], job: [...]}`, each row
`{key, useful_s, paid_s, ratio, idle_dollars}` (ratio null when nothing was paid).
"""

from __future__ import annotations

from typing import Any

from .bus import Bus

SERVICE = "observability"
MAX_ACCEPT_CHARS = 512


async def render(bus: Bus, accept: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    return await bus.request(SERVICE, "render", {"accept": (accept or "")[:MAX_ACCEPT_CHARS]}, timeout=timeout)


async def goodput(bus: Bus, timeout: float = 10.0) -> dict[str, Any]:
    return await bus.request(SERVICE, "goodput", {}, timeout=timeout)
