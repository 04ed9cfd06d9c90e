"""The ledger's reducers: `apply(state, record)` for every event type, pure and in memory.

`LedgerState` holds the current rows of the ledger's small, mutable tables — its private copy
of clusters, nodes and placements (kept by the open reducers of events/projection/fleet.py, the
status service's too), the node runs it meters (`meters`), settlements and compensations — plus
what a batch changed: the keys it touched, the usage rows it appended (in log order, split
around settlements) and the event ids it applied. `store.py` turns that into one DuckDB
transaction with the checkpoint; nothing here does I/O, so the same events give the same rows
however they are batched.

Idempotent per event id (events/projection/state.py). A usage event of our meter is recognised
as a repeat from its node run's metering position (its id is derived from the run, rank and
interval start: `fleet.is_repeat`); usage from other writers is checked against the set of their
ids. No index is needed on the usage table, which keeps bulk inserts fast. Every event's rows
are checked against their columns as it is applied (the usage row too, `_check_usage_row`), so a
value no column holds fails at its event and the pipeline skips exactly that event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone
from typing import Any

from pydantic_core import TzInfo

from skypurza.events.models import (
    ClusterProvisioned, ClusterStarted, CompensationRecorded, PeriodSettled, SlurmAllocationAccounted, UsageRecorded,
)
from skypurza.events.projection.fleet import HANDLERS as FLEET_HANDLERS
from skypurza.events.projection.fleet import FleetState, advance_run, is_repeat, usage_times
from skypurza.events.projection.records import Record
from skypurza.events.projection.state import INT_RANGES, Fold, NewerEventError, compose, new_row, out_of_range, utc
from skypurza.events.projection.state import apply as apply_fold

from . import schema as sc
from .metering import instance_tres
from .showback import next_period
from .slurm_usage import allocation_billing, usage_event_id

__all__ = ["NewerEventError", "State", "apply"]

MUTABLE = (sc.CLUSTERS, sc.NODES, sc.PLACEMENTS, sc.METERS, sc.SETTLEMENTS, sc.SETTLEMENT_TOTALS,
           sc.COMPENSATIONS, sc.SLURM_ALLOCATIONS)

_USAGE_INTS = tuple((i, c, ty, *INT_RANGES[ty]) for i, (c, ty) in enumerate(sc.USAGE.columns) if ty in INT_RANGES)
_I32_LO, _I32_HI = INT_RANGES["INTEGER"]
_I64_LO, _I64_HI = INT_RANGES["BIGINT"]
_RANK, _PRICE, _COST, _BILLING = (sc.USAGE.column_names.index(c) for c in
                                  ("rank", "hourly_price_micros", "cost_micros", "billing_seconds"))


def _check_usage_row(row: tuple[Any, ...]) -> None:
    # The hot path of a replay: the integers the event brought, unrolled; the detail only on failure.
    if (_I32_LO <= row[_RANK] <= _I32_HI and _I64_LO <= row[_PRICE] <= _I64_HI
            and _I64_LO <= row[_COST] <= _I64_HI and _I64_LO <= row[_BILLING] <= _I64_HI):
        return
    for i, col, kind, lo, hi in _USAGE_INTS:
        v = row[i]
        if v is not None and not lo <= v <= hi:
            raise out_of_range("usage", col, kind, v)


_TRES_JSON: dict[tuple[tuple[str, int], ...], str] = {}


def tres_json(tres: dict[str, int]) -> str:
    key = tuple(tres.items())
    text = _TRES_JSON.get(key)
    if text is None:
        text = json.dumps(dict(sorted(tres.items())), separators=(",", ":"))
        if len(_TRES_JSON) < 10_000:
            _TRES_JSON[key] = text
    return text


class UsageColumns:
    """Usage rows of one batch as tuples in column order (turned into columns at snapshot)."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.append = self.rows.append

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def cols(self) -> dict[str, list[Any]]:
        columns = list(zip(*self.rows)) if self.rows else [()] * len(sc.USAGE.column_names)
        return {c: list(v) for c, v in zip(sc.USAGE.column_names, columns)}


@dataclass
class Rebook:
    """Usage booked in a period that has just been settled, after its through_seq, moves on."""

    period: str
    through_seq: int
    to_period: str


