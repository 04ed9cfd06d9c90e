"""Managed jobs and the cost report over HTTP (`spz jobs queue|launch|cancel`, `spz cost-report`).

- `GET /api/v1/jobs`: the status service's managed jobs queue (events/status_queries.py): the
  caller's own; `all_users=true` everyone's the caller may read; an admin's: all.
- `POST /api/v1/jobs`: a task, a pipeline (several YAML documents) or a job group (a header with
  `execution: parallel`), `num_jobs` times (YAML text + the overrides of POST /tasks), submitted
  as the CLI submits them on the bus (events/managed_plan.py: planned, then all or none); ids
  allocated by the log, each job and its envelope stamped with the caller, as POST /tasks stamps.
- `POST /api/v1/jobs/{id}/cancel`: `act` on the job's owner; 404 unknown, 409 already ended.
- `GET /api/v1/jobs/{id}/logs`: the job's output as server-sent events, cluster after cluster as
  recoveries move it (each cluster's job streamed by routes_streams.job_lines; a `launch` frame
  names each cluster); the last frame is `end`, with the managed job's status. `logs` on the
  job's owner; one of the caller's stream slots while open.
- `GET /api/v1/cost-report`: the ledger's showback lines (events/ledger_queries.py), by team,
  user, project, cluster, region or day; a member or viewer sees their own team's usage only (the
  ledger's `team` cut), an admin all; 503 when the ledger does not answer; `at=`
  is the report as it stood then (the ledger's rows up to that moment: time travel).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import date, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal, Optional

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from skypurza.events import ledger_queries, limits, naming, status_queries
from skypurza.events.managed_events import TERMINAL_STATUSES, ManagedJobCancelRequested
from skypurza.events.managed_plan import PartialSubmission, PlanError, plan_jobs, submit_plans, summary
from skypurza.events.principal import stamp

from .clusterview import read_view
from .deps import STATUS_TIMEOUT_S, ApiDeps
from . import timetravel, workspaces
from .extensions import admitted_task
from .identity import Principal, authorize, visible
from .problems import Problem, conflict, forbidden, not_found, unavailable
from .routes_streams import MAX_TAIL, job_lines
from .sse import KEEPALIVE, SseResponse, StreamSlots, frame
from .tasks import WORKSPACE_DESCRIPTION, Refused, TaskOverrides, Workspace, load_tasks_of

log = logging.getLogger("skypurza.api")

LEDGER_TIMEOUT_S = 15.0
MAX_QUEUE_ROWS = 10_000
POLL_S = 1.0  # a followed managed job between clusters (pending, recovering): its row read this often
ManagedJobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="The managed job's id (spz jobs queue).")]
ReportBy = Literal["team", "user", "project", "cluster", "region", "day"]  # the ledger's GROUP_BYS


class JobRequest(BaseModel):
    """What `spz jobs launch` submits: a task, a pipeline or a job group, `num_jobs` times. `user`
    and `team` are not fields: the server stamps the caller."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str | dict[str, Any] = Field(description="The task YAML text (several documents: a pipeline, or a job "
                                                   "group when the header says execution: parallel), or one task "
                                                   "as a JSON object.")
    name: Optional[Annotated[str, Field(min_length=1, max_length=limits.MAX_TASK_NAME_CHARS)]] = Field(
        None, description="The managed job's name (-n); the task's name when left out.")
    overrides: TaskOverrides = TaskOverrides()
    workspace: Optional[Workspace] = Field(None, description=WORKSPACE_DESCRIPTION)
    num_jobs: int = Field(1, ge=1, le=limits.MAX_NUM_JOBS,
                          description="N managed jobs of the task (or pipeline), ranks 0..N-1 (--num-jobs).")


async def _jobs(deps: ApiDeps, **kw: Any) -> list[dict[str, Any]]:
    b = deps.bus()
    try:
        return await status_queries.jobs_queue(b, min_seq=await b.last_seq(), timeout=STATUS_TIMEOUT_S, **kw)
    except Exception as exc:
        log.warning("jobs_queue query failed: %s: %s", type(exc).__name__, exc)
        raise unavailable(f"the status service did not answer in {STATUS_TIMEOUT_S:.0f} s; is the control plane "
                          "running (spz api status)?")


