"""The status service: the one writer of the status projections file, and its queries.

Open code (docs/status.md). It has its own loop (`run(bus, stop)`), like the ledger, because its
position in the log is the checkpoint in DuckDB, written in the same transaction as the rows
(events/projection/): it reads the log from checkpoint + 1 with an ephemeral consumer, applies
batches in memory (services/status/projector.py, the one fold's states), commits each batch with
its checkpoint off the event loop, and answers `status`, `queue`, `jobs_queue`, `metrics_summary`, `position` and
`audit` over NATS request-reply on `naming.query_subject(stage, "status", <query>)` from read
cursors, each answer kept as its JSON bytes until the projection moves (answers.py). An event it cannot apply is bisected out of its batch, recorded as skipped and parked
(service `status`); the rest goes on.

It is a `LoopContract` that reads every event and emits none.

    python -m skypurza.services.status.service --nats URL --stage dev [--db FILE] [--batch N]
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skypurza.events import naming
from skypurza.events.models import (
    CapacityError,
    ClusterProvisioned,
    JobQueued,
    ManagedJobStatusChanged,
    NodeReady,
    PlacementChosen,
    TaskSubmitted,
    UsageRecorded,
    all_event_types,
)
from skypurza.events.projection.pipeline import Projector
from skypurza.events.projection.service import ProjectionService, service_main
from skypurza.events.contract import BusAccess
from skypurza.events.service import LoopContract

from . import queries
from .answers import AnswerCache, answer_key, encode
from .projector import PROJECTION

log = logging.getLogger("skypurza.status")

QUERY_SERVICE = "status"
HALT_RETRY_S = 30.0  # a newer event version than this code: look again this often

CONTRACT = LoopContract(
    name="status",
    # Every event is read, recorded as applied, and folded into the tables it changes.
    consumes=tuple(all_event_types()),
    emits=(),
    consume_notes={TaskSubmitted: "placements", PlacementChosen: "attempts", CapacityError: "attempts",
                   ClusterProvisioned: "clusters", NodeReady: "nodes", JobQueued: "jobs",
                   ManagedJobStatusChanged: "managed jobs", UsageRecorded: "a cluster's cost so far"},
    bus=BusAccess(answers=QUERY_SERVICE),
)


class StatusService(ProjectionService):
    contract = CONTRACT
    name = CONTRACT.name
    query_service = QUERY_SERVICE
    halt_retry_s = HALT_RETRY_S
    log = log

    def default_path(self, stage: str) -> Path:
        return naming.status_db_file(stage)

    def open_projector(self, path: Path) -> Projector:
        return Projector(path, PROJECTION)

    # Answers kept per position (answers.py); a slow one, or one waiting for its min_seq, holds up
    # no other.
    query_concurrency = 8

    def __init__(self, db_path: Path | None = None, **kw: Any) -> None:
        super().__init__(db_path, **kw)
        self.answers = AnswerCache()

    def query_handlers(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        return {"status": self.kept("status", queries.status), "queue": self.kept("queue", queries.queue),
                "jobs_queue": self.kept("jobs_queue", queries.jobs_queue),
                "metrics_summary": self.kept("metrics_summary", queries.metrics_summary)}

    def kept(self, query: str, fn: Callable[[Any, dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
        """A query answered from a read cursor once per projection position, as the JSON bytes sent
        (the tables change only with the position: nothing but the pipeline writes them)."""
        async def handler(params: dict[str, Any]) -> bytes:
            await self.caught_up_with(params)
            assert self.projector is not None
            position = self.projector.written_seq  # before the read: the answer is at least this new
            return await self.answers.get(answer_key(query, params), position,
                                          lambda: self._read(lambda cur: encode(fn(cur, params))))
        return handler


# ---------------------------------------------------------------- process entry point


def main(argv: list[str] | None = None) -> int:
    return service_main(argv, prog="python -m skypurza.services.status.service", doc=__doc__, name="status",
                        build=lambda a: StatusService(a.db, batch=a.batch))


if __name__ == "__main__":
    sys.exit(main())
