"""`spz cost-report --live`, pure: the cost so far of the jobs running now.

A managed job has a cluster of its own, so its cost so far is that cluster's: the metered cost
the status service reports (Σ over its node runs of price × the time the meter reached), the
ledger's meter, never a second count. A job on a shared cluster has no meter of its own: its
line is its share at list price (price per node × the job's nodes × the seconds it has run),
marked `estimate`, and the cluster's metered cost is beside it.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

RUNNING = ("SETTING_UP", "RUNNING")
MANAGED_RUNNING = ("STARTING", "RUNNING", "RECOVERING", "CANCELLING")


def _epoch(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() if value else None
    except ValueError:
        return None


def _usd(micros: int) -> str:
    return str(Decimal(int(micros)).scaleb(-6))


def live_lines(clusters: list[dict[str, Any]], jobs: list[dict[str, Any]], managed: list[dict[str, Any]],
               now: datetime) -> dict[str, Any]:
    """One line per running job (managed jobs first), newest first, and the total."""
    by_name = {c.get("name"): c for c in clusters}
    lines: list[dict[str, Any]] = []
    mine: set[str] = set()
    for m in managed:
        if m.get("status") not in MANAGED_RUNNING:
            continue
        c = by_name.get(m.get("cluster")) or {}
        mine.add(str(m.get("cluster")))
        micros = int(c.get("cost_micros") or 0)
        lines.append({"kind": "managed", "job": str(m.get("job_id")), "name": m.get("name"), "user": m.get("user"),
                      "team": m.get("team"), "cluster": m.get("cluster"), "status": m.get("status"),
                      "started_at": m.get("started_at"), "cost_micros": micros, "cost_usd": _usd(micros),
                      "estimate": False,
                      "rate_usd_per_hour": _usd(int(c.get("hourly_price_micros") or 0) * int(c.get("num_nodes") or 0))})
    t = now.timestamp()
    for j in jobs:
        if j.get("status") not in RUNNING or str(j.get("cluster")) in mine:
            continue
        c = by_name.get(j.get("cluster")) or {}
        started = _epoch(j.get("started_at"))
        nodes = int(j.get("num_nodes") or 1)
        per_hour = int(c.get("hourly_price_micros") or 0) * nodes
        micros = 0 if started is None else int(per_hour * max(0.0, t - started) / 3600)
        lines.append({"kind": "cluster", "job": f"{j.get('cluster')}/{j.get('job_id')}", "name": j.get("name"),
                      "user": j.get("user"), "team": c.get("team"), "cluster": j.get("cluster"),
                      "status": j.get("status"), "started_at": j.get("started_at"), "cost_micros": micros,
                      "cost_usd": _usd(micros), "estimate": True, "rate_usd_per_hour": _usd(per_hour),
                      "cluster_cost_usd": _usd(int(c.get("cost_micros") or 0))})
    lines.sort(key=lambda x: (x["kind"] != "managed", -(_epoch(x["started_at"]) or 0), x["job"]))
    total = sum(x["cost_micros"] for x in lines)
    return {"at": now.isoformat(), "lines": lines, "total": {"cost_micros": total, "cost_usd": _usd(total)}}
