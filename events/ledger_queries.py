"""Client side of the ledger's queries (NATS request-reply): thin helpers for the CLI and tools.

The ledger service (platform: accounting) answers on `naming.query_subject(stage, "ledger",
<query>)`; docs/ledger.md has every request and response shape. Status, queues and managed jobs
are the status service's (open): events/status_queries.py. Times are ISO 8601 UTC strings, money is integer
micro-dollars (`*_micros`) with an exact decimal string (`*_usd`) beside it.

`min_seq` (optional, every read query): answer only once the projection has committed the log up
to that stream sequence (waits at most `wait_s`), e.g. the sequence of an event just published.
"""

from __future__ import annotations

from typing import Any

from .bus import Bus

SERVICE = "ledger"


def _params(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


async def cost_report(bus: Bus, by: str = "team", since: str | None = None, until: str | None = None,
                      min_seq: int | None = None, timeout: float = 30.0, team: str | None = None) -> dict[str, Any]:
    """Showback lines (usage, then compensations) and the total; `since`/`until` are ISO dates/times;
    `team`: that team's usage only (its lines by any grouping)."""
    return await bus.request(SERVICE, "cost_report", _params(by=by, since=since, until=until, min_seq=min_seq,
                                                             team=team), timeout=timeout)


async def spend_summary(bus: Bus, max_jobs: int | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """Dollars spent since the log began and GPU-seconds paid, by team, user, project, cluster and
    managed job (the newest `max_jobs` jobs keep their key), in one read (docs/ledger.md)."""
    return await bus.request(SERVICE, "spend_summary", _params(max_jobs=max_jobs), timeout=timeout)


async def settlements(bus: Bus, timeout: float = 10.0) -> list[dict[str, Any]]:
    return await bus.request(SERVICE, "settlements", {}, timeout=timeout)


async def settle(bus: Bus, period: str, timeout: float = 120.0) -> dict[str, Any]:
    """Close a period (YYYY-MM): the ledger publishes PeriodSettled with the totals per team."""
    return await bus.request(SERVICE, "settle", {"period": period}, timeout=timeout)


async def audit(bus: Bus, keep: str | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """Have the ledger replay the log into a fresh file and compare it with its live tables."""
    return await bus.request(SERVICE, "audit", _params(keep=keep), timeout=timeout)


async def position(bus: Bus, timeout: float = 5.0) -> dict[str, Any]:
    """Where the projection stands: checkpoint (committed), caught_up, halted."""
    return await bus.request(SERVICE, "position", {}, timeout=timeout)
