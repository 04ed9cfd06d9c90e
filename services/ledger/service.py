"""The ledger service: the one writer of its accounting file, its queries, its meter.

It has its own loop (`run(bus, stop)`) instead of a ServiceRunner consumer, because its position
in the log is the checkpoint in DuckDB, written in the same transaction as the rows: it reads the
log from checkpoint + 1 with an ephemeral consumer (`LogReader`), applies batches in memory,
commits each batch with its checkpoint off the event loop, and answers queries over NATS
request-reply from read cursors (cost report, settlements, settle, audit, position; `spz status`
and `queue` are the status service's, services/status/). When it has caught up with the log it meters the running node
runs (UsageRecorded at each tick and at stop/termination) and records compensations for usage
that arrived after its period was settled.

It is the second declared shape (`LoopContract`, events/contract.py): `CONTRACT` says it reads
every event and may emit UsageRecorded, CompensationRecorded and PeriodSettled; `run` publishes
on a bus checked against it (`declared_bus`), so anything else raises UndeclaredEmit.

    python -m skypurza.services.ledger.service --nats URL --stage dev [--db FILE] [--tick S]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus, ConcurrencyConflict
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.models import (
    ClusterProvisioned,
    ClusterStarted,
    ClusterStopped,
    ClusterTerminated,
    CompensationRecorded,
    PeriodSettled,
    SpotPreempted,
    TaskSubmitted,
    UsageRecorded,
    all_event_types,
)
from skypurza.events.projection.logreader import LogReader
from skypurza.events.projection.parking import park_failed
from skypurza.events.service import LoopContract, declared_bus

from . import queries, settlement
from .ledgerconfig import LedgerConfig, load_ledger_config
from .meter import Published, due_usage, forget_applied
from .pipeline import Failed, Pipeline, Projector
from .projector import NewerEventError
from .replay import catch_up_into, compare_attached

log = logging.getLogger("skypurza.ledger")

QUERY_SERVICE = "ledger"

CONTRACT = LoopContract(
    name="ledger",
    # Every event is read, recorded as applied, and folded into the projections it changes.
    consumes=tuple(all_event_types()),
    emits=(UsageRecorded, CompensationRecorded, PeriodSettled),
    consume_notes={TaskSubmitted: "attribution", ClusterProvisioned: "meter", ClusterStarted: "meter",
                   ClusterStopped: "meter", ClusterTerminated: "meter", SpotPreempted: "meter",
                   UsageRecorded: "usage, showback, settlement",
                   PeriodSettled: "closes the period", CompensationRecorded: "next period's report"},
    emit_notes={UsageRecorded: "meter", CompensationRecorded: "late usage for a settled period",
                PeriodSettled: "`spz ledger settle`"},
)


class LedgerService:
    contract = CONTRACT
    name = CONTRACT.name

    def __init__(self, db_path: Path | None = None, tick_s: float | None = None, *,
                 clock: Clock | None = None, meter: bool = True, batch: int = 5000,
                 config: LedgerConfig | None = None, meter_every_s: float | None = None,
                 readers: int = 2):
        self.db_path = Path(db_path) if db_path else None
        self.tick_s = tick_s
        self.clock = clock or SYSTEM_CLOCK  # what is due to meter, and when a period may settle
        self.meter_enabled = meter
        self.batch = batch
        self.config = config
        self.meter_every_s = meter_every_s
        self.n_readers = readers
        self.bus: Bus | None = None
        self.projector: Projector | None = None
        self.caught_up = False
        self.halted: str | None = None
        self.overlay: dict[tuple[str, int, str], Published] = {}
        self._comp_sent: set[str] = set()
        self._comp_due = True
        self._comp_lock = asyncio.Lock()
        self._meter_kick = asyncio.Event()
        self._lock = asyncio.Lock()  # held while a batch is applied and its write started
        self._meter_lock = asyncio.Lock()
        self._settle_lock = asyncio.Lock()
        self.pipeline: Pipeline | None = None
        self.parked = 0  # events this instance could not apply (parked on the dead-letter stream)
        self._written = asyncio.Condition()
        self._readers: asyncio.Queue | None = None
        self._ready = asyncio.Event()
        self._own_stop: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def path(self) -> Path:
        assert self.bus is not None
        return self.db_path or naming.projections_file(self.bus.stage)

    async def start(self, bus: Bus) -> None:
        """Run in the background (until `close`); returns once queries are served."""
        self._own_stop = asyncio.Event()
        self._task = asyncio.create_task(self.run(bus, self._own_stop), name="ledger")
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
        bus = declared_bus(bus, self.contract)  # what it publishes is checked against CONTRACT
        self.bus = bus
        cfg = self.config or load_ledger_config()
        self.config = cfg
        tick_s = self.tick_s if self.tick_s is not None else cfg.tick_s
        self.tick = timedelta(seconds=tick_s) if tick_s and tick_s > 0 else None
        if self.meter_every_s is None:
            self.meter_every_s = min(tick_s, 10.0) if self.tick else 10.0
        self.projector = await asyncio.to_thread(Projector, self.path)
        self.pipeline = Pipeline(self.projector, on_written=self._notify_written, on_failed=self._park,
                                 guard=self._meter_lock)
        self._readers = asyncio.Queue()
        for _ in range(self.n_readers):
            self._readers.put_nowait(self.projector.con.cursor())
        subs = await bus.serve_queries(QUERY_SERVICE, self._handlers())
        tasks = [asyncio.create_task(self._project_loop(), name="ledger-project")]
        if self.meter_enabled and self.tick is not None:
            tasks.append(asyncio.create_task(self._meter_loop(), name="ledger-meter"))
        self._ready.set()
        stopper = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception():
                    raise t.exception()  # type: ignore[misc]
        finally:
            stopper.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
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
                    if self.caught_up and (self._comp_due or self.projector.state.meter_changed):
                        self._meter_kick.set()
            except NewerEventError as exc:
                self.halted = str(exc)
                log.error("ledger halted: %s (upgrade the ledger; it retries every 30 s)", exc)
                await reader.close()
                await asyncio.sleep(30)
            finally:
                await reader.close()

    async def _apply(self, raw: list) -> None:
        assert self.projector is not None and self.pipeline is not None
        async with self._lock:
            isolated = self.pipeline.isolated
            try:
                await self.pipeline.feed(raw)
            finally:
                if self.projector.state.late_usage or self.pipeline.isolated != isolated:
                    # An isolated batch was committed in parts: ask the meter to look again.
                    self._comp_due = True
                    self._meter_kick.set()
            self.halted = None

    async def _notify_written(self) -> None:
        async with self._written:
            self._written.notify_all()

    async def _park(self, failure: Failed) -> None:
        """An event the projection cannot apply: on the dead-letter stream with why, before the
        checkpoint moves past it."""
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

    # ------------------------------------------------------------ meter and compensations

    async def _meter_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._meter_kick.wait(), timeout=self.meter_every_s)
            except asyncio.TimeoutError:
                pass
            self._meter_kick.clear()
            if not self.caught_up:
                continue
            try:
                await self.meter_once()
                await self.compensate()
            except Exception:
                log.exception("metering failed; retrying at the next tick")

    async def meter_once(self, now: datetime | None = None) -> int:
        """Publish every usage interval due by `now` (default: the clock); returns how many."""
        assert self.bus is not None and self.projector is not None and self.config is not None
        if self.tick is None:
            return 0
        async with self._meter_lock:
            state = self.projector.state
            forget_applied(state, self.overlay)
            items = due_usage(state, now or self.clock.now(), self.tick, self.config, self.overlay)
            if not items:
                return 0
            envs = [self.bus.envelope(ev, id=eid) for eid, ev in items]
            try:
                await self.bus.publish_many(envs)
            except BaseException:
                self.overlay.clear()  # the log is the truth: the next pass derives the same ids
                raise
            return len(envs)

    async def compensate(self) -> int:
        """Record a CompensationRecorded for each late usage row that has none yet."""
        assert self.bus is not None
        # One pass at a time (the meter loop and a caller may both ask): a caller that finds the
        # work taken waits until those compensations are published, so "0 due" means "stored".
        async with self._comp_lock:
            if not self._comp_due:
                return 0
            self._comp_due = False
            if self.pipeline is not None and self.pipeline.pending is not None:
                await asyncio.gather(self.pipeline.pending, return_exceptions=True)
            items = await self._read(lambda cur: settlement.pending_compensations(cur, self._comp_sent))
            if items:
                await self.bus.publish_many([self.bus.envelope(ev, id=eid) for eid, ev in items])
                self._comp_sent.update(ev.usage_event_id for _, ev in items)
            return len(items)

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

        async def settle(params: dict[str, Any]) -> Any:
            return await self.settle(str(params.get("period") or ""))

        async def audit(params: dict[str, Any]) -> Any:
            return await self.audit(params.get("keep"))

        return {
            "cost_report": read(queries.cost_report),
            "settlements": read(lambda cur, p: queries.settlements(cur)),
            "position": position,
            "settle": settle,
            "audit": audit,
        }

    # ------------------------------------------------------------ settlement and audit

    async def settle(self, period: str) -> dict[str, Any]:
        """Close `period` at the current position of the projection (see settlement.py)."""
        assert self.bus is not None and self.projector is not None
        async with self._settle_lock:
            now = self.clock.now()
            settlement.check_can_settle(period, now, self.projector.state.settled)
            await self.wait_caught_up()
            through = self.projector.written_seq
            settled = set(self.projector.state.settled)
            ev = await self._read(lambda cur: settlement.build_settlement(cur, period, through, settled, now))
            env = self.bus.envelope(ev)
            subject = naming.event_subject(self.bus.stage, "ledger", period, ev.EVENT_NAME)
            try:
                ack = await self.bus.publish(env, expected_last_seq=0, occ_subject=subject)
            except ConcurrencyConflict:
                raise ValueError(f"period {period} is already settled") from None
            await self.wait_written(ack.seq)
            from .showback import micros_to_dollars

            return {
                "period": period, "event_id": env.id, "seq": ack.seq, "through_seq": through,
                "settled_at": queries.iso(now),
                "teams": {t: {"cost_micros": c, "cost_usd": str(micros_to_dollars(c)),
                              "billing_seconds": ev.billing_seconds.get(t, 0)}
                          for t, c in ev.totals_micros.items()},
                "total_micros": sum(ev.totals_micros.values()),
                "total_usd": str(micros_to_dollars(sum(ev.totals_micros.values()))),
            }

    async def audit(self, keep: str | None = None) -> dict[str, Any]:
        """Replay the log into a fresh file and compare it with the live tables, table by table.

        The replay runs up to the live position while the ledger goes on; then the ledger pauses
        (queries still answer) while the replay catches up with it and the files are compared.
        """
        assert self.bus is not None and self.projector is not None
        path = Path(keep) if keep else self.path.with_name(self.path.stem + ".audit.duckdb")
        for p in (path, Path(f"{path}.wal")):
            p.unlink(missing_ok=True)
        replay = await asyncio.to_thread(Projector, path)
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
                result = await self._read(lambda cur: compare_attached(cur, path))
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
    p = argparse.ArgumentParser(prog="python -m skypurza.services.ledger.service", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nats", required=True, help="NATS URL")
    p.add_argument("--stage", default=naming.DEFAULT_STAGE)
    p.add_argument("--db", type=Path, default=None, help="projections file (default: the stage's)")
    p.add_argument("--tick", type=float, default=None, help="metering tick in seconds (0: no metering)")
    p.add_argument("--batch", type=int, default=5000, help="events per pull request and commit")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        bus = await Bus.connect(args.nats, args.stage, source=f"/skypurza/{args.stage}/ledger")
        svc = LedgerService(args.db, args.tick, meter=args.tick != 0, batch=args.batch)
        try:
            await svc.run(bus, stop)
        finally:
            await bus.close()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
