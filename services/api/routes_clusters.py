"""`/api/v1/clusters/{name}...`: one cluster, its job queue, its lifecycle and cancelling its jobs.

Each acts as the CLI's verb does, by publishing the same event (StopRequested, StartRequested,
DownRequested, AutostopSet, CancelRequested), on the targets the same shared decisions pick
(events/verbs.py), stamped with the caller (events/principal.py). The API answers once the
request is in the log (202, as the CLI's `--async`); the client follows the outcome with
`GET /api/v1/clusters/{name}` or the events stream.

Who may: reading a cluster or its queue is `read` on its owner (the principal of the
TaskSubmitted that launched it); acting is `act` on the cluster's owner, and cancelling a job
`act` on that job's owner (services/api/identity.py `authorize`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Literal, Optional

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from skypurza.events import limits, status_queries
from skypurza.events.cluster_events import (
    AutostopSet,
    ClusterTerminated,
    DownRequested,
    StartRequested,
    StopRequested,
)
from skypurza.events.job_events import CancelRequested
from skypurza.events.principal import stamp
from skypurza.events.registry import Event
from skypurza.events.verbs import LIFECYCLE_FROM, LIFECYCLE_GOAL, cancel_targets, stop_refusal

from . import timetravel
from .clusterview import ClusterView, read_view
from .deps import STATUS_TIMEOUT_S, ApiDeps, ClusterName, JobId
from .identity import Action, Principal, authorize
from .problems import Problem, conflict, forbidden, not_found, unavailable

log = logging.getLogger("skypurza.api")

MAX_CANCEL_IDS = 1000
WaitFor = Literal["jobs_and_ssh", "jobs", "none"]


class StartRequest(BaseModel):
    """`spz start`'s options: `idle_minutes` (-i) sets autostop with the start, `down` tears down then."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    idle_minutes: Optional[int] = Field(None, ge=0, le=limits.MAX_IDLE_MINUTES)
    down: bool = False
    wait_for: Optional[WaitFor] = None


class AutostopRequest(BaseModel):
    """`spz autostop`'s options: `idle_minutes` (-i) or `cancel`; `down` tears down instead of stopping."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    idle_minutes: Optional[int] = Field(None, ge=0, le=limits.MAX_IDLE_MINUTES)
    down: bool = False
    cancel: bool = False
    wait_for: Optional[WaitFor] = None


class CancelRequest(BaseModel):
    """`spz cancel`'s options: the job ids, or `all`; neither: the latest unfinished job."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    job_ids: list[int] = Field(default_factory=list, max_length=MAX_CANCEL_IDS)
    all: bool = False


async def cluster_or_404(deps: ApiDeps, name: str) -> ClusterView:
    try:
        view = await read_view(deps.bus(), name)
    except Exception as exc:
        log.warning("reading cluster %s failed: %s: %s", name, type(exc).__name__, exc)
        raise unavailable("the server cannot read the log just now; try again shortly", 2)
    if view.status is None:
        raise not_found(f"no cluster named {name} (GET /api/v1/clusters lists them)")
    return view


async def job_view_or_404(deps: ApiDeps, name: str, job_id: int, who: Principal) -> ClusterView:
    """The cluster of a job whose logs `who` asks for: 404 without the cluster or the job, 403
    when its owner's logs are not theirs to read (the log routes and the log-file download)."""
    view = await cluster_or_404(deps, name)
    if job_id not in view.jobs:
        raise not_found(f"no job {job_id} on cluster {name} (GET /api/v1/clusters/{name}/jobs lists them)")
    _allow(who, "logs", view.job_owner.get(job_id, view.owner))
    return view


async def managed_row_or_404(deps: ApiDeps, job_id: int) -> dict[str, Any]:
    """A managed job's row from the status service: 503 when it does not answer, 404 without it."""
    b = deps.bus()
    try:
        rows = await status_queries.jobs_queue(b, job_ids=[job_id], min_seq=await b.last_seq(),
                                               timeout=STATUS_TIMEOUT_S)
    except Exception as exc:
        log.warning("jobs_queue query failed: %s: %s", type(exc).__name__, exc)
        raise unavailable(f"the status service did not answer in {STATUS_TIMEOUT_S:.0f} s; is the control "
                          "plane running (spz api status)?")
    row = next((x for x in rows if x.get("job_id") == job_id), None)
    if row is None:
        raise not_found(f"no managed job {job_id} (GET /api/v1/jobs?all_users=true lists them)")
    return row


def _allow(who: Principal, action: Action, owner: tuple[str, str | None]) -> None:
    decision = authorize(who, action, owner[0], owner[1])
    if not decision.allowed:
        raise forbidden(decision.reason)


async def _publish(deps: ApiDeps, who: Principal, event: Event) -> int:
    b = deps.bus()
    ack = await b.publish(stamp(b.envelope(event), who.user, who.team))
    return ack.seq


