"""Client side of the status service's queries (NATS request-reply): thin helpers for the CLI and tools.

The status service (services/status/, open) answers on `naming.query_subject(stage, "status",
<query>)`; docs/status.md has every request and response shape. Times are ISO 8601 UTC strings.
Accounting (cost report, settlement) is the ledger's: events/ledger_queries.py.

`min_seq` (optional, every read query): answer only once the projection has committed the log up
to that stream sequence (waits at most `wait_s`, 30 s at most), e.g. the sequence of an event just
published; past the wait it answers as it stands, or with `strict` answers an error.
"""

from __future__ import annotations

from typing import Any

from .bus import Bus

SERVICE = "status"


def _params(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


async def status(bus: Bus, all: bool = False, clusters: list[str] | None = None, user: str | None = None,
                 min_seq: int | None = None, timeout: float = 10.0, strict: bool = False) -> list[dict[str, Any]]:
    """Clusters, newest first; terminated ones only with `all`. `strict`: an error rather than an
    answer older than `min_seq` (for a caller that keeps the answer as of `min_seq`)."""
    return await bus.request(SERVICE, "status", _params(all=all, clusters=clusters, user=user, min_seq=min_seq,
                                                        strict=strict or None), timeout=timeout)


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


async def metrics_summary(bus: Bus, wait_buckets: list[float] | tuple[float, ...] = (),
                          timeout: float = 10.0) -> dict[str, Any]:
    """The fleet aggregated for `/metrics`: counts by state, nodes, $/h of UP clusters, the queue-wait
    histogram over `wait_buckets`, the oldest pending and idle times (docs/status.md)."""
    return await bus.request(SERVICE, "metrics_summary", {"wait_buckets": list(wait_buckets)}, timeout=timeout)


async def audit(bus: Bus, keep: str | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """Have the status service replay the log into a fresh file and compare it with its live tables."""
    return await bus.request(SERVICE, "audit", _params(keep=keep), timeout=timeout)


async def position(bus: Bus, timeout: float = 5.0) -> dict[str, Any]:
    """Where the projection stands: checkpoint (committed), caught_up, halted, parked."""
    return await bus.request(SERVICE, "position", {}, timeout=timeout)
