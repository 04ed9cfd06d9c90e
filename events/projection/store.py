"""The DuckDB side of a projection: open a file, load the state, write one batch atomically.

A batch is written as one transaction: upserts of the mutable rows it touched, whatever else the
projection appends (`Projection.write_ops`: the ledger's usage rows), the event ids it applied,
the records it skipped, and the checkpoint (last stream sequence). A crash anywhere leaves the
file at the previous batch, and the next run starts after that checkpoint. Writes are bulk: one
INSERT per table per batch, never one per row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from . import tables as tb
from .state import Fold, State

_ARROW = {"VARCHAR": pa.string(), "INTEGER": pa.int32(), "BIGINT": pa.int64(), "BOOLEAN": pa.bool_(),
          "TIMESTAMP": pa.timestamp("us")}
_SCHEMAS: dict[tuple[str, tuple[tuple[str, str], ...]], pa.Schema] = {}


def arrow_schema(table: tb.Table) -> pa.Schema:
    k = (table.name, table.columns)
    s = _SCHEMAS.get(k)
    if s is None:
        s = pa.schema([(c, _ARROW[t]) for c, t in table.columns])
        _SCHEMAS[k] = s
    return s


def key_of(table: tb.Table, row: dict[str, Any]) -> Any:
    if len(table.key) == 1:
        return row[table.key[0]]
    return tuple(row[k] for k in table.key)


@dataclass
class Changes:
    """One batch, ready to write (Arrow tables: immutable, safe to hand to a worker thread)."""

    last_seq: int
    records: int
    upserts: list[tuple[tb.Table, pa.Table]] = field(default_factory=list)
    deletes: list[tuple[tb.Table, pa.Table]] = field(default_factory=list)
    ops: list[Any] = field(default_factory=list)  # the projection's own (Projection.write_ops)
    applied: pa.Table | None = None
    skipped: pa.Table | None = None
    usage_rows: int = 0


Connection = duckdb.DuckDBPyConnection


@dataclass(frozen=True)
class Projection:
    """One kind of projection file: its checkpoint name, tables, state and reducers."""

    name: str  # its row in `checkpoint`
    version: int  # schema_version
    tables: tuple[tb.Table, ...]  # every table of the file, `checkpoint`, `applied_events`, `skipped` included
    new_state: Callable[[], State]
    fold: Fold
    rebuild_hint: str  # what to do with a file of another schema version
    load_extra: Callable[[Connection, State], None] | None = None
    snapshot_ops: Callable[[State, Changes], None] | None = None
    write_ops: Callable[[Connection, Changes], None] | None = None


def connect(path: Path | str, projection: Projection, *, read_only: bool = False) -> Connection:
    """Open (and on first use create) a projection file."""
    if not read_only:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path), read_only=read_only)
    if not read_only:
        con.execute("BEGIN")
        tb.create_all(con, projection.tables)
        con.execute(
            "INSERT INTO checkpoint SELECT ?, 0, 0, ? WHERE NOT EXISTS (SELECT 1 FROM checkpoint WHERE projection = ?)",
            [projection.name, projection.version, projection.name])
        con.execute("COMMIT")
        version = con.execute("SELECT schema_version FROM checkpoint WHERE projection = ?",
                              [projection.name]).fetchall()[0]
        if version and version[0] != projection.version:
            con.close()
            raise RuntimeError(f"{path} has projection schema v{version[0]}, this {projection.name} writes "
                               f"v{projection.version}: {projection.rebuild_hint}")
    return con


def rows_of(con: Connection, table: tb.Table) -> list[dict[str, Any]]:
    rows = con.sql(f'SELECT * FROM "{table.name}"').to_arrow_table().to_pylist()
    ts_cols = [c for c, t in table.columns if t == "TIMESTAMP"]
    for row in rows:
        for c in ts_cols:
            v = row[c]
            if v is not None:
                row[c] = v.replace(tzinfo=UTC)
    return rows


def load_state(con: Connection, projection: Projection) -> State:
    state = projection.new_state()
    for t in state.MUTABLE:
        bucket = state.rows[t.name]
        for row in rows_of(con, t):
            bucket[key_of(t, row)] = row
    state.applied = {r[0] for r in con.execute("SELECT event_id FROM applied_events").fetchall()}
    if projection.load_extra is not None:
        projection.load_extra(con, state)
    cp = con.execute("SELECT last_seq, records FROM checkpoint WHERE projection = ?", [projection.name]).fetchall()[0]
    if cp:
        state.last_seq, state.records = int(cp[0]), int(cp[1])
    state.index()
    return state


def snapshot(state: State, projection: Projection) -> Changes:
    """What the current batch changed, as Arrow tables (call before the next batch starts)."""
    ch = Changes(last_seq=state.last_seq, records=state.records)
    for t in state.MUTABLE:
        keys = state.dirty[t.name]
        if not keys:
            continue
        bucket = state.rows[t.name]
        present = [bucket[k] for k in keys if k in bucket]
        # Every touched key is deleted, then the rows that still exist are inserted again.
        cols = {k: [g if len(t.key) == 1 else g[i] for g in keys] for i, k in enumerate(t.key)}
        ks = pa.schema([arrow_schema(t).field(k) for k in t.key])
        ch.deletes.append((t, pa.Table.from_pydict(cols, schema=ks)))
        if present:
            ch.upserts.append((t, pa.Table.from_pylist(present, schema=arrow_schema(t))))
    if projection.snapshot_ops is not None:
        projection.snapshot_ops(state, ch)
    if state.new_applied:
        ids, seqs, types = zip(*state.new_applied)
        ch.applied = pa.Table.from_pydict({"event_id": list(ids), "seq": list(seqs), "type": list(types)},
                                          schema=arrow_schema(tb.APPLIED))
    if state.new_skipped:
        cols = list(zip(*state.new_skipped))
        ch.skipped = pa.Table.from_pydict({c: list(v) for c, v in zip(tb.SKIPPED.column_names, cols)},
                                          schema=arrow_schema(tb.SKIPPED))
    return ch


def column_list(table: tb.Table) -> str:
    return ", ".join(f'"{c}"' for c in table.column_names)


def insert_arrow(con: Connection, table: tb.Table, rows: pa.Table, view: str) -> None:
    con.register(view, rows)
    try:
        con.execute(f'INSERT INTO "{table.name}" ({column_list(table)}) SELECT {column_list(table)} FROM {view}')
    finally:
        con.unregister(view)


def write(con: Connection, ch: Changes, projection: Projection) -> None:
    """Write one batch and its checkpoint in one transaction (run it off the event loop)."""
    con.execute("BEGIN")
    try:
        n = 0
        for t, keys in ch.deletes:
            view = f"_del_{n}"
            n += 1
            con.register(view, keys)
            cond = " AND ".join(f't."{k}" = d."{k}"' for k in t.key)
            con.execute(f'DELETE FROM "{t.name}" t USING {view} d WHERE {cond}')
            con.unregister(view)
        for t, rows in ch.upserts:
            insert_arrow(con, t, rows, f"_up_{n}")
            n += 1
        if projection.write_ops is not None:
            projection.write_ops(con, ch)
        for t, rows in ((tb.APPLIED, ch.applied), (tb.SKIPPED, ch.skipped)):
            if rows is not None:
                insert_arrow(con, t, rows, f"_x_{n}")
                n += 1
        con.execute("UPDATE checkpoint SET last_seq = ?, records = ? WHERE projection = ?",
                    [ch.last_seq, ch.records, projection.name])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
