"""The ledger's read side: the cost report and settlements, as plain JSON-able data (status and
queues are the status service's, services/status/queries.py).

Each function takes a DuckDB connection (a cursor of the ledger's own connection, or a file
opened read-only) and the request's parameters. Every query orders its rows fully, and times are
ISO 8601 UTC strings, so the same projection always gives the same bytes.
docs/ledger.md has the request and response shapes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from skypurza.events.projection.reading import dicts as _dicts
from skypurza.events.projection.reading import iso

from .billing import grp_tres_minutes
from .showback import GROUP_BYS, UNASSIGNED, micros_to_dollars, parse_period, period_of

def parse_time(value: Any, name: str) -> datetime | None:
    """An ISO time or date ('2026-11-01', '2026-11-01T10:00:00Z'); naive means UTC."""
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        t = value
    else:
        text = str(value).strip()
        try:
            parse_period(text)
            text = f"{text}-01"  # a period: its first instant
        except ValueError:
            pass
        try:
            t = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{name}: {value!r} is not an ISO date or time (e.g. 2026-11-01 or 2026-11-01T10:00:00Z)") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _naive(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None)


# ---------------------------------------------------------------- cost report


def _key_sql(by: str) -> str:
    if by == "user":
        return f"""coalesce(nullif("user", ''), '{UNASSIGNED}')"""
    if by in ("team", "project", "region"):
        return f"""coalesce(nullif({by}, ''), '{UNASSIGNED}')"""
    if by == "cluster":
        return "cluster"
    if by == "day":
        return "strftime(start_at, '%Y-%m-%d')"
    raise ValueError(f"cannot group by {by!r}; accepted: {', '.join(GROUP_BYS)}")


def cost_report(cur: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Showback: usage per group in [since, until) (by interval start), then the compensations
    booked in that range (late usage of settled periods) on lines of their own.

    Same rules as `showback.report`; in SQL so ten million usage rows take well under 200 ms.
    """
    by = str(params.get("by") or "team")
    key = _key_sql(by)
    since = parse_time(params.get("since"), "since")
    until = parse_time(params.get("until"), "until")
    if since and until and until <= since:
        raise ValueError("until must be after since")
    rng, args = [], []
    team = params.get("team")
    if team is not None:  # one team's rows only (a member's report through the API server)
        rng.append(f"coalesce(nullif(team, ''), '{UNASSIGNED}') = ?")
        args.append(str(team))
    if since:
        rng.append("start_at >= ?")
        args.append(_naive(since))
    if until:
        rng.append("start_at < ?")
        args.append(_naive(until))
    cond = "".join(f" AND {c}" for c in rng)
    usage = cur.execute(f"""
        SELECT {key} AS k, sum(cost_micros)::BIGINT, sum(billing_seconds)::BIGINT, count(*)
        FROM usage WHERE booked_period = period{cond}
        GROUP BY k ORDER BY k""", args).fetchall()
    # Compensations count at the first instant of the period they are booked in.
    brng, bargs = ([f"coalesce(nullif(team, ''), '{UNASSIGNED}') = ?"], [str(team)]) if team is not None else ([], [])
    if since:
        brng.append("booked_period >= ?")
        bargs.append(period_of(since) if since == _period_start(period_of(since)) else _next_period_of(since))
    if until:
        brng.append("booked_period < ?")
        bargs.append(period_of(until) if until == _period_start(period_of(until)) else _next_period_of(until))
    bcond = "".join(f" AND {c}" for c in brng)
    ckey = "booked_period || '-01'" if by == "day" else key
    comp = cur.execute(f"""
        SELECT {ckey} AS k, period, sum(cost_micros)::BIGINT, sum(billing_seconds)::BIGINT, count(*)
        FROM usage WHERE booked_period <> period{bcond}
        GROUP BY k, period ORDER BY k, period""", bargs).fetchall()
    lines = [_line(k, "usage", c, b, n, None) for k, c, b, n in usage]
    lines += [_line(k, "compensation", c, b, n, fp) for k, fp, c, b, n in comp]
    total_c = sum(line["cost_micros"] for line in lines)
    total_b = sum(line["billing_seconds"] for line in lines)
    cp = cur.execute("SELECT last_seq FROM checkpoint").fetchall()[0]
    return {
        "by": by, "since": iso(since), "until": iso(until), **({"team": str(team)} if team is not None else {}),
        "currency": "USD", "lines": lines,
        "total": {"cost_micros": total_c, "cost_usd": str(micros_to_dollars(total_c)),
                  "billing_seconds": total_b, "billing_minutes": grp_tres_minutes(total_b) if total_b >= 0 else -grp_tres_minutes(-total_b)},
        "through_seq": int(cp[0]) if cp else 0,
    }


