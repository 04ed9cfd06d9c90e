"""What `spz logs --provision`, `--autostop` and `--sync-down` read, through the server.

- `GET /api/v1/clusters/{name}/history/{kind}` (`provision` or `autostop`): the cluster's
  provisioning or autostop history as server-sent events, one `line` frame per event (the very
  line the embedded CLI prints, events/clusterhistory.py), then `end` with how many.
- `GET /api/v1/clusters/{name}/jobs/{id}/logs/files/{rank}`: one node's output as its
  `--sync-down` file holds it (`text/plain`, streamed as it is read from the logs stream; at most
  `max_bytes`, MAX_LOG_FILE_BYTES by default: a longer file is cut there and the client says so).
- `GET /api/v1/jobs/{id}/controller`: a managed job's recovery history (`spz jobs logs
  --controller`: there is no controller, its launches, preemptions and recoveries are events), one
  `line` frame per event, then `end`.
- `GET /api/v1/jobs/{id}/logs/files`: what `spz jobs logs --sync-down` downloads: each cluster the
  managed job ran on, in order, with its jobs and their nodes; each file then comes from the
  cluster route above.

Who may: `logs` on the cluster's owner (a history), the job's (a file) or the managed job's: a
member their own team's, an admin anyone's. Each response takes one of the caller's stream slots until it ends.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Depends, Path, Query

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.clusterhistory import (HISTORIES, MAX_LOG_FILE_BYTES, event_line, history_lines, job_file_lines,
                                            log_file_name)

from . import timetravel
from .clusterview import read_view
from .deps import ApiDeps, ClusterName, JobId
from .identity import Principal, authorize
from .problems import forbidden, unavailable
from .sse import SseResponse, StreamSlots, frame

log = logging.getLogger("skypurza.api")

MAX_RANK = 1023  # as `spz logs -w`
FLUSH_BYTES = 64 * 1024  # a file is sent in pieces of about this size


async def _history(bus: Bus, name: str, kind: str, lines: list[str]) -> AsyncIterator[bytes]:
    for n, line in enumerate(lines):
        yield frame("line", {"line": line}, n + 1)
    yield frame("end", {"cluster": name, "kind": kind, "lines": len(lines)})


async def _file(bus: Bus, name: str, job_id: int, rank: int, max_bytes: int) -> AsyncIterator[bytes]:
    """The node's lines, each ending in a newline, cut at `max_bytes`."""
    sent, pending = 0, bytearray()
    async for _, text in job_file_lines(bus, name, job_id, rank):
        data = (text + "\n").encode()
        if sent + len(pending) + len(data) > max_bytes:
            pending += data[:max_bytes - sent - len(pending)]
            log.info("log file rank %d of %s/%d cut at %d bytes", rank, name, job_id, max_bytes)
            break
        pending += data
        if len(pending) >= FLUSH_BYTES:
            sent += len(pending)
            yield bytes(pending)
            pending.clear()
    if pending:
        yield bytes(pending)


async def _controller(bus: Bus, job_id: int) -> AsyncIterator[bytes]:
    n = 0
    async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "mjob", str(job_id))):
        if s.event is not None and s.envelope is not None:
            n += 1
            yield frame("line", {"line": event_line(s.event, s.envelope.time)}, s.seq)
    yield frame("end", {"job_id": job_id, "lines": n})


def router(deps: ApiDeps, slots: StreamSlots) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["streams"])
    caller = Depends(deps.principal)
    sse_doc = {200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}}
    text_doc = {200: {"content": {"text/plain": {}}, "description": "the node's log file"}}

    @r.get("/clusters/{name}/history/{kind}", responses=sse_doc, response_model=None,
           summary="A cluster's provisioning or autostop history (spz logs --provision / --autostop)")
    async def history(name: ClusterName, kind: Literal["provision", "autostop"],
                      who: Principal = caller) -> SseResponse:
        from .routes_clusters import cluster_or_404

        view = await cluster_or_404(deps, name)
        decision = authorize(who, "logs", view.owner[0], view.owner[1])
        if not decision.allowed:
            raise forbidden(decision.reason)
        try:
            lines = await history_lines(deps.bus(), name, HISTORIES[kind])
        except Exception as exc:
            log.warning("reading the %s history of %s failed: %s: %s", kind, name, type(exc).__name__, exc)
            raise unavailable("the server cannot read the log just now; try again shortly", 2)
        release = slots.take(who.user)
        return SseResponse(_history(deps.bus(), name, kind, lines), release)

    @r.get("/clusters/{name}/jobs/{job_id}/logs/files/{rank}", responses=text_doc, response_model=None,
           summary="One node's log file of a job (spz logs --sync-down)")
    async def log_file(name: ClusterName, job_id: JobId,
                       rank: int = Path(..., ge=0, le=MAX_RANK, description="The node's rank (0 is the head)."),
                       max_bytes: int = Query(MAX_LOG_FILE_BYTES, ge=1, le=MAX_LOG_FILE_BYTES,
                                              description="Cut the file after this many bytes."),
                       who: Principal = caller) -> SseResponse:
        from .routes_clusters import job_view_or_404

        await job_view_or_404(deps, name, job_id, who)
        release = slots.take(who.user)
        return SseResponse(_file(deps.bus(), name, job_id, rank, max_bytes), release,
                           media_type="text/plain; charset=utf-8",
                           headers={"Content-Disposition": f'attachment; filename="{log_file_name(rank)}"'})

    async def managed_or_404(job_id: int, who: Principal) -> None:
        from .routes_clusters import managed_row_or_404

        row = await managed_row_or_404(deps, job_id)
        decision = authorize(who, "logs", row.get("user") or "", row.get("team"))
        if not decision.allowed:
            raise forbidden(decision.reason)

    @r.get("/jobs/{job_id}/controller", responses=sse_doc, response_model=None,
           summary="A managed job's recovery history (spz jobs logs --controller)")
    async def controller(job_id: int = Path(..., ge=1, le=2**31 - 1, description="The managed job's id."),
                         who: Principal = caller) -> SseResponse:
        await managed_or_404(job_id, who)
        release = slots.take(who.user)
        return SseResponse(_controller(deps.bus(), job_id), release)

    @r.get("/jobs/{job_id}/logs/files", summary="A managed job's log files (spz jobs logs --sync-down)")
    async def managed_files(job_id: int = Path(..., ge=1, le=2**31 - 1, description="The managed job's id."),
                            who: Principal = caller) -> dict[str, Any]:
        await managed_or_404(job_id, who)
        b = deps.bus()
        try:
            clusters = (await timetravel.managed_job_at(b, job_id, None)).clusters
            out = []
            for name in clusters:
                view = await read_view(b, name)
                out.append({"cluster": name, "jobs": [{"job_id": j, "num_nodes": int(getattr(view.jobs[j], "num_nodes", 0)
                                                                                      or view.fold.num_nodes or 1)}
                                                      for j in sorted(view.jobs)]})
        except Exception as exc:
            log.warning("reading managed job %s's clusters failed: %s: %s", job_id, type(exc).__name__, exc)
            raise unavailable("the server cannot read the log just now; try again shortly", 2)
        return {"job_id": job_id, "clusters": out}

    return r