def _when(value: str | None, field: str) -> str | None:
    """A period (YYYY-MM), a date (YYYY-MM-DD) or an ISO date-time, checked here so that a bad one
    is a 422 that says so, not the ledger's error."""
    if value is None:
        return None
    try:
        if len(value) == 7:
            date.fromisoformat(value + "-01")
        elif len(value) == 10:
            date.fromisoformat(value)
        else:
            datetime.fromisoformat(value)
    except ValueError:
        raise Problem(422, "invalid-request", "Invalid request",
                      f"{field}: {value[:40]!r} is not a period (YYYY-MM), a date (YYYY-MM-DD) or an ISO date-time") \
            from None
    return value


async def _managed_logs(bus: Any, job_id: int, follow: bool, tail: int,
                        row_of: Callable[[], Awaitable[dict[str, Any] | None]]) -> AsyncIterator[bytes]:
    """The managed job's output: its current cluster's job, then (a recovery) the next cluster's,
    until the managed job ends (with `follow`) or what is there was sent (without)."""
    streamed: set[str] = set()
    row: dict[str, Any] | None = None
    try:
        while True:
            row = await row_of()
            if row is None:
                break
            cluster = row.get("cluster")
            # every cluster the job was placed on, in order (a pipeline's earlier tasks and a
            # recovery's earlier clusters may have come and gone between two polls), then the current
            waiting = [c for c in (await timetravel.managed_job_at(bus, job_id, None)).clusters if c not in streamed]
            if cluster and cluster not in streamed and cluster not in waiting:
                waiting.append(cluster)
            sent = False
            for name in waiting:
                view = await read_view(bus, name)
                if not view.jobs:
                    continue
                streamed.add(name)
                sent = True
                yield frame("launch", {"job_id": job_id, "cluster": name, "launch": len(streamed)})
                async for chunk in job_lines(bus, name, max(view.jobs), follow, tail, view, {}):
                    yield chunk
            if sent:
                continue
            if not follow or row.get("status") in TERMINAL_STATUSES:
                break
            yield KEEPALIVE
            await asyncio.sleep(POLL_S)
    except Exception as exc:  # the status service or the bus went away mid-stream: said, and the stream ends
        log.warning("managed job %s logs stream failed: %s: %s", job_id, type(exc).__name__, exc)
        yield frame("error", {"detail": exc.detail if isinstance(exc, Problem) else
                              "the server lost the log mid-stream; reconnect to read on"})
        return
    yield frame("end", {"job_id": job_id, "status": (row or {}).get("status"), "cluster": (row or {}).get("cluster"),
                        "reason": (row or {}).get("reason")})


