"""The ledger service: the one writer of its accounting file, its queries, its meter.

It is a projection service (events/projection/service.py, the loop it shares with the status
service): its position in the log is the checkpoint in DuckDB, written in the same transaction as
the rows; it reads the log from checkpoint + 1, applies batches in memory, commits each batch with
its checkpoint off the event loop, and answers queries over NATS request-reply from read cursors (cost report, settlements, settle, audit, position; `spz status`
and `queue` are the status service's, services/status/). When it has caught up with the log it meters the running node
runs (UsageRecorded at each tick and at stop/termination) and records compensations for usage
that arrived after its period was settled.

It is the second declared shape (`LoopContract`, events/contract.py): `CONTRACT` says it reads
every event and may emit UsageRecorded, CompensationRecorded and PeriodSettled; `run` publishes
on a bus checked against it (`declared_bus`), so anything else raises UndeclaredEmit.

    python -m skypurza.services.ledger.service --nats URL --stage dev [--db FILE] [--tick S]
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import ConcurrencyConflict
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
from skypurza.events.projection.service import ProjectionService, service_main
from skypurza.events.contract import BusAccess
from skypurza.events.service import LoopContract

from . import queries, settlement
from .ledgerconfig import LedgerConfig, load_ledger_config
from .meter import Published, due_usage, forget_applied
from .pipeline import Projector

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
    bus=BusAccess(answers=QUERY_SERVICE),
)


class LedgerService(ProjectionService):
    contract = CONTRACT
    name = CONTRACT.name
    query_service = QUERY_SERVICE
    log = log

    def __init__(self, db_path: Path | None = None, tick_s: float | None = None, *,
                 clock: Clock | None = None, meter: bool = True, batch: int = 5000,
                 config: LedgerConfig | None = None, meter_every_s: float | None = None,
                 readers: int = 2):
        super().__init__(db_path, batch=batch, readers=readers)
        self.tick_s = tick_s
        self.clock = clock or SYSTEM_CLOCK  # what is due to meter, and when a period may settle
        self.meter_enabled = meter
        self.config = config
        self.meter_every_s = meter_every_s
        self.tick: timedelta | None = None
        self.overlay: dict[tuple[str, int, str], Published] = {}
        self._comp_sent: set[str] = set()
        self._comp_due = True
        self._comp_lock = asyncio.Lock()
        self._meter_kick = asyncio.Event()
        self._meter_lock = asyncio.Lock()
        self._settle_lock = asyncio.Lock()

    # ------------------------------------------------------------ the projection service's hooks

    def default_path(self, stage: str) -> Path:
        return naming.projections_file(stage)

    def open_projector(self, path: Path) -> Projector:
        return Projector(path)

    async def prepare(self) -> None:
        cfg = self.config or load_ledger_config()
        self.config = cfg
        tick_s = self.tick_s if self.tick_s is not None else cfg.tick_s
        self.tick = timedelta(seconds=tick_s) if tick_s and tick_s > 0 else None
        if self.meter_every_s is None:
            self.meter_every_s = min(tick_s, 10.0) if self.tick else 10.0

    def pipeline_guard(self) -> asyncio.Lock | None:
        return self._meter_lock

    def background(self) -> list[Any]:
        return [self._meter_loop()] if self.meter_enabled and self.tick is not None else []

    def after_batch(self) -> None:
        assert self.projector is not None
        if self.caught_up and (self._comp_due or self.projector.state.meter_changed):
            self._meter_kick.set()

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

    def query_handlers(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        async def settle(params: dict[str, Any]) -> Any:
            return await self.settle(str(params.get("period") or ""))

        return {"cost_report": self.reading(queries.cost_report),
                "spend_summary": self.reading(queries.spend_summary),
                "settlements": self.reading(lambda cur, p: queries.settlements(cur)),
                "settle": settle}

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

    # ------------------------------------------------------------ settlement

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


# ---------------------------------------------------------------- process entry point


def main(argv: list[str] | None = None) -> int:
    def add_args(p: Any) -> None:
        p.add_argument("--tick", type=float, default=None, help="metering tick in seconds (0: no metering)")

    return service_main(argv, prog="python -m skypurza.services.ledger.service", doc=__doc__, name="ledger",
                        build=lambda a: LedgerService(a.db, a.tick, meter=a.tick != 0, batch=a.batch),
                        add_args=add_args)


if __name__ == "__main__":
    sys.exit(main())