def _node_tres(ev: ClusterProvisioned) -> dict[str, int]:
    if ev.tres:
        return dict(ev.tres)
    c = ev.candidate
    if c.vcpus and c.memory_gib is not None:
        model, count = None, 0
        if c.accelerators:
            model, count = sorted(c.accelerators.items())[0]
        try:
            return instance_tres(c.vcpus, c.memory_gib, model, int(count))
        except ValueError:
            pass
    return {"node": 1}


class LedgerState(FleetState):
    MUTABLE = MUTABLE
    RUNS = sc.METERS

    def __init__(self) -> None:
        super().__init__()
        self.foreign_usage: set[str] = set()  # ids of usage not from our meter
        self.settled: dict[str, int] = {}  # period -> through_seq
        self.ops: list[UsageColumns | Rebook] = []
        self.late_usage = False  # the batch booked usage late or settled a period
        self.slurm_unbilled: dict[str, tuple[str, int]] = {}  # usage event id -> slurm_allocations key
        self.slurm_changed = False  # the batch accounted a Slurm allocation (the meter bills it)

    def run_extra(self, cluster: dict[str, Any], ev: ClusterProvisioned | ClusterStarted) -> dict[str, Any]:
        """What the meter needs of a run beyond its times and price: TRES and attribution."""
        if isinstance(ev, ClusterProvisioned):
            tres = tres_json(_node_tres(ev))
        else:  # a restart keeps the TRES of the runs before it
            tres = next(iter(m["tres"] for m in self.current_runs(cluster["name"])), tres_json({"node": 1}))
        return {"instance_type": cluster["instance_type"], "infra": cluster["infra"], "region": cluster["region"],
                "market": cluster["market"], "tres": tres, "user": cluster["user"] or "", "team": cluster["team"],
                "project": cluster["project"]}

    def current_meters(self, cluster: str) -> list[dict[str, Any]]:
        return self.current_runs(cluster)

    def usage_buffer(self) -> UsageColumns:
        if not self.ops or not isinstance(self.ops[-1], UsageColumns):
            self.ops.append(UsageColumns())
        return self.ops[-1]  # type: ignore[return-value]

    def index(self) -> None:
        super().index()
        self.settled = {p: row["through_seq"] for p, row in self.rows["settlements"].items()}
        self.slurm_unbilled = {row["usage_event_id"]: key for key, row in self.rows["slurm_allocations"].items()
                               if not row["billed"]}

    def start_batch(self) -> None:
        super().start_batch()
        self.ops = []
        self.late_usage = False
        self.slurm_changed = False

    @property
    def meter_changed(self) -> bool:
        """The batch stopped or started node runs (the meter looks again)."""
        return self.runs_changed or self.slurm_changed


State = LedgerState


# ---------------------------------------------------------------- usage


_PERIODS: dict[tuple[int, int], str] = {}


def _period(t: datetime) -> str:
    key = (t.year, t.month)
    p = _PERIODS.get(key)
    if p is None:
        p = _PERIODS[key] = f"{t.year:04d}-{t.month:02d}"
    return p


# The fixed zero-offset zones a decoded time carries: pydantic's (one shared object for every
# "Z" it parses) and the standard library's. A time in one of them is UTC without asking its
# zone (two `utcoffset` calls an event, ~1 µs of a replay's ~30; issue 21).
_UTC_ZONES = (TzInfo(0), timezone.utc)


def _usage(state: LedgerState, rec: Record, ev: UsageRecorded) -> None:
    start, end = ev.start, ev.end
    tz = start.tzinfo
    if (tz is not _UTC_ZONES[0] and tz is not _UTC_ZONES[1]) or end.tzinfo is not tz:
        if start.utcoffset() or end.utcoffset() or start.tzinfo is None or end.tzinfo is None:
            start, end = usage_times(ev)  # the hot path of a replay: only when not already UTC
    m = state.rows["meters"].get((ev.cluster, ev.rank, ev.lifetime_id)) if ev.lifetime_id else None
    if m is not None:
        if is_repeat(m, ev, end):
            return
    else:
        # Usage from another writer (no node run of ours): de-duplicated by id.
        if rec.id in state.foreign_usage:
            return
        state.foreign_usage.add(rec.id)
        slurm_key = state.slurm_unbilled.pop(rec.id, None)
        if slurm_key is not None:  # the meter's row that bills an accounted Slurm allocation
            state.rows["slurm_allocations"][slurm_key]["billed"] = True
            state.touch("slurm_allocations", slurm_key)
    period = _period(start)
    booked = period
    if period in state.settled:
        booked = open_period_after(period, state.settled)
        state.late_usage = True
    row = (
        rec.id, rec.seq, ev.cluster, ev.rank, ev.lifetime_id or None, ev.instance_id, start, end,
        ev.instance_type, ev.infra, ev.region, ev.zone, ev.market, ev.hourly_price_micros, ev.cost_micros,
        ev.billing_seconds, tres_json(ev.tres), ev.user, ev.team, ev.project, period, booked, ev.final,
        ev.correction)
    _check_usage_row(row)
    state.usage_buffer().append(row)
    if m is None:
        return
    advance_run(m, ev, start, end, rec.seq)
    state.touch("meters", (m["cluster"], m["rank"], m["lifetime_id"]))


