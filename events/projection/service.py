"""The loop every projection service runs (the open status service, the platform ledger).

A projection service is the one writer of its DuckDB file. It reads the log from checkpoint + 1
with an ephemeral consumer (logreader.py), applies batches in memory, commits each batch with
its checkpoint in one transaction off the event loop (pipeline.py), parks an event it cannot
apply after bisecting it out of its batch, halts (and retries) on an event version newer than
the code, and answers its queries over NATS request-reply from read cursors. `position` and
`audit` (a replay into a fresh file, compared table by table) are every projection's; a
subclass names its file, its projector and its own queries, and may run loops of its own beside
the projection (the ledger's meter).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ..bus import CANNOT_CONNECT, Bus
from ..service import LoopContract, declared_bus
from .logreader import LogReader
from .parking import park_failed
from .pipeline import Failed, Pipeline, Projector
from .replay import audit_live
from .state import NewerEventError
from ..aiotasks import stop_tasks

Handler = Callable[[dict[str, Any]], Any]
MAX_WAIT_S = 30.0  # the longest a query waits for its `min_seq` (a request names its own wait_s)


class ProjectionService:
    contract: LoopContract
    name: str
    query_service: str  # the request-reply service name: naming.query_subject(stage, this, query)
    halt_retry_s: float = 30.0
    # How many requests of one of its own queries are answered at once (events/bus.py
    # `serve_queries`); `position` and `audit` are answered one at a time.
    query_concurrency: int = 1
    log: logging.Logger

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

    # ------------------------------------------------------------ what a subclass says

    def default_path(self, stage: str) -> Path:
        raise NotImplementedError

    def open_projector(self, path: Path) -> Projector:
        raise NotImplementedError

    def query_handlers(self) -> dict[str, Handler]:
        """The projection's own queries (`position` and `audit` are added)."""
        return {}

    async def prepare(self) -> None:
        """Before the file is opened (the ledger reads its config)."""

    def background(self) -> list[Coroutine[Any, Any, None]]:
        """Loops that run beside the projection while the service runs."""
        return []

    def pipeline_guard(self) -> asyncio.Lock | None:
        """A lock the pipeline holds while it commits (the ledger's meter)."""
        return None

    def after_batch(self) -> None:
        """Called after each batch read from the log (applied or empty)."""

    # ------------------------------------------------------------ lifecycle

    @property
    def path(self) -> Path:
        assert self.bus is not None
        return self.db_path or self.default_path(self.bus.stage)

    async def start(self, bus: Bus) -> None:
        """Run in the background (until `close`); returns once queries are served."""
        self._own_stop = asyncio.Event()
        self._task = asyncio.create_task(self.run(bus, self._own_stop), name=self.name)
        ready = asyncio.create_task(self._ready.wait())
        await asyncio.wait([ready, self._task], return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            ready.cancel()
            self._task.result()

    async def serving(self) -> None:
        """Until its queries are answered (after `prepare` and opening its file)."""
        await self._ready.wait()

    async def close(self) -> None:
        if self._own_stop is not None and self._task is not None:
            self._own_stop.set()
            await self._task

    async def run(self, bus: Bus, stop: asyncio.Event) -> None:
        bus = declared_bus(bus, self.contract)  # what it publishes is checked against its contract
        self.bus = bus
        await self.prepare()
        self.projector = await asyncio.to_thread(self.open_projector, self.path)
        self.pipeline = Pipeline(self.projector, on_written=self._notify_written, on_failed=self._park,
                                 guard=self.pipeline_guard())
        self._readers = asyncio.Queue()
        for _ in range(self.n_readers):
            self._readers.put_nowait(self.projector.con.cursor())
        subs = await bus.serve_queries(self.query_service, self.query_handlers(), concurrency=self.query_concurrency)
        subs += await bus.serve_queries(self.query_service, self._handlers())
        tasks = [asyncio.create_task(self._project_loop(), name=f"{self.name}-project")]
        tasks += [asyncio.create_task(c, name=f"{self.name}-loop") for c in self.background()]
        self._ready.set()
        stopper = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception():
                    raise t.exception()  # type: ignore[misc]
        finally:
            stopper.cancel()
            await stop_tasks(*tasks)
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
                    self.after_batch()
            except NewerEventError as exc:
                self.halted = str(exc)
                self.log.error("%s halted: %s (upgrade; it retries every %.0f s)", self.name, exc, self.halt_retry_s)
                await reader.close()
                await asyncio.sleep(self.halt_retry_s)
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
        """An event the projection cannot apply: on the dead-letter stream with why, before the
        checkpoint moves past it."""
        assert self.bus is not None
        self.parked += 1
        await park_failed(self.bus, self.name, failure, self.log)

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

    def reading(self, fn: Callable[[Any, dict[str, Any]], Any]) -> Handler:
        """A query handler on a read cursor; with `min_seq`, once the projection has committed it."""
        async def handler(params: dict[str, Any]) -> Any:
            await self.caught_up_with(params)
            return await self._read(lambda cur: fn(cur, params))
        return handler

    async def caught_up_with(self, params: dict[str, Any]) -> None:
        """A query's `min_seq`: wait (`wait_s`, at most MAX_WAIT_S) until the projection has committed
        it; then answer as it is, or, with `strict`, refuse (the caller would keep a stale answer)."""
        if params.get("min_seq"):
            wait = float(params.get("wait_s", 10.0))
            wait = min(wait, MAX_WAIT_S) if wait >= 0 else 0.0  # (NaN too)
            seq = int(params["min_seq"])
            if not await self.wait_written(seq, wait) and params.get("strict"):
                assert self.projector is not None
                raise TimeoutError(f"the {self.name} projection has committed the log up to "
                                   f"{self.projector.written_seq}, not yet {seq}")

    def _handlers(self) -> dict[str, Handler]:
        """Every projection's own queries (a subclass's `query_handlers` are served beside them)."""
        async def position(params: dict[str, Any]) -> Any:
            assert self.projector is not None
            return {"checkpoint": self.projector.written_seq, "applied_seq": self.projector.state.last_seq,
                    "records": self.projector.state.records, "caught_up": self.caught_up,
                    "halted": self.halted, "file": str(self.path), "parked": self.parked}

        async def audit(params: dict[str, Any]) -> Any:
            return await self.audit(params.get("keep"))

        return {"position": position, "audit": audit}

    async def audit(self, keep: str | None = None) -> dict[str, Any]:
        """Replay the log into a fresh file and compare it with the live tables (replay.audit_live)."""
        assert self.bus is not None and self.projector is not None and self.pipeline is not None
        return await audit_live(self.bus, live_path=self.path, projection=self.projector.projection,
                                projector=self.projector, pipeline=self.pipeline, lock=self._lock, read=self._read,
                                open_replay=self.open_projector, keep=keep)


def service_main(argv: list[str] | None, *, prog: str, doc: str | None, name: str,
                 build: Callable[[Any], ProjectionService],
                 add_args: Callable[[Any], None] | None = None) -> int:
    """`python -m <a projection service>`: --nats, --stage, --db, --batch (and the service's own
    flags), run until SIGTERM or Ctrl-C."""
    import argparse
    import signal

    from .. import naming

    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nats", required=True, help="NATS URL")
    p.add_argument("--stage", default=naming.DEFAULT_STAGE)
    p.add_argument("--db", type=Path, default=None, help="the projection file (default: the stage's)")
    p.add_argument("--batch", type=int, default=5000, help="events per pull request and commit (1 to 100000)")
    if add_args is not None:
        add_args(p)
    args = p.parse_args(argv)
    args.batch = max(1, min(args.batch, 100_000))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        bus = await Bus.connect(args.nats, args.stage, source=f"/skypurza/{args.stage}/{name}")
        svc = build(args)
        try:
            await svc.run(bus, stop)
        finally:
            await bus.close()

    try:
        asyncio.run(run())
    except CANNOT_CONNECT as exc:  # which credentials file, what is wrong: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
