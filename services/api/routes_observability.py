"""Observability over HTTP, for the console's observability page (docs/console.md, *Observability*).

- `GET /api/v1/observability/gpus`: each GPU's utilisation, memory, temperature and power from
  its node's last sample, as the GPU health manager keeps them (asked over the bus:
  events/health_queries.py);
- `GET /api/v1/observability/goodput`: useful over paid GPU time by team and by managed job, the
  numbers of the `*_goodput_ratio` metric families (events/metrics_queries.py);
- `GET /api/v1/observability/health`: the GPU health findings (GpuUnhealthy) from the log, newest
  first, each with whether its cluster was drained; `at=` gives them as the log stood then.

Admins only (a member's or viewer's token is a 403): like `/metrics`, each spans every team's nodes.
A service that does not answer is a 503 that says which one.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Query

from skypurza.events import health_queries, limits, metrics_queries, naming
from skypurza.events.health_events import GpuUnhealthy

from . import timetravel
from .deps import ApiDeps
from .identity import Principal, authorize
from .observability_view import finding_row, gpu_rows
from .problems import forbidden, unavailable

log = logging.getLogger("skypurza.api")

QUERY_TIMEOUT_S = 10.0
MAX_FINDINGS = 1000  # the newest findings a request may ask for


def cluster_query() -> Any:
    return Query(None, min_length=1, max_length=limits.MAX_CLUSTER_NAME_CHARS,
                 pattern=f"^{naming.CLUSTER_NAME_RE.pattern}$", description="Only this cluster's.")


def router(deps: ApiDeps) -> APIRouter:
    r = APIRouter(prefix="/api/v1/observability", tags=["observability"])

    async def admin(who: Principal = Depends(deps.principal)) -> Principal:
        if not authorize(who, "manage").allowed:
            raise forbidden(f"{who.user} is a {who.role}: GPU utilisation, goodput and GPU health span every "
                            "team's nodes, so they are for admins (as /metrics is)")
        return who

    only_admin = Depends(admin)

    @r.get("/gpus", summary="Each node's GPUs from its last sample: utilisation, memory, temperature, power")
    async def gpus(who: Principal = only_admin,
                   cluster: str | None = cluster_query()) -> dict[str, Any]:
        try:
            nodes = await health_queries.nodes(deps.bus(), cluster, timeout=QUERY_TIMEOUT_S)
        except Exception as exc:
            log.warning("gpuhealth nodes query failed: %s: %s", type(exc).__name__, exc)
            raise unavailable("the GPU health manager is not answering; is the control plane's gpuhealth service "
                              "running? (`spz api status`)")
        rows, truncated = gpu_rows(nodes if isinstance(nodes, list) else [], cluster)
        return {"gpus": rows, "truncated": truncated}

    @r.get("/goodput", summary="Useful over paid GPU time by team and by managed job, and the idle dollars")
    async def goodput(who: Principal = only_admin) -> dict[str, Any]:
        try:
            rep = await metrics_queries.goodput(deps.bus(), timeout=QUERY_TIMEOUT_S)
        except Exception as exc:
            log.warning("goodput query failed: %s: %s", type(exc).__name__, exc)
            raise unavailable("the metrics service is not answering; is the control plane's observability "
                              "service running? (`spz api status`)")
        return {"ledger": bool(rep.get("ledger")), "team": list(rep.get("team") or [])[:MAX_FINDINGS],
                "job": list(rep.get("job") or [])[:MAX_FINDINGS]}

    @r.get("/health", summary="GPU health findings (GpuUnhealthy) from the log, newest first, and drains")
    async def health(who: Principal = only_admin,
                     cluster: str | None = cluster_query(),
                     limit: int = Query(200, ge=1, le=MAX_FINDINGS, description="The newest N findings."),
                     at: str | None = Query(None, max_length=timetravel.MAX_AT_CHARS,
                                            description=timetravel.AT_DESCRIPTION)) -> dict[str, Any]:
        when = timetravel.checked_at(at)
        b = deps.bus()
        found: list[dict[str, Any]] = []
        try:
            subject = naming.event_filter(b.stage, "cluster", GpuUnhealthy.EVENT_NAME)
            if await b.last_event(subject) is not None:  # none yet: no replay to wait on
                async for s in b.replay(filter_subject=subject, until_time=when):
                    if isinstance(s.event, GpuUnhealthy) and (not cluster or s.event.cluster == cluster):
                        found.append(finding_row(s.seq, s.event))
                        if len(found) > limit:
                            found.pop(0)
        except Exception as exc:
            log.warning("reading GPU health findings failed: %s: %s", type(exc).__name__, exc)
            raise unavailable("the server cannot read the log just now; try again shortly", 2)
        drained = sorted({f["cluster"] for f in found if f["drained"]})
        return {"findings": found[::-1], "drained_clusters": drained, **({"at": when.isoformat()} if when else {})}

    return r
