"""Streams as server-sent events: a job's output, and the log's CloudEvents.

- `GET /api/v1/clusters/{name}/jobs/{id}/logs`: the job's output chunks as the logs stream
  stored them, each once (events/logchunks.py, as `spz logs` reads them): `tail` N of the history,
  then, with `follow`, chunks as they come until the job ends; the last frame is `end`, with
  the job's final status (or its status now, without `follow`). Who may: `logs` on the job's owner.
- `GET /api/v1/events`: every event stored from `since` on (or new ones), as structured-mode
  CloudEvents JSON, filtered by `type` (the event's name, e.g. `job_queued`, or its whole
  CloudEvents type) and a `subject` prefix (`cluster/dev`). An admin sees every event; a member
  the events of their own clusters and tasks, a viewer their team's; other aggregates (users,
  teams, managed jobs, the ledger's) are for admins.

Each stream takes one of the caller's stream slots (services/api/sse.py) until it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Optional

from fastapi import APIRouter, Depends, Header, Query

from skypurza.events import fold, naming
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.bus import Bus, stored_from_msg
from skypurza.events.cluster_events import ClusterProvisioned
from skypurza.events.logchunks import ChunkFilter, LogLine, parse_log

from .clusterview import Owner, read_view, task_owner
from .deps import ApiDeps, ClusterName, JobId
from .identity import Principal
from .sse import KEEPALIVE, KEEPALIVE_S, SseResponse, StreamSlots, frame

log = logging.getLogger("skypurza.api")

MAX_TAIL = 10_000  # chunks of history a logs request may ask for (`tail`)
DRAIN_S = 0.5  # after the job ended: the last chunks a node sent just before are read too
_END = object()


def _chunk(line: LogLine) -> dict[str, Any]:
    return {"line": line.line, "end": line.end, "rank": line.rank, "stream": line.stream, "ts": line.ts}


def _last_event_id(value: str | None) -> int | None:
    """A Last-Event-ID header as a stream sequence; anything else (not ASCII digits) is none."""
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


def may_see(who: Principal, aggregate: str, owner: Owner | None) -> bool:
    """Whether an event of `aggregate` owned by `owner` goes to `who`'s events stream (by the
    caller's role in the owner's team)."""
    if who.is_admin:
        return True
    if aggregate not in ("cluster", "task") or owner is None:
        return False
    if who.role_in(owner[1]) == "viewer":
        return owner[1] in who.in_teams
    return owner[0] == who.user


async def _pumped(pumps: list[Any], queue: asyncio.Queue) -> AsyncIterator[Any]:
    """What the pump tasks put on `queue`, with None when nothing came for KEEPALIVE_S; the pumps are
    stopped however the caller stops reading."""
    tasks = [asyncio.create_task(p) for p in pumps]
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                item = None
            if item is _END:
                return
            yield item
    finally:
        await stop_tasks(*tasks)


async def job_lines(bus: Bus, name: str, job_id: int, follow: bool, tail: int, start: Any,
                    outcome: dict[str, Any], after: int = 0) -> AsyncIterator[bytes]:
    """The `line` frames (and keep-alives) of job `job_id` on cluster `name`, as `start` (its
    ClusterView) left it: `tail` of the history, then with `follow` until the job or the cluster
    ends. `after`: a reconnecting client's Last-Event-ID (a frame's `id` is the chunk's sequence on
    the logs stream): only the chunks after it, so a client that moves to another API server
    replica carries on with nothing lost or repeated (`tail` then counts from there). `outcome`
    is filled with the job's and the cluster's final status. Shared by a
    cluster job's stream and a managed job's (services/api/routes_jobs.py)."""
    subject = naming.logs_subject_filter(bus.stage, name, job_id)
    chunks = ChunkFilter()
    history: list[LogLine] = []
    last = 0
    async for msg in bus.replay_raw(stream=bus.logs_stream, filter_subject=subject):
        line = parse_log(msg)
        last = line.seq
        if chunks.fresh(line) and line.seq > after:  # (every chunk goes through the filter: its state)
            history.append(line)
    for line in history[-tail:] if tail > 0 else history:
        yield frame("line", _chunk(line), line.seq)
    job = start.jobs[job_id]
    status = start.status
    if follow and not job.terminal and status != "TERMINATED":
        queue: asyncio.Queue = asyncio.Queue(maxsize=1000)

        async def events() -> None:
            nonlocal job, status
            async for msg in bus.follow(filter_subject=naming.aggregate_subjects(bus.stage, "cluster", name),
                                        start_seq=start.last_seq + 1):
                ev = stored_from_msg(msg).event
                if ev is None:
                    continue
                status = fold.cluster_after(status, ev)
                if getattr(ev, "job_id", None) == job_id:
                    job = fold.job_after(job, ev, start.fold.num_nodes)
                if job.terminal or status == "TERMINATED":
                    await asyncio.sleep(DRAIN_S)
                    await queue.put(_END)
                    return

        async def lines() -> None:
            async for msg in bus.follow(stream=bus.logs_stream, filter_subject=subject, start_seq=last + 1):
                await queue.put(parse_log(msg))

        async for line in _pumped([events(), lines()], queue):
            if line is None:
                yield KEEPALIVE
            elif line.seq > last:
                last = line.seq
                if chunks.fresh(line):
                    yield frame("line", _chunk(line), line.seq)
        async for msg in bus.replay_raw(stream=bus.logs_stream, filter_subject=subject, start_seq=last + 1):
            line = parse_log(msg)
            if line.seq > last and chunks.fresh(line):
                last = line.seq
                yield frame("line", _chunk(line), line.seq)
    outcome.update(status=job.status, exit_code=job.exit_code, cluster_status=status, reason=job.reason or None)


async def _job_logs(bus: Bus, name: str, job_id: int, follow: bool, tail: int, start: Any,
                    after: int = 0) -> AsyncIterator[bytes]:
    outcome: dict[str, Any] = {}
    async for chunk in job_lines(bus, name, job_id, follow, tail, start, outcome, after):
        yield chunk
    yield frame("end", {"cluster": name, "job_id": job_id, **outcome})


class _Owners:
    """Who owns each cluster and task an events stream meets (read once, then followed)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.known: dict[tuple[str, str], Owner | None] = {}

    async def of(self, aggregate: str, aggregate_id: str, event: Any) -> Owner | None:
        key = (aggregate, aggregate_id)
        if aggregate == "cluster" and isinstance(event, ClusterProvisioned):  # a new cluster under the name
            self.known[key] = await task_owner(self.bus, event.task_id, (event.user, event.team))
        if key not in self.known:
            if aggregate == "task":
                self.known[key] = await task_owner(self.bus, aggregate_id, ("", None))
            elif aggregate == "cluster":
                view = await read_view(self.bus, aggregate_id)
                self.known[key] = view.owner if view.status is not None else None
            else:
                self.known[key] = None
            if len(self.known) > 10_000:  # bounded: the oldest are read again when met again
                self.known.pop(next(iter(self.known)))
        return self.known[key]