async def _status_rows(deps: ApiDeps, query: str, **kw: Any) -> list[dict[str, Any]]:
    fn = status_queries.status if query == "status" else status_queries.queue
    try:
        return await fn(deps.bus(), timeout=STATUS_TIMEOUT_S, **kw)
    except Exception as exc:
        log.warning("%s query failed: %s: %s", query, type(exc).__name__, exc)
        raise unavailable(f"the status service did not answer in {STATUS_TIMEOUT_S:.0f} s; is the control plane "
                          "running (spz api status)?")


def router(deps: ApiDeps) -> APIRouter:
    r = APIRouter(prefix="/api/v1/clusters", tags=["clusters"])
    caller = Depends(deps.principal)

    async def past_or_404(name: str, at: str | None) -> Any:
        """(the cluster's subject up to `at`, its fold, its owner, the time), or None for now; the
        caller checks who may read it."""
        when = timetravel.checked_at(at)
        if when is None:
            return None
        try:
            past = await timetravel.cluster_at(deps.bus(), name, when)
            fold, owner = past.fold(), await timetravel.owner_of(deps.bus(), past)
        except Exception as exc:
            log.warning("rebuilding cluster %s at %s failed: %s: %s", name, when, type(exc).__name__, exc)
            raise unavailable("the server cannot read the log just now; try again shortly", 2)
        if fold.status is None:
            raise not_found(f"no cluster {name} at {when.isoformat()} (GET /api/v1/clusters?at=... lists them)")
        return past, fold, owner, when.isoformat()

    At = Query(None, max_length=timetravel.MAX_AT_CHARS, description=timetravel.AT_DESCRIPTION)

    @r.get("/{name}", summary="One cluster (a row of spz status)")
    async def get_cluster(name: ClusterName, who: Principal = caller, at: Optional[str] = At) -> dict[str, Any]:
        if (then := await past_or_404(name, at)) is not None:
            past, fold, owner, when = then
            _allow(who, "read", owner)
            return {**timetravel.row(past, fold, owner), "owner": {"user": owner[0], "team": owner[1]}, "at": when}
        view = await cluster_or_404(deps, name)
        _allow(who, "read", view.owner)
        rows = await _status_rows(deps, "status", all=True, clusters=[name], min_seq=view.last_seq)
        row = next((x for x in rows if x.get("name") == name), None)
        if row is None:
            row = {"name": name, "status": view.status, "user": view.owner[0], "team": view.owner[1]}
        return {**row, "status": view.status, "owner": {"user": view.owner[0], "team": view.owner[1]},
                "head_ip": view.head_ip, "ports": list(view.ports)}

    @r.get("/{name}/jobs", summary="The cluster's job queue (spz queue)")
    async def get_queue(name: ClusterName, who: Principal = caller, skip_finished: bool = False,
                        at: Optional[str] = At) -> dict[str, Any]:
        if (then := await past_or_404(name, at)) is not None:
            past, fold, owner, when = then
            _allow(who, "read", owner)
            rows = [j for j in timetravel.job_rows(past, fold, owner)
                    if authorize(who, "read", j["user"], j["team"]).allowed
                    and not (skip_finished and j["status"] in timetravel.JOB_TERMINAL)]
            return {"cluster": name, "jobs": rows, "at": when}
        view = await cluster_or_404(deps, name)
        _allow(who, "read", view.owner)
        rows = await _status_rows(deps, "queue", clusters=[name], skip_finished=skip_finished, min_seq=view.last_seq)
        shown = [row for row in rows if row.get("cluster", name) == name and authorize(
            who, "read", *view.job_owner.get(int(row.get("job_id") or 0), view.owner)).allowed]
        return {"cluster": name, "jobs": shown}

    async def lifecycle(verb: str, name: str, who: Principal, autostop: StartRequest | None = None) -> dict[str, Any]:
        view = await cluster_or_404(deps, name)
        _allow(who, "act", view.owner)
        if view.status not in LIFECYCLE_FROM[verb]:
            raise conflict(f"cluster {name} is {view.status}: {verb} acts on a cluster that is "
                           f"{' or '.join(LIFECYCLE_FROM[verb])}")
        event: Event
        if verb == "stop":
            refusal = stop_refusal(name, view.use_spot)
            if refusal:
                raise conflict(refusal)
            event = StopRequested(cluster=name)
        elif verb == "start":
            if autostop is not None and autostop.idle_minutes is not None:  # as `spz start -i`
                await _publish(deps, who, AutostopSet(cluster=name, idle_minutes=autostop.idle_minutes,
                                                      down=autostop.down, wait_for=autostop.wait_for or "jobs_and_ssh"))
            event = StartRequested(cluster=name)
        else:
            event = DownRequested(cluster=name, reason="user", requested_by=who.user)
        seq = await _publish(deps, who, event)
        log.info("%s of cluster %s requested by %s", verb, name, who.user)
        return {"cluster": name, "requested": verb, "seq": seq, "goal": LIFECYCLE_GOAL[verb]}

    @r.post("/{name}/stop", status_code=202, summary="Stop the cluster (spz stop)")
    async def stop(name: ClusterName, who: Principal = caller) -> dict[str, Any]:
        return await lifecycle("stop", name, who)

    @r.post("/{name}/start", status_code=202, summary="Start a stopped cluster (spz start)")
    async def start(name: ClusterName, body: Optional[StartRequest] = None, who: Principal = caller) -> dict[str, Any]:
        return await lifecycle("start", name, who, body)

    @r.post("/{name}/down", status_code=202, summary="Tear the cluster down (spz down)")
    async def down(name: ClusterName, who: Principal = caller) -> dict[str, Any]:
        return await lifecycle("down", name, who)

    @r.post("/{name}/purge", status_code=202, summary="Drop a cluster whose teardown failed from the records "
                                                     "(spz down --purge)")
    async def purge(name: ClusterName, who: Principal = caller) -> dict[str, Any]:
        # What `spz down --purge` publishes on the bus when a teardown failed or was not confirmed:
        # the cluster leaves the records (its instances may still run); the client decides when.
        view = await cluster_or_404(deps, name)
        _allow(who, "act", view.owner)
        if view.status == "TERMINATED":
            raise conflict(f"cluster {name} is TERMINATED already: there is nothing to purge")
        seq = await _publish(deps, who, ClusterTerminated(cluster=name, terminated_at=datetime.now(timezone.utc),
                                                          reason="purged"))
        log.warning("cluster %s purged from the records by %s", name, who.user)
        return {"cluster": name, "requested": "purge", "seq": seq, "goal": "TERMINATED"}

    @r.post("/{name}/autostop", status_code=202, summary="Set or cancel autostop (spz autostop)")
    async def autostop(name: ClusterName, body: AutostopRequest, who: Principal = caller) -> dict[str, Any]:
        if body.cancel == (body.idle_minutes is not None):
            raise Problem(422, "invalid-request", "Invalid request",
                          "give idle_minutes or cancel: true (one of the two)")
        if body.cancel and body.wait_for is not None:
            raise Problem(422, "invalid-request", "Invalid request", "wait_for goes with idle_minutes, not cancel")
        view = await cluster_or_404(deps, name)
        _allow(who, "act", view.owner)
        if view.status != "UP":
            raise conflict(f"cluster {name} is {view.status}: autostop is set on a cluster that is UP")
        seq = await _publish(deps, who, AutostopSet(cluster=name, idle_minutes=None if body.cancel else body.idle_minutes,
                                                    down=body.down, wait_for=body.wait_for or "jobs_and_ssh"))
        return {"cluster": name, "requested": "autostop", "seq": seq,
                "idle_minutes": None if body.cancel else body.idle_minutes, "down": body.down}

    async def cancel(name: str, who: Principal, job_ids: list[int], all_: bool) -> dict[str, Any]:
        view = await cluster_or_404(deps, name)
        choice = cancel_targets(view.jobs, job_ids, all_)
        if choice.missing:
            raise not_found(f"no job {', '.join(map(str, choice.missing))} on cluster {name}")
        for j in choice.targets:  # every target allowed, or none is cancelled
            _allow(who, "act", view.job_owner.get(j, view.owner))
        seqs = [await _publish(deps, who, CancelRequested(cluster=name, job_id=j, requested_by=who.user))
                for j in choice.targets]
        return {"cluster": name, "cancelled": list(choice.targets), "already_ended": list(choice.ended),
                "seqs": seqs}

    @r.post("/{name}/jobs/cancel", status_code=202, summary="Cancel jobs: the ids given, all, or the latest")
    async def cancel_jobs(name: ClusterName, body: CancelRequest, who: Principal = caller) -> dict[str, Any]:
        if body.all and body.job_ids:
            raise Problem(422, "invalid-request", "Invalid request", "give job_ids or all, not both")
        if any(not 1 <= j <= limits.MAX_JOB_ID for j in body.job_ids):
            raise Problem(422, "invalid-request", "Invalid request",
                          f"job ids are from 1 to {limits.MAX_JOB_ID:,}")
        return await cancel(name, who, list(body.job_ids), body.all)

    @r.post("/{name}/jobs/{job_id}/cancel", status_code=202, summary="Cancel one job (spz cancel NAME ID)")
    async def cancel_job(name: ClusterName, job_id: JobId, who: Principal = caller) -> dict[str, Any]:
        return await cancel(name, who, [job_id], False)

    return r