def open_period_after(period: str, settled: dict[str, int] | set[str]) -> str:
    """The first period after `period` that is not settled (where late usage is booked)."""
    p = next_period(period)
    while p in settled:
        p = next_period(p)
    return p


# ---------------------------------------------------------------- Slurm accounting


def _slurm_accounted(state: LedgerState, rec: Record, ev: SlurmAllocationAccounted) -> None:
    key = (ev.cluster, ev.slurm_job_id)
    if state.get("slurm_allocations", key) is not None:
        return  # the first account of an allocation is the one that counts (a re-read is a copy)
    b = allocation_billing(ev)
    uid = usage_event_id(rec.id)
    state.put("slurm_allocations", key, new_row(
        sc.SLURM_ALLOCATIONS, cluster=ev.cluster, slurm_job_id=ev.slurm_job_id, slurm_cluster=ev.slurm_cluster,
        partition=ev.partition, state=ev.state, source=ev.source, alloc_tres=tres_json(dict(ev.alloc_tres)),
        elapsed_s=ev.elapsed_s, start_at=utc(ev.start), end_at=utc(ev.end), billing_weights=ev.billing_weights,
        priority_flags=ev.priority_flags, billing_int=b.billing_int, slurm_billing=ev.slurm_billing,
        billing_seconds=b.billing_seconds, error=b.error or None, usage_event_id=uid, billed=uid in state.foreign_usage,
        event_id=rec.id, seq=rec.seq))
    if uid not in state.foreign_usage:
        state.slurm_unbilled[uid] = key
    state.slurm_changed = True


# ---------------------------------------------------------------- settlement


def _period_settled(state: LedgerState, rec: Record, ev: PeriodSettled) -> None:
    if ev.period in state.settled:
        return  # the first settlement of a period is the one that counts
    state.settled[ev.period] = ev.through_seq
    state.put("settlements", ev.period, new_row(
        sc.SETTLEMENTS, period=ev.period, settled_at=utc(ev.settled_at), through_seq=ev.through_seq,
        event_id=rec.id, seq=rec.seq, total_micros=sum(ev.totals_micros.values()),
        billing_seconds=sum(ev.billing_seconds.values())))
    for team in sorted(set(ev.totals_micros) | set(ev.billing_seconds)):
        state.put("settlement_totals", (ev.period, team), new_row(
            sc.SETTLEMENT_TOTALS, period=ev.period, team=team, total_micros=ev.totals_micros.get(team, 0),
            billing_seconds=ev.billing_seconds.get(team, 0)))
    # Usage booked in the period after the settlement's position arrived too late for it.
    state.ops.append(Rebook(ev.period, ev.through_seq, open_period_after(ev.period, state.settled)))
    state.late_usage = True


def _compensation(state: LedgerState, rec: Record, ev: CompensationRecorded) -> None:
    if state.get("compensations", ev.usage_event_id) is not None:
        return
    state.put("compensations", ev.usage_event_id, new_row(
        sc.COMPENSATIONS, usage_event_id=ev.usage_event_id, period=ev.period, for_period=ev.for_period,
        team=ev.team, amount_micros=ev.amount_micros, event_id=rec.id, seq=rec.seq))


HANDLERS = compose(FLEET_HANDLERS, {
    "period_settled": _period_settled,
    "compensation_recorded": _compensation,
    "slurm_allocation_accounted": _slurm_accounted,
    # Everything else (jobs, managed jobs, attempts, requests) changes no table of the ledger;
    # each is still recorded as applied.
})
FOLD = Fold(HANDLERS, positional={"usage_recorded": _usage})


def apply(state: LedgerState, rec: Record) -> None:
    """Apply one record (in stream order; records at or below the checkpoint are ignored)."""
    apply_fold(state, rec, FOLD)
