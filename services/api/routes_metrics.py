"""`GET /metrics` on the API server: the metrics service's page, asked over the bus
(events/metrics_queries.py), so a Prometheus that reaches only the API server scrapes the same
families as the control plane's own endpoint (docs/observability.md).

Who may scrape: an admin (a token, or the embedded server's loopback caller), or whoever presents
the metrics token (`SKYPURZA_API_METRICS_TOKEN`: a scrape-only secret for Prometheus's
`authorization: {credentials: ...}`, so Prometheus needs no user's token). A member's or viewer's
token is a 403: the page holds every team's spend. Not in the OpenAPI document: a text page for
Prometheus, not a JSON route.
"""

from __future__ import annotations

import hmac
import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response

from skypurza.events import metrics_queries

from .deps import ApiDeps
from .problems import forbidden, unavailable

log = logging.getLogger("skypurza.api")

RENDER_TIMEOUT_S = 10.0
MIN_TOKEN_CHARS = 16  # a shorter metrics token is refused at start (a guessable secret)


def router(deps: ApiDeps, metrics_token: str | None) -> APIRouter:
    r = APIRouter()

    def presents_metrics_token(request: Request) -> bool:
        if not metrics_token:
            return False
        scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), metrics_token.encode())

    @r.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        if not presents_metrics_token(request):
            who = await deps.principal(request)  # no token or a wrong one: 401
            if who.role != "admin":
                raise forbidden(f"{who.user} is a {who.role}: /metrics shows every team's spend, so it is for "
                                "admins or the metrics token (SKYPURZA_API_METRICS_TOKEN)")
        try:
            page = await metrics_queries.render(deps.bus(), request.headers.get("accept"), timeout=RENDER_TIMEOUT_S)
        except Exception as exc:
            log.warning("metrics: the observability service did not answer: %s: %s", type(exc).__name__, exc)
            raise unavailable("the metrics service is not answering; is the control plane's observability "
                              "service running? (`spz api status`)")
        return Response(page["body"].encode(), media_type=None, headers={"Content-Type": page["content_type"]})

    return r
