"""The status service's read side: status, queue and managed jobs queue, as plain JSON-able data.

Each function takes a DuckDB connection (a cursor of the status service's own connection, or a
file opened read-only) and the request's parameters. Every query orders its rows fully, and
times are ISO 8601 UTC strings, so the same projection always gives the same bytes.
docs/status.md has the request and response shapes.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from skypurza.events.projection.reading import dicts as _dicts

from skypurza.events.fold import JOB_TERMINAL_SQL
from skypurza.events.managed_events import TERMINAL_STATUSES

def _names(value: Any) -> list[str] | None:
    if value in (None, "", []):
        return None
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


# ---------------------------------------------------------------- status


def status(cur: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Clusters (without terminated ones unless `all`), newest first, with their nodes and cost."""
    where, args = [], []
    if not params.get("all"):
        where.append("c.status <> 'TERMINATED'")
    names = _names(params.get("clusters"))
    if names:
        where.append("c.name IN (SELECT unnest(?::VARCHAR[]))")
        args.append(names)
    if params.get("user"):
        where.append('c."user" = ?')
        args.append(params["user"])
    cond = f"WHERE {' AND '.join(where)}" if where else ""
    rows = _dicts(cur, f"""
        SELECT c.name, c.status, c.infra, c.region, c.zone, c.instance_type, c.market, c.accelerators,
               c.num_nodes, c.hourly_price_micros, c.launched_at, c.started_at, c.stopped_at,
               c.terminated_at, c.termination_reason, c.status_reason, c."user", c.team, c.project,
               c.managed_job_id, c.task_id, c.autostop_minutes, c.autostop_down, c.down_after_job,
               c.idle_since, c.last_event_seq,
               coalesce((SELECT sum((m.hourly_price_micros::HUGEINT
                          * (epoch_us(m.metered_until) - epoch_us(m.lifetime_start))) // 3600000000)
                         FROM node_runs m
                         WHERE m.cluster = c.name AND m.metered_until IS NOT NULL
                           AND m.lifetime_start >= c.launched_at), 0)::BIGINT AS cost_micros
        FROM clusters c {cond}
        ORDER BY c.launched_at DESC NULLS FIRST, c.name""", args)
    if not rows:
        return rows
    nodes = _dicts(cur, """
        SELECT cluster, rank, instance_id, private_ip, public_ip, zone, status, ready_at, host
        FROM nodes WHERE cluster IN (SELECT unnest(?::VARCHAR[])) ORDER BY cluster, rank""",
                   [[r["name"] for r in rows]])
    by_cluster: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        by_cluster.setdefault(n.pop("cluster"), []).append(n)
    for r in rows:
        r["accelerators"] = json.loads(r["accelerators"]) if r["accelerators"] else None
        r["use_spot"] = r["market"] == "spot"
        r["autostop"] = r["autostop_minutes"]  # the names `spz status -o json` uses
        r["autodown"] = bool(r["autostop_down"])
        r["nodes"] = by_cluster.get(r["name"], [])
        r["cost_usd"] = str(Decimal(r["cost_micros"]).scaleb(-6))  # exact dollars
    return rows


# ---------------------------------------------------------------- queues

_JOB_TERMINAL = JOB_TERMINAL_SQL  # the one fold's final states (events/fold.py)


