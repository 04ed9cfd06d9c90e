"""Client side of the ledger's queries (NATS request-reply): thin helpers for the CLI and tools.

The ledger service answers on `naming.query_subject(stage, "ledger", <query>)`; docs/ledger.md
has every request and response shape. Times are ISO 8601 UTC strings, money is integer
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


async def status(bus: Bus, all: bool = False, clusters: list[str] | None = None, user: str | None = None,
                 min_seq: int | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Clusters, newest first; terminated ones only with `all`."""
    return await bus.request(SERVICE, "status", _params(all=all, clusters=clusters, user=user, min_seq=min_seq),
                             timeout=timeout)


async def queue(bus: Bus, clusters: list[str] | str | None = None, skip_finished: bool = False,
                user: str | None = None, min_seq: int | None = None, timeout: float = 10.0,
                cluster: str | None = None) -> list[dict[str, Any]]:
    """Jobs of the given clusters (all clusters when none; `cluster` names one)."""
    if isinstance(clusters, str):
        clusters = [clusters]
    if cluster is not None:
        clusters = [*(clusters or []), cluster]
    return await bus.request(SERVICE, "queue", _params(clusters=clusters, skip_finished=skip_finished, user=user,
                                                       min_seq=min_seq), timeout=timeout)


async def jobs_queue(bus: Bus, all: bool = True, skip_finished: bool = False, job_ids: list[int] | None = None,
                     user: str | None = None, all_users: bool = True, limit: int | None = None,
                     min_seq: int | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Managed jobs, newest first; finished ones only with `all` (the default) and not `skip_finished`."""
    return await bus.request(SERVICE, "jobs_queue", _params(
        all=all, skip_finished=skip_finished, job_ids=job_ids, user=user, all_users=all_users, limit=limit,
        min_seq=min_seq), timeout=timeout)


async def cost_report(bus: Bus, by: str = "team", since: str | None = None, until: str | None = None,
                      min_seq: int | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """Showback lines (usage, then compensations) and the total; `since`/`until` are ISO dates/times."""
    return await bus.request(SERVICE, "cost_report", _params(by=by, since=since, until=until, min_seq=min_seq),
                             timeout=timeout)


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