def router(deps: ApiDeps, slots: StreamSlots | None = None) -> APIRouter:
    slots = slots or StreamSlots()
    r = APIRouter(prefix="/api/v1", tags=["jobs"])
    caller = Depends(deps.principal)

    @r.get("/jobs", summary="Managed jobs: your own, or everyone's you may read (all_users; spz jobs queue)")
    async def jobs_queue(who: Principal = caller,
                         all_users: bool = Query(False, description="Everyone's jobs, for reading (sky's -u)."),
                         skip_finished: bool = Query(False, description="Only jobs that have not ended."),
                         ) -> dict[str, Any]:
        rows = await _jobs(deps, skip_finished=skip_finished, limit=MAX_QUEUE_ROWS)
        shown = visible(who, rows, all_users)
        return {"jobs": shown, "all_users": all_users}

    @r.post("/jobs", status_code=202, summary="Launch managed jobs: a task, a pipeline, a job group, num_jobs of "
                                              "it (spz jobs launch)")
    async def submit(body: JobRequest, who: Principal = caller) -> dict[str, Any]:
        # The workspace first: the caller's role in it (not their primary team's) decides.
        who, defaults = workspaces.resolve(who, body.workspace, await deps.directory())
        decision = authorize(who, "submit", who.user, who.team)
        if not decision.allowed:
            raise forbidden(decision.reason)
        try:
            loaded = load_tasks_of(body.task, body.overrides)
            plans = plan_jobs(body.name or loaded.name or "sky-managed", [t.name for t in loaded.tasks],
                              loaded.header if loaded.is_job_group else {}, body.num_jobs)
        except Refused as exc:
            raise Problem(422, "invalid-task", "Invalid task", exc.detail, problems=exc.problems)
        except PlanError as exc:
            raise Problem(422, "invalid-request", "Invalid request", str(exc))
        tasks = [await admitted_task(deps.admission, "managed_job", who, t) for t in loaded.tasks]
        publics = [workspaces.with_default_labels(t.public_dict(), defaults) for t in tasks]

        def attribution(plan: Any) -> tuple[str | None, str | None]:
            labels = dict(defaults)
            for k in plan.task_indexes:
                res = tasks[k].resources
                if res is not None and res.labels:
                    labels.update(res.labels)
            return who.team, labels.get("project")

        # All or none (events/managed_plan.py), and shielded: a client that goes away mid-group
        # does not cancel the submission half-way; the server finishes it (or cancels what it sent).
        work = asyncio.ensure_future(submit_plans(deps.bus(), plans, publics, [t.secret_values() for t in tasks],
                                                  user=who.user, attribution=attribution,
                                                  stamped=(who.user, who.team)))
        work.add_done_callback(_said)
        try:
            jobs = await asyncio.shield(work)
        except PartialSubmission as exc:
            raise unavailable(f"{exc}; try the launch again" if not set(exc.submitted) - set(exc.cancelled)
                              else str(exc))
        except ValueError as exc:  # a task the managed job's model refuses: before any id was taken
            raise Problem(422, "invalid-task", "Invalid task", f"the task is not valid: {str(exc)[:300]}")
        except Exception as exc:
            raise unavailable(f"the log did not take the submission ({type(exc).__name__}); nothing of this launch "
                              "was submitted, try it again")
        summaries = [summary(p, j) for p, j in zip(plans, jobs)]
        log.info("managed job(s) %s (%s) submitted by %s (team %s)", ", ".join(str(s["id"]) for s in summaries),
                 plans[0].name, who.user, who.team)
        first = summaries[0]
        return {"job_id": first["id"], "name": first["name"], "task_ids": first["task_ids"], "user": who.user,
                "team": who.team, "status": "PENDING", "jobs": [{**s, "status": "PENDING"} for s in summaries]}

    async def job_row(job_id: int) -> dict[str, Any] | None:
        rows = await _jobs(deps, job_ids=[job_id])
        return next((x for x in rows if x.get("job_id") == job_id), None)

    @r.post("/jobs/{job_id}/cancel", status_code=202, summary="Cancel a managed job (spz jobs cancel ID)")
    async def cancel(job_id: ManagedJobId, who: Principal = caller) -> dict[str, Any]:
        row = await job_row(job_id)
        if row is None:
            raise not_found(f"no managed job {job_id} (GET /api/v1/jobs?all_users=true lists them)")
        decision = authorize(who, "act", row.get("user") or "", row.get("team"))
        if not decision.allowed:
            raise forbidden(decision.reason)
        if row.get("status") in TERMINAL_STATUSES:
            raise conflict(f"managed job {job_id} already ended ({row['status']}); there is nothing to cancel")
        b = deps.bus()
        ack = await b.publish(stamp(b.envelope(ManagedJobCancelRequested(managed_job_id=job_id,
                                                                         requested_by=who.user)),
                                    who.user, who.team))
        log.info("cancel of managed job %s requested by %s", job_id, who.user)
        return {"job_id": job_id, "requested": "cancel", "seq": ack.seq}

    sse_doc = {200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}}

    @r.get("/jobs/{job_id}/logs", responses=sse_doc, response_model=None,
           summary="A managed job's output as server-sent events (spz jobs logs)")
    async def logs(job_id: ManagedJobId, who: Principal = caller,
                   follow: bool = Query(True, description="Stream until the managed job ends."),
                   tail: int = Query(0, ge=0, le=MAX_TAIL, description=f"The last N chunks of each cluster's history "
                                                                       f"(0: all; at most {MAX_TAIL:,})."),
                   ) -> SseResponse:
        row = await job_row(job_id)
        if row is None:
            raise not_found(f"no managed job {job_id} (GET /api/v1/jobs?all_users=true lists them)")
        decision = authorize(who, "logs", row.get("user") or "", row.get("team"))
        if not decision.allowed:
            raise forbidden(decision.reason)
        release = slots.take(who.user)
        return SseResponse(_managed_logs(deps.bus(), job_id, follow, tail, lambda: job_row(job_id)), release)

    @r.get("/cost-report", summary="Showback: usage and compensations by team, user ... (spz cost-report)")
    async def cost_report(who: Principal = caller,
                          by: ReportBy = Query("team", description="What a line is per."),
                          since: Optional[Annotated[str, Query(max_length=40, description="From (YYYY-MM-DD or an "
                                                               "ISO date-time).")]] = None,
                          until: Optional[Annotated[str, Query(max_length=40, description="Until (YYYY-MM-DD or an "
                                                               "ISO date-time).")]] = None,
                          at: Optional[Annotated[str, Query(max_length=timetravel.MAX_AT_CHARS,
                                                            description=timetravel.AT_DESCRIPTION + " The ledger's "
                                                            "rows up to then; not with `until`.")]] = None,
                          workspace: Optional[Annotated[str, Query(
                              min_length=1, max_length=63, pattern=naming.PRINCIPAL_NAME_PATTERN,
                              description="One team's report (-w): a member's or viewer's own team of theirs "
                                          "(default: their primary team); an admin's any.")]] = None,
                          ) -> dict[str, Any]:
        since, until = _when(since, "since"), _when(until, "until")
        when = timetravel.checked_at(at)
        if when is not None:
            if until is not None:
                raise Problem(422, "invalid-request", "Invalid request",
                              "at and until: give one (at is the report as it stood then: the ledger's rows up to it)")
            until = when.isoformat()
        # A member or viewer: one team of theirs only (the primary, or -w), by any grouping (the
        # ledger cuts it); an admin: everyone's, or the team -w names.
        if workspace is not None and not who.is_admin and workspace not in who.in_teams:
            raise forbidden(workspaces.not_in_team(who, workspace))
        team = workspace if who.is_admin else (workspace or who.team)
        b = deps.bus()
        try:
            report = await ledger_queries.cost_report(b, by=by, since=since, until=until, min_seq=await b.last_seq(),
                                                      timeout=LEDGER_TIMEOUT_S, team=team)
        except RuntimeError as exc:  # the ledger answered, refusing the query (until before since ...)
            raise Problem(422, "invalid-request", "Invalid request", f"the ledger refused the report: {str(exc)[:300]}")
        except Exception as exc:
            log.warning("cost_report query failed: %s: %s", type(exc).__name__, exc)
            raise unavailable(f"the ledger did not answer in {LEDGER_TIMEOUT_S:.0f} s: the cost report comes from "
                              "the ledger service; is it running (spz api status)?")
        if not isinstance(report, dict):
            raise unavailable("the ledger's answer was not a report; try again shortly")
        past = {"at": when.isoformat()} if when is not None else {}
        if team is None:
            return {**report, "scope": "all", **past}
        if report.get("team") != team:  # a ledger that ignored the cut: never another team's lines
            if by != "team":
                raise unavailable("the ledger did not cut the report to your team; ask an admin to update it")
            report = _team_only(report, team)
        return {**report, "scope": f"team {team}", **past}

    return r


def _said(work: asyncio.Future[Any]) -> None:
    """A shielded submission's failure, logged even when its client went away (and no one awaits it)."""
    if not work.cancelled() and work.exception() is not None:
        exc = work.exception()
        log.warning("managed jobs submission failed: %s: %s", type(exc).__name__, exc)


def _team_only(report: dict[str, Any], team: str) -> dict[str, Any]:
    """A by-team report cut to `team`'s lines, the total summed again from them."""
    lines = [x for x in report.get("lines") or [] if isinstance(x, dict) and x.get("key") == team]
    cost = sum(int(x.get("cost_micros") or 0) for x in lines)
    total = {"cost_micros": cost, "cost_usd": str((Decimal(cost) / 1_000_000).quantize(Decimal("0.000001"))),
             "billing_seconds": sum(int(x.get("billing_seconds") or 0) for x in lines),
             "billing_minutes": sum(int(x.get("billing_minutes") or 0) for x in lines)}
    return {**report, "lines": lines, "total": total}
