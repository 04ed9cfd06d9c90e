"""The status service: the one writer of the status projections file, and its queries.

Open code (docs/status.md). It has its own loop (`run(bus, stop)`), like the ledger, because its
position in the log is the checkpoint in DuckDB, written in the same transaction as the rows
(events/projection/): it reads the log from checkpoint + 1 with an ephemeral consumer, applies
batches in memory (services/status/projector.py, the one fold's states), commits each batch with
its checkpoint off the event loop, and answers `status`, `queue`, `jobs_queue`, `position` and
`audit` over NATS request-reply on `naming.query_subject(stage, "status", <query>)` from read
cursors. An event it cannot apply is bisected out of its batch, recorded as skipped and parked
(service `status`); the rest goes on.

It is a `LoopContract` that reads every event and emits none.

    python -m skypurza.services.status.service --nats URL --stage dev [--db FILE] [--batch N]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus
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
from skypurza.events.projection.logreader import LogReader
from skypurza.events.projection.parking import park_failed
from skypurza.events.projection.pipeline import Failed, Pipeline, Projector
from skypurza.events.projection.replay import catch_up_into, compare_attached
from skypurza.events.projection.state import NewerEventError
from skypurza.events.service import LoopContract, declared_bus

from . import queries
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
)


class StatusService:
    contract = CONTRACT
    name = CONTRACT.name

    def __init__(self, db_path: Path | None = None, *, batch: int = 5000, readers: int = 2):
        self.db_path = Path(db_path) if db_path else None
        self.batch = batch
        self.n_readers = readers
        self.bus: Bus | None = None
        self.projector: Projector | None = None
        self.pipeline: Pipeline | None = None
        self.caught_up = False
        self.halted: str | None = None
        self.parked = 0  # events this instance could not apply (parked on the dead-letter stream)
        self._lock = asyncio.Lock()  # held while a batch is applied and its write started
        self._written = asyncio.Condition()
        self._readers: asyncio.Queue | None = None
        self._ready = asyncio.Event()
        self._own_stop: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def path(self) -> Path:
        assert self.bus is not None
        return self.db_path or naming.status_db_file(self.bus.stage)

    async def start(self, bus: Bus) -> None:
        """Run in the background (until `close`); returns once queries are served."""
        self._own_stop = asyncio.Event()
        self._task = asyncio.create_task(self.run(bus, self._own_stop), name="status")
        ready = asyncio.create_task(self._ready.wait())
        await asyncio.wait([ready, self._task], return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            ready.cancel()
            self._task.result()

    async def close(self) -> None:
        if self._own_stop is not None and self._task is not None:
            self._own_stop.set()
            await self._task

    async def run(self, bus: Bus, stop: asyncio.Event) -> None:
        bus = declared_bus(bus, self.contract)  # it emits nothing: a publish raises UndeclaredEmit
        self.bus = bus
        self.projector = await asyncio.to_thread(Projector, self.path, PROJECTION)
        self.pipeline = Pipeline(self.projector, on_written=self._notify_written, on_failed=self._park)
        self._readers = asyncio.Queue()
        for _ in range(self.n_readers):
            self._readers.put_nowait(self.projector.con.cursor())
        subs = await bus.serve_queries(QUERY_SERVICE, self._handlers())
        project = asyncio.create_task(self._project_loop(), name="status-project")
        self._ready.set()
        stopper = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([project, stopper], return_when=asyncio.FIRST_COMPLETED)
            if project in done and project.exception():
                raise project.exception()  # type: ignore[misc]
        finally:
            stopper.cancel()
            project.cancel()
            await asyncio.gather(project, return_exceptions=True)
            for s in subs:
                try:
                    await s.unsubscribe()
                except Exception:
                    pass
            if self.pipeline.pending is not None:
                await asyncio.gather(self.pipeline.pending, return_exceptions=True)
            while not self._readers.empty():
                self._readers.get_nowait().close()
            self.projector.close()
            self._ready.clear()

    # ------------------------------------------------------------ projection

    async def _project_loop(self) -> None:
        assert self.bus is not None and self.projector is not None
        while True:
            reader = LogReader(self.bus, start_seq=self.projector.state.last_seq + 1, follow=True,
                               batch=self.batch, reader=self.name)
            try:
                async for raw in reader.batches():
                    if raw:
                        await self._apply(raw)
                    self.caught_up = reader.caught_up
            except NewerEventError as exc:
                self.halted = str(exc)
                log.error("status projection halted: %s (upgrade; it retries every %.0f s)", exc, HALT_RETRY_S)
                await reader.close()
                await asyncio.sleep(HALT_RETRY_S)
            finally:
                await reader.close()

    async def _apply(self, raw: list) -> None:
        assert self.pipeline is not None
        async with self._lock:
            await self.pipeline.feed(raw)
            self.halted = None

    async def _notify_written(self) -> None:
        async with self._written:
            self._written.notify_all()

    async def _park(self, failure: Failed) -> None:
        assert self.bus is not None
        self.parked += 1
        await park_failed(self.bus, self.name, failure, log)

    async def wait_written(self, seq: int, timeout: float = 10.0) -> bool:
        """Wait until the projection has committed everything up to `seq`."""
        assert self.projector is not None
        try:
            async with self._written:
                await asyncio.wait_for(self._written.wait_for(lambda: self.projector.written_seq >= seq), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def wait_caught_up(self, timeout: float = 10.0) -> bool:
        """Wait until the projection has committed the whole log as it is now."""
        assert self.bus is not None
        return await self.wait_written(await self.bus.last_seq(), timeout)

    # ------------------------------------------------------------ queries

    async def _read(self, fn: Callable[[Any], Any]) -> Any:
        assert self._readers is not None
        cur = await self._readers.get()
        try:
            return await asyncio.to_thread(fn, cur)
        finally:
            self._readers.put_nowait(cur)

    def _handlers(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        def read(fn: Callable[[Any, dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
            async def handler(params: dict[str, Any]) -> Any:
                if params.get("min_seq"):
                    await self.wait_written(int(params["min_seq"]), float(params.get("wait_s", 10.0)))
                return await self._read(lambda cur: fn(cur, params))
            return handler

        async def position(params: dict[str, Any]) -> Any:
            assert self.projector is not None
            return {"checkpoint": self.projector.written_seq, "applied_seq": self.projector.state.last_seq,
                    "records": self.projector.state.records, "caught_up": self.caught_up,
                    "halted": self.halted, "file": str(self.path), "parked": self.parked}

        async def audit(params: dict[str, Any]) -> Any:
            return await self.audit(params.get("keep"))

        return {
            "status": read(queries.status),
            "queue": read(queries.queue),
            "jobs_queue": read(queries.jobs_queue),
            "position": position,
            "audit": audit,
        }

    # ------------------------------------------------------------ audit

    async def audit(self, keep: str | None = None) -> dict[str, Any]:
        """Replay the log into a fresh file and compare it with the live tables, table by table.

        The replay runs up to the live position while the projection goes on; then it pauses
        (queries still answer) while the replay catches up with it and the files are compared.
        """
        assert self.bus is not None and self.projector is not None
        path = Path(keep) if keep else self.path.with_name(self.path.stem + ".audit.duckdb")
        for p in (path, Path(f"{path}.wal")):
            p.unlink(missing_ok=True)
        replay = await asyncio.to_thread(Projector, path, PROJECTION)
        closed = False
        try:
            await catch_up_into(self.bus, replay, self.projector.written_seq)
            async with self._lock:
                assert self.pipeline is not None
                await self.pipeline.flush()
                through = self.projector.written_seq
                await catch_up_into(self.bus, replay, through)
                await asyncio.to_thread(replay.close)
                closed = True
                result = await self._read(lambda cur: compare_attached(cur, path, PROJECTION))
        finally:
            if not closed:
                replay.close()
            if not keep:
                for p in (path, Path(f"{path}.wal")):
                    p.unlink(missing_ok=True)
        result["through_seq"] = through
        result["live_file"] = str(self.path)
        if keep:
            result["replay_file"] = str(path)
        return result


# ---------------------------------------------------------------- process entry point


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skypurza.services.status.service", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nats", required=True, help="NATS URL")
    p.add_argument("--stage", default=naming.DEFAULT_STAGE)
    p.add_argument("--db", type=Path, default=None, help="status projections file (default: the stage's)")
    p.add_argument("--batch", type=int, default=5000, help="events per pull request and commit")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        bus = await Bus.connect(args.nats, args.stage, source=f"/skypurza/{args.stage}/status")
        svc = StatusService(args.db, batch=max(1, min(args.batch, 100_000)))
        try:
            await svc.run(bus, stop)
        finally:
            await bus.close()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
