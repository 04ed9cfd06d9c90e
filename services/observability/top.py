"""`spz top`: what it gathers (status, queues, the GPU health manager's last samples, the alerts
on the log), the pure frame made of it, and its rich rendering.

The terminal side (the bus connection, the Live loop, the keys) is the CLI plugin's (cli.py).
The frame is pure (`frame(...)`: query answers and the time in, a JSON-able dict out), so `--once
-o json` and the tests see exactly what the live view draws. Each source is bounded by
QUERY_TIMEOUT_S; only the status service is required (the GPU samples and the alerts are shown
when their services answer, and said missing when not).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

QUERY_TIMEOUT_S = 5.0
MAX_ROWS = 50  # per table: the view is for a terminal; -o json carries the same bound
LIVE = ("INIT", "UP")


class NotAnswering(RuntimeError):
    pass


def _dollars(micros: int) -> str:
    return str(Decimal(int(micros)).scaleb(-6).quantize(Decimal("0.01")))


def _epoch(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() if value else None
    except ValueError:
        return None


def _gpu_use(nodes: list[dict[str, Any]] | None) -> dict[str, tuple[int, float | None]]:
    """cluster -> (GPUs seen in its nodes' last samples, their mean utilisation)."""
    out: dict[str, list[float]] = {}
    count: dict[str, int] = {}
    for n in nodes or []:
        s = n.get("sample") or {}
        gpus = s.get("gpus") or []
        c = str(n.get("cluster"))
        count[c] = count.get(c, 0) + len(gpus)
        out.setdefault(c, []).extend(float(g["utilization_pct"]) for g in gpus if g.get("utilization_pct") is not None)
    return {c: (count[c], (sum(v) / len(v)) if (v := out.get(c)) else None) for c in count}


def frame(clusters: list[dict[str, Any]], jobs: list[dict[str, Any]] | None, managed: list[dict[str, Any]] | None,
          nodes: list[dict[str, Any]] | None, alerts: list[dict[str, Any]] | None, now: datetime) -> dict[str, Any]:
    """One view of the control plane. $/h now: price per node x nodes of each UP cluster (what
    `skypurza_cost_rate_dollars_per_hour` sums); cost so far: the status service's metered cost."""
    use = _gpu_use(nodes)
    rows = []
    for c in clusters:
        n = int(c.get("num_nodes") or 0)
        rate = int(c.get("hourly_price_micros") or 0) * n if c.get("status") == "UP" else 0
        gpus, util = use.get(str(c.get("name")), (0, None))
        rows.append({"name": c.get("name"), "status": c.get("status"), "infra": c.get("infra"),
                     "nodes": n if c.get("status") in LIVE else 0, "user": c.get("user"), "team": c.get("team"),
                     "rate_micros_per_hour": rate, "rate_usd_per_hour": _dollars(rate),
                     "cost_usd": str(c.get("cost_usd") or "0"), "gpus": gpus,
                     "gpu_util_pct": None if util is None else round(util, 1)})
    rows.sort(key=lambda r: (-r["rate_micros_per_hour"], str(r["name"])))
    t = now.timestamp()
    running = []
    for j in jobs or []:
        if j.get("status") not in ("PENDING", "SETTING_UP", "RUNNING"):
            continue
        started = _epoch(j.get("started_at"))
        running.append({"cluster": j.get("cluster"), "job_id": j.get("job_id"), "name": j.get("name"),
                        "user": j.get("user"), "status": j.get("status"), "started_at": j.get("started_at"),
                        "running_s": None if started is None else max(0, round(t - started))})
    running.sort(key=lambda j: (j["status"] == "PENDING", str(j["cluster"]), -int(j["job_id"] or 0)))
    util = [r["gpu_util_pct"] for r in rows if r["gpu_util_pct"] is not None]
    gpus = sum(r["gpus"] for r in rows)
    firing = [a for a in (alerts or []) if a.get("state", "firing") == "firing"]
    return {
        "at": now.astimezone(UTC).isoformat(),
        "totals": {
            "clusters": len(rows), "up": sum(1 for r in rows if r["status"] == "UP"),
            "nodes": sum(r["nodes"] for r in rows),
            "rate_usd_per_hour": _dollars(sum(r["rate_micros_per_hour"] for r in rows)),
            "jobs_running": sum(1 for j in running if j["status"] in ("SETTING_UP", "RUNNING")),
            "jobs_pending": sum(1 for j in running if j["status"] == "PENDING"),
            "managed_running": None if managed is None else sum(1 for m in managed if m.get("status") == "RUNNING"),
            "gpus": gpus, "gpu_util_pct": None if not util else round(sum(util) / len(util), 1),
            "alerts_firing": None if alerts is None else len(firing),
        },
        "clusters": rows[:MAX_ROWS], "jobs": running[:MAX_ROWS],
        "alerts": [{"severity": a.get("severity"), "kind": a.get("kind"), "subject": a.get("subject"),
                    "summary": a.get("summary"), "since": a.get("raised_at")} for a in firing[:MAX_ROWS]],
        "sources": {"gpuhealth": nodes is not None, "alerts": alerts is not None},
    }


# ---------------------------------------------------------------- gathering (I/O)


async def _optional(coro: Any) -> Any:
    try:
        return await asyncio.wait_for(coro, QUERY_TIMEOUT_S)
    except Exception:
        return None


async def _alerts(bus: Any) -> list[dict[str, Any]]:
    from skypurza.events import naming

    from .alerts.cli import history

    subject = naming.aggregate_events_subject(bus.stage, "alert")
    return history([st.event async for st in bus.replay(filter_subject=subject) if st.event is not None])


async def gather(bus: Any) -> dict[str, Any]:
    from skypurza.events import status_queries as sq

    try:
        clusters = await sq.status(bus, timeout=QUERY_TIMEOUT_S)
    except Exception as exc:
        raise NotAnswering("the status service is not answering; is the control plane up? (`spz api status`)") from exc
    jobs, managed, nodes, alerts = await asyncio.gather(
        _optional(sq.queue(bus, skip_finished=True, timeout=QUERY_TIMEOUT_S)),
        _optional(sq.jobs_queue(bus, skip_finished=True, timeout=QUERY_TIMEOUT_S)),
        _optional(bus.request("gpuhealth", "nodes", {}, timeout=QUERY_TIMEOUT_S)), _optional(_alerts(bus)))
    return frame(clusters, jobs, managed, nodes, alerts, datetime.now(UTC))


# ---------------------------------------------------------------- drawing


def render(f: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = f["totals"]
    util = "-" if t["gpu_util_pct"] is None else f"{t['gpu_util_pct']}%"
    alerts = "?" if t["alerts_firing"] is None else str(t["alerts_firing"])
    head = Text(f"spz top  {f['at'][:19]}Z   clusters {t['clusters']} (up {t['up']})   nodes {t['nodes']}   "
                f"${t['rate_usd_per_hour']}/h   jobs running {t['jobs_running']}, pending {t['jobs_pending']}   "
                f"GPUs {t['gpus']} at {util}   alerts {alerts}   (q: quit)")
    ct = Table(title="Clusters", expand=True)
    for col in ("CLUSTER", "STATUS", "INFRA", "NODES", "$/H", "COST SO FAR", "GPUS", "GPU UTIL", "USER", "TEAM"):
        ct.add_column(col)
    for r in f["clusters"]:
        ct.add_row(str(r["name"]), str(r["status"]), str(r["infra"] or "-"), str(r["nodes"]), r["rate_usd_per_hour"],
                   r["cost_usd"], str(r["gpus"]), "-" if r["gpu_util_pct"] is None else f"{r['gpu_util_pct']}%",
                   str(r["user"] or "-"), str(r["team"] or "-"))
    jt = Table(title="Jobs", expand=True)
    for col in ("CLUSTER", "ID", "NAME", "USER", "STATUS", "RUNNING FOR"):
        jt.add_column(col)
    for j in f["jobs"]:
        jt.add_row(str(j["cluster"]), str(j["job_id"]), str(j["name"] or "-"), str(j["user"] or "-"), str(j["status"]),
                   "-" if j["running_s"] is None else f"{j['running_s']}s")
    parts: list[Any] = [head, ct, jt]
    if f["alerts"]:
        at = Table(title="Alerts firing", expand=True)
        for col in ("SEVERITY", "KIND", "SUBJECT", "SINCE", "SUMMARY"):
            at.add_column(col)
        for a in f["alerts"]:
            at.add_row(*(str(a[k] or "-") for k in ("severity", "kind", "subject", "since", "summary")))
        parts.append(at)
    return Group(*parts)