async def _events(bus: Bus, who: Principal, type_: str | None, subject: str | None,
                  since: int | None) -> AsyncIterator[bytes]:
    owners = _Owners(bus)
    queue: asyncio.Queue = asyncio.Queue(maxsize=1000)

    async def pump() -> None:
        async for msg in bus.follow(start_seq=since + 1 if since is not None else None, new_only=since is None):
            await queue.put(stored_from_msg(msg))

    async for s in _pumped([pump()], queue):
        if s is None:
            yield KEEPALIVE
            continue
        env = s.envelope
        if env is None:
            continue
        if type_ and type_ not in (env.type, env.event_name):
            continue
        if subject and not env.subject.startswith(subject):
            continue
        if not may_see(who, env.aggregate, await owners.of(env.aggregate, env.aggregate_id, s.event)):
            continue
        yield frame(env.event_name, env.model_dump(mode="json"), s.seq)


def router(deps: ApiDeps, slots: StreamSlots) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["streams"])
    caller = Depends(deps.principal)
    sse_doc = {200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}}

    @r.get("/clusters/{name}/jobs/{job_id}/logs", responses=sse_doc, response_model=None,
           summary="A job's output as server-sent events (spz logs)")
    async def job_logs(name: ClusterName, job_id: JobId, who: Principal = caller,
                       follow: bool = Query(True, description="Stream until the job ends."),
                       tail: int = Query(0, ge=0, le=MAX_TAIL, description=f"The last N chunks of the history "
                                                                           f"(0: all; at most {MAX_TAIL:,})."),
                       last_event_id: Optional[str] = Header(None, max_length=20, description=(
                           "A reconnecting client's last seen frame id: only the chunks after it.")),
                       ) -> SseResponse:
        from .routes_clusters import job_view_or_404

        b = deps.bus()
        after = _last_event_id(last_event_id) or 0
        view = await job_view_or_404(deps, name, job_id, who)
        release = slots.take(who.user)
        return SseResponse(_job_logs(b, name, job_id, follow, tail, view, after), release)

    @r.get("/events", responses=sse_doc, response_model=None,
           summary="The log's events as CloudEvents (structured JSON), server-sent")
    async def events(who: Principal = caller,
                     type: Optional[Annotated[str, Query(max_length=200, description="An event's name (job_queued) "
                                                         "or its CloudEvents type.")]] = None,
                     subject: Optional[Annotated[str, Query(max_length=300, description="A subject prefix, e.g. "
                                                            "cluster/dev.")]] = None,
                     since: Optional[Annotated[int, Query(ge=0, le=2**63 - 1, description="Events stored after this "
                                                          "stream sequence (default: new ones only).")]] = None,
                     last_event_id: Optional[str] = Header(None, max_length=20,
                                                           description="A reconnecting client's last seen id."),
                     ) -> SseResponse:
        if since is None:
            since = _last_event_id(last_event_id)
        release = slots.take(who.user)
        return SseResponse(_events(deps.bus(), who, type, subject, since), release)

    return r