def _line(key: str, kind: str, cost: int, bill: int, rows: int, for_period: str | None) -> dict[str, Any]:
    return {"key": key, "kind": kind, "cost_micros": int(cost), "cost_usd": str(micros_to_dollars(int(cost))),
            "billing_seconds": int(bill),
            "billing_minutes": grp_tres_minutes(int(bill)) if bill >= 0 else -grp_tres_minutes(-int(bill)),
            "rows": int(rows), "for_period": for_period}


def _period_start(period: str) -> datetime:
    y, m = parse_period(period)
    return datetime(y, m, 1, tzinfo=UTC)


def _next_period_of(t: datetime) -> str:
    """The first period whose first instant is at or after `t` (t not itself a period start)."""
    from .showback import next_period

    return next_period(period_of(t))


# ---------------------------------------------------------------- settlements


def settlements(cur: Any) -> list[dict[str, Any]]:
    rows = _dicts(cur, "SELECT period, settled_at, through_seq, event_id, seq, total_micros, billing_seconds "
                       "FROM settlements ORDER BY period")
    totals = _dicts(cur, "SELECT period, team, total_micros, billing_seconds FROM settlement_totals ORDER BY period, team")
    for r in rows:
        r["teams"] = {t["team"]: {"cost_micros": t["total_micros"], "billing_seconds": t["billing_seconds"]}
                      for t in totals if t["period"] == r["period"]}
    return rows


# ---------------------------------------------------------------- the metrics endpoint's summary

SPEND_DIMENSIONS = ("team", "user", "project", "cluster", "job")
DEFAULT_MAX_JOBS = 100


def spend_summary(cur: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Dollars spent since the log began (usage and compensations: `cost_report`'s total per key)
    by team, user, project, cluster and managed job, and the GPU-seconds paid for (with the
    dollars of those GPU nodes: what idle GPU time costs), in one read.

    `job` is the managed job whose cluster ran the node (`(none)` for a cluster no managed job
    launched); only the `max_jobs` newest job ids keep their own key, the older ones are summed
    under `other`, so the answer stays small however many jobs ran."""
    max_jobs = int(params.get("max_jobs") or DEFAULT_MAX_JOBS)
    if not 1 <= max_jobs <= 10_000:
        raise ValueError("max_jobs: 1 to 10000")
    gpus = """coalesce(TRY_CAST(json_extract_string(u.tres, '$."gres/gpu"') AS BIGINT), 0)"""
    # The job id of each usage row's cluster, or NULL; the newest `max_jobs` ids keep their key.
    rows = cur.execute(f"""
        WITH u AS (
            SELECT u.*, c.managed_job_id AS job,
                   ((epoch_us(u.end_at) - epoch_us(u.start_at)) * {gpus}) / 1e6 AS gpu_s
            FROM usage u LEFT JOIN clusters c ON c.name = u.cluster),
        kept AS (SELECT DISTINCT job FROM u WHERE job IS NOT NULL ORDER BY job DESC LIMIT {max_jobs})
        SELECT coalesce(nullif(team, ''), '{UNASSIGNED}'), coalesce(nullif("user", ''), '{UNASSIGNED}'),
               coalesce(nullif(project, ''), '{UNASSIGNED}'), cluster,
               CASE WHEN job IS NULL THEN '{UNASSIGNED}' WHEN job IN (SELECT job FROM kept) THEN job::VARCHAR
                    ELSE 'other' END,
               sum(cost_micros)::BIGINT, coalesce(sum(gpu_s), 0),
               coalesce(sum(cost_micros) FILTER (WHERE gpu_s <> 0), 0)::BIGINT
        FROM u GROUP BY ALL ORDER BY ALL""").fetchall()
    out: dict[str, dict[str, dict[str, Any]]] = {d: {} for d in SPEND_DIMENSIONS}
    for *keys, micros, gpu_s, gpu_micros in rows:
        for dim, key in zip(SPEND_DIMENSIONS, keys):
            line = out[dim].setdefault(str(key), {"cost_micros": 0, "gpu_seconds": 0.0, "gpu_cost_micros": 0})
            line["cost_micros"] += int(micros)
            line["gpu_seconds"] += float(gpu_s)
            line["gpu_cost_micros"] += int(gpu_micros)
    cp = cur.execute("SELECT last_seq FROM checkpoint").fetchall()[0]
    return {"by": {d: [{"key": k, **v} for k, v in sorted(out[d].items())] for d in SPEND_DIMENSIONS},
            "through_seq": int(cp[0]) if cp else 0}
