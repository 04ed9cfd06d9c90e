"""A managed job as the CLI shows it: its `-o json` row, the status service's projection of them,
the note its end gets, and `jobs queue --infra`'s filter (shared by the embedded `spz jobs` verbs, cli/cmd_jobs.py, and their forms
through an API server, cli/via_api_jobs.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any


async def projected_jobs(bus: Any, skip_finished: bool, limit: int | None = None) -> list[dict[str, Any]] | None:
    """The status service's projection, up to date with the log as it is now (the newest `limit`
    jobs, cut by the projection's query: the default view reads 50 rows, not every job); None
    when no status service answers."""
    from skypurza.events import status_queries

    try:
        return await status_queries.jobs_queue(bus, skip_finished=skip_finished, min_seq=await bus.last_seq(),
                                               limit=limit, timeout=3.0)
    except Exception:
        return None


def final_note(status: Any, job_id: int, state: Any) -> None:
    if status is None or not state.terminal:
        return
    status.stop()
    color = "green" if state.status == "SUCCEEDED" else ("yellow" if state.status == "CANCELLED" else "red")
    status.note(f"[{color}]Managed job {job_id}: {state.status}[/{color}]"
                + (f" — {state.reason}" if state.status != "SUCCEEDED" and state.reason else ""))


def queue_row(d: dict[str, Any]) -> dict[str, Any]:
    """One job as `-o json` prints it, from the status service's row or the log's fold alike."""
    return {
        "id": d.get("id", d.get("job_id")), "name": d.get("name"), "status": d.get("status"),
        "recoveries": d.get("recoveries", 0), "restarts_on_errors": d.get("restarts_on_errors", 0),
        "cluster": d.get("cluster"), "task_index": d.get("task_index", 0), "num_tasks": d.get("num_tasks", 1),
        "user": d.get("user"), "submitted_at": iso(d.get("submitted_at")), "started_at": iso(d.get("started_at")),
        "ended_at": iso(d.get("ended_at")), "reason": d.get("reason") or None,
    }


def iso(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)


def on_infra(rows: list[dict[str, Any]], infra: str, where: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    """`--infra`, decided: the rows whose cluster's (infra, region, zone) in `where` is on `infra`."""
    want = [p.lower() for p in infra.split("/") if p]
    out = []
    for r in rows:
        have = [str(p).lower() for p in where.get(r.get("cluster") or "", ()) if p]
        if have and len(have) >= len(want) and all(w in ("*", h) for w, h in zip(want, have)):
            out.append(r)
    return out
