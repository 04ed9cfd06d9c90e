"""The in-memory side of a projection: current rows, what a batch changed, and `apply`.

A `State` holds the current rows of a projection's small, mutable tables plus what the current
batch changed: the keys it touched, the event ids it applied, the records it skipped. `store.py`
turns that into one DuckDB transaction with the checkpoint; nothing here does I/O, so the same
events give the same rows however they are batched.

`apply` is idempotent per event id: a control event whose id was applied before is ignored (the
ids live in `applied_events`). A reducer listed as *positional* in the `Fold` is idempotent by
itself (the ledger's usage: a repeat is recognised from its node run's metering position) and
its events are not listed. Every event's rows are checked against their columns as it is
applied (`check_touched`): event models are lenient, so an event can carry an integer no column
holds (an autostop of 10**20 minutes). It raises OverflowError *at that event*, whatever the
batching — a later event of the same batch cannot hide it by overwriting the row — so the
pipeline skips exactly that event, in a live batch as in a replay (pipeline.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from .records import Record
from .tables import Table


class NewerEventError(Exception):
    """An event of a known type in a version newer than this code: stop, do not skip it."""


INT_RANGES = {"INTEGER": (-(2**31), 2**31 - 1), "BIGINT": (-(2**63), 2**63 - 1)}


def out_of_range(where: str, column: str, kind: str, value: Any) -> OverflowError:
    return OverflowError(f"{where}.{column} = {value} does not fit its {kind} column")


def utc(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def new_row(table: Table, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(table.column_names)
    row.update(values)
    return row


class State:
    """Rows of `MUTABLE` by table name and key, and what the current batch changed.

    Subclasses name their tables (`MUTABLE`) and keep indexes over the rows in `on_put`,
    `on_touch`, `on_delete` and `index` (rebuilt after loading from the file)."""

    MUTABLE: ClassVar[tuple[Table, ...]] = ()
    _int_columns: ClassVar[dict[str, tuple[tuple[str, str, int, int], ...]]] = {}

    def __init__(self) -> None:
        self.rows: dict[str, dict[Any, dict[str, Any]]] = {t.name: {} for t in self.MUTABLE}
        self.applied: set[str] = set()
        self.last_seq = 0
        self.records = 0  # records at or below last_seq that were read (applied or not)
        self.dirty: dict[str, set[Any]] = {t.name: set() for t in self.MUTABLE}
        self.new_applied: list[tuple[str, int, str]] = []
        self.new_skipped: list[tuple[int, str, str, str, str]] = []
        self.touched: list[tuple[str, Any]] = []  # rows the current event wrote

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls._int_columns = {t.name: tuple((c, ty, *INT_RANGES[ty]) for c, ty in t.columns if ty in INT_RANGES)
                            for t in cls.MUTABLE}

    # ------------------------------------------------------------ rows

    def get(self, table: str, key: Any) -> dict[str, Any] | None:
        return self.rows[table].get(key)

    def put(self, table: str, key: Any, row: dict[str, Any]) -> dict[str, Any]:
        self.rows[table][key] = row
        self.dirty[table].add(key)
        self.touched.append((table, key))
        self.on_put(table, key, row)
        return row

    def touch(self, table: str, key: Any) -> None:
        self.dirty[table].add(key)
        self.touched.append((table, key))
        self.on_touch(table, key)

    def delete(self, table: str, key: Any) -> None:
        if self.rows[table].pop(key, None) is not None:
            self.dirty[table].add(key)
            self.on_delete(table, key)

    # ------------------------------------------------------------ indexes (subclasses)

    def on_put(self, table: str, key: Any, row: dict[str, Any]) -> None:
        pass

    def on_touch(self, table: str, key: Any) -> None:
        pass

    def on_delete(self, table: str, key: Any) -> None:
        pass

    def index(self) -> None:
        """Rebuild the indexes after loading rows from the database."""

    def start_batch(self) -> None:
        for s in self.dirty.values():
            s.clear()
        self.new_applied = []
        self.new_skipped = []
        self.touched = []

    def check_touched(self) -> None:
        """The integers of the rows the current event wrote fit their columns (else OverflowError)."""
        for table, key in self.touched:
            row = self.rows[table].get(key)
            if row is None:
                continue
            for col, kind, lo, hi in self._int_columns[table]:
                v = row[col]
                if v is not None and not lo <= v <= hi:
                    raise out_of_range(table, col, kind, v)


Reducer = Callable[[Any, Record, Any], None]  # (state, record, event)


@dataclass(frozen=True)
class Fold:
    """What a projection does with each event name: its reducers, in order; `positional` ones
    are idempotent by themselves and their events are not recorded in `applied_events`."""

    handlers: Mapping[str, tuple[Reducer, ...]]
    positional: Mapping[str, Reducer] = field(default_factory=dict)


def compose(*groups: Mapping[str, Reducer]) -> dict[str, tuple[Reducer, ...]]:
    """One tuple of reducers per event name, the groups' in the order given."""
    out: dict[str, tuple[Reducer, ...]] = {}
    for group in groups:
        for name, reducer in group.items():
            out[name] = (*out.get(name, ()), reducer)
    return out


def apply(state: State, rec: Record, fold: Fold) -> None:
    """Apply one record (in stream order; records at or below the checkpoint are ignored)."""
    if rec.seq <= state.last_seq:
        return
    if rec.status == "newer":
        raise NewerEventError(f"seq {rec.seq}: {rec.reason}")
    state.last_seq = rec.seq
    state.records += 1
    if rec.status != "ok" or rec.event is None:
        state.new_skipped.append((rec.seq, rec.id, rec.type, rec.status, rec.reason[:500]))
        return
    positional = fold.positional.get(rec.name)
    if positional is not None:
        positional(state, rec, rec.event)
        return
    if rec.id in state.applied:
        return
    state.applied.add(rec.id)
    state.new_applied.append((rec.id, rec.seq, rec.name))
    reducers = fold.handlers.get(rec.name)
    if reducers:
        state.touched.clear()
        for reducer in reducers:
            reducer(state, rec, rec.event)
        if state.touched:
            state.check_touched()
