"""What `spz logs --provision`, `--autostop` and `--sync-down` read, through the server.

- `GET /api/v1/clusters/{name}/history/{kind}` (`provision` or `autostop`): the cluster's
  provisioning or autostop history as server-sent events, one `line` frame per event (the very
  line the embedded CLI prints, events/clusterhistory.py), then `end` with how many.
- `GET /api/v1/clusters/{name}/jobs/{id}/logs/files/{rank}`: one node's output as its
  `--sync-down` file holds it (`text/plain`, streamed as it is read from the logs stream; at most
  `max_bytes`, MAX_LOG_FILE_BYTES by default: a longer file is cut there and the client says so).

Who may: `logs` on the cluster's owner (a history) or the job's (a file): a member their own
team's, an admin anyone's. Each response takes one of the caller's stream slots until it ends.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Depends, Path, Query

from skypurza.events.bus import Bus
from skypurza.events.clusterhistory import HISTORIES, MAX_LOG_FILE_BYTES, history_lines, job_file_lines, log_file_name

from .deps import ApiDeps, ClusterName, JobId
from .identity import Principal, authorize
from .problems import forbidden, not_found, unavailable
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
        from .routes_clusters import cluster_or_404

        view = await cluster_or_404(deps, name)
        if job_id not in view.jobs:
            raise not_found(f"no job {job_id} on cluster {name} (GET /api/v1/clusters/{name}/jobs lists them)")
        owner = view.job_owner.get(job_id, view.owner)
        decision = authorize(who, "logs", owner[0], owner[1])
        if not decision.allowed:
            raise forbidden(decision.reason)
        release = slots.take(who.user)
        return SseResponse(_file(deps.bus(), name, job_id, rank, max_bytes), release,
                           media_type="text/plain; charset=utf-8",
                           headers={"Content-Disposition": f'attachment; filename="{log_file_name(rank)}"'})

    return r