def queue(cur: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Jobs of the given clusters (all clusters when none), newest job first per cluster."""
    where, args = [], []
    names = _names(params.get("clusters") or params.get("cluster"))
    if names:
        where.append("cluster IN (SELECT unnest(?::VARCHAR[]))")
        args.append(names)
    if params.get("skip_finished"):
        where.append(f"status NOT IN {_JOB_TERMINAL}")
    if params.get("user"):
        where.append('"user" = ?')
        args.append(params["user"])
    cond = f"WHERE {' AND '.join(where)}" if where else ""
    return _dicts(cur, f"""
        SELECT cluster, job_id, name, "user", num_nodes, status, submitted_at, started_at, ended_at, exit_code,
               failed_rank, failed_phase, reason, task_id, managed_job_id, skypilot_task_id,
               cancel_requested, resources
        FROM jobs {cond} ORDER BY cluster, job_id DESC""", args)


_MANAGED_TERMINAL = tuple(sorted(TERMINAL_STATUSES))


def jobs_queue(cur: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Managed jobs, newest first; `skip_finished` (or `all: false`) hides ended ones; `user` filters."""
    where, args = [], []
    if params.get("skip_finished") or params.get("all") is False:
        where.append(f"status NOT IN {_MANAGED_TERMINAL}")
    if params.get("user") and not params.get("all_users", True):
        where.append('"user" = ?')
        args.append(params["user"])
    ids = params.get("job_ids")
    if ids:
        where.append("job_id IN (SELECT unnest(?::BIGINT[]))")
        args.append([int(i) for i in ids])
    cond = f"WHERE {' AND '.join(where)}" if where else ""
    limit = f"LIMIT {int(params['limit'])}" if params.get("limit") else ""
    return _dicts(cur, f"""
        SELECT job_id, name, "user", team, project, status, num_tasks, task_index, cluster, recoveries,
               restarts_on_errors, submitted_at, started_at, ended_at, cancel_requested, reason
        FROM managed_jobs {cond} ORDER BY job_id DESC {limit}""", args)


# ---------------------------------------------------------------- the metrics endpoint's summary

_LIVE = ("INIT", "UP")  # clusters whose nodes exist (and are paid for) now
MAX_BUCKETS = 64


def metrics_summary(cur: Any, params: dict[str, Any]) -> dict[str, Any]:
    """What `/metrics` shows of the fleet, aggregated here: a few hundred rows whatever the number
    of jobs, where `status` + `queue` send every cluster and job across the bus at each scrape.

    `wait_buckets`: the queue-wait histogram's upper bounds in seconds (ascending); the answer's
    `queue_wait.cumulative` has one count per bound (jobs whose wait is at most it). Times are
    Unix seconds. Docs: docs/status.md, docs/observability.md."""
    raw = params.get("wait_buckets") or []
    if not isinstance(raw, list) or len(raw) > MAX_BUCKETS:
        raise ValueError(f"wait_buckets: a list of at most {MAX_BUCKETS} numbers")
    buckets = sorted(float(b) for b in raw)

    def rows(sql: str, args: list[Any] | None = None) -> list[list[Any]]:
        return [list(r) for r in cur.execute(sql, args or []).fetchall()]

    # Four statements: a statement's overhead is most of the cost on tables this small, but one
    # statement building lists of rows (all of it at once) is ten times slower than these.
    live = f"status IN {_LIVE}"
    waits = "greatest(epoch_us(started_at) - epoch_us(submitted_at), 0) / 1e6"
    # The scalars in one statement, the three counts by state in another.
    scal = rows(f"""
        SELECT (SELECT [count(*), coalesce(sum({waits}), 0){''.join(f', count(*) FILTER (WHERE {waits} <= ?)' for _ in buckets)}]
                FROM jobs WHERE started_at IS NOT NULL AND submitted_at IS NOT NULL),
               (SELECT min(t) FROM (SELECT epoch_us(submitted_at) AS t FROM jobs WHERE status = 'PENDING'
                                    UNION ALL
                                    SELECT epoch_us(submitted_at) FROM managed_jobs WHERE status = 'PENDING')),
               -- the longest-idle UP cluster without autostop: no job pending or running on it, idle
               -- since its launch, start or last job's end, whichever is latest
               (SELECT min(greatest(epoch_us(c.launched_at), epoch_us(c.started_at), epoch_us(e.last_end)))
                FROM clusters c
                LEFT JOIN (SELECT cluster, max(ended_at) AS last_end,
                                  count(*) FILTER (WHERE status NOT IN {_JOB_TERMINAL}) AS busy
                           FROM jobs GROUP BY cluster) e ON e.cluster = c.name
                WHERE c.status = 'UP' AND c.autostop_minutes IS NULL AND coalesce(e.busy, 0) = 0
                  AND coalesce(c.launched_at, c.started_at, e.last_end) IS NOT NULL),
               (SELECT coalesce(sum(recoveries), 0)::BIGINT FROM managed_jobs),
               (SELECT coalesce(max(recoveries), 0)::BIGINT FROM managed_jobs WHERE status NOT IN {_MANAGED_TERMINAL})
        """, buckets)[0]
    hist, pending, idle, rec_sum, rec_max = scal
    states: dict[str, list[list[Any]]] = {"clusters": [], "jobs": [], "managed_jobs": []}
    for tbl, st, n in rows("""SELECT 'clusters', status, count(*) FROM clusters GROUP BY status
                              UNION ALL SELECT 'jobs', status, count(*) FROM jobs GROUP BY status
                              UNION ALL SELECT 'managed_jobs', status, count(*) FROM managed_jobs GROUP BY status
                              ORDER BY 1, 2"""):
        states[tbl].append([st, int(n)])
    return {
        "clusters_by_state": states["clusters"],
        "nodes": rows(f"""SELECT infra, region, instance_type, market, sum(num_nodes)::BIGINT FROM clusters
                          WHERE {live} GROUP BY ALL ORDER BY ALL"""),
        # Dollars per hour now: each UP cluster's price per node x its nodes.
        "rate": rows("""SELECT team, "user", project, name, (hourly_price_micros::HUGEINT * num_nodes)::BIGINT
                        FROM clusters WHERE status = 'UP' ORDER BY name"""),
        "jobs_by_state": states["jobs"],
        "queue_wait": {"count": int(hist[0]), "sum": float(hist[1]), "buckets": buckets,
                       "cumulative": [int(n) for n in hist[2:]]},
        "oldest_pending": None if pending is None else int(pending) / 1e6,
        "oldest_idle_without_autostop": None if idle is None else int(idle) / 1e6,
        "managed_by_state": states["managed_jobs"],
        "managed_recoveries": [int(rec_sum), int(rec_max)],
    }
