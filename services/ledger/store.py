"""The DuckDB side of the projection: open a file, load the state, write one batch atomically.

A batch is written as one transaction: upserts of the mutable rows it touched, the usage rows it
appended (bulk, through Arrow), the event ids it applied, and the checkpoint (last stream
sequence). A crash anywhere leaves the file at the previous batch, and the next run starts
after that checkpoint. Writes are bulk: one INSERT per table per batch, never one per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from . import schema as sc
from .projector import MUTABLE, Rebook, State, UsageColumns

_ARROW = {"VARCHAR": pa.string(), "INTEGER": pa.int32(), "BIGINT": pa.int64(), "BOOLEAN": pa.bool_(),
          "TIMESTAMP": pa.timestamp("us")}
_SCHEMAS: dict[str, pa.Schema] = {}


def arrow_schema(table: sc.Table) -> pa.Schema:
    s = _SCHEMAS.get(table.name)
    if s is None:
        s = pa.schema([(c, _ARROW[t]) for c, t in table.columns])
        _SCHEMAS[table.name] = s
    return s


def key_of(table: sc.Table, row: dict[str, Any]) -> Any:
    if len(table.key) == 1:
        return row[table.key[0]]
    return tuple(row[k] for k in table.key)


def connect(path: Path | str, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (and on first use create) a projections file."""
    if not read_only:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path), read_only=read_only)
    if not read_only:
        con.execute("BEGIN")
        sc.create_all(con)
        con.execute(
            "INSERT INTO checkpoint SELECT ?, 0, 0, ? WHERE NOT EXISTS (SELECT 1 FROM checkpoint WHERE projection = ?)",
            [sc.PROJECTION, sc.SCHEMA_VERSION, sc.PROJECTION])
        con.execute("COMMIT")
        version = con.execute("SELECT schema_version FROM checkpoint WHERE projection = ?", [sc.PROJECTION]).fetchall()[0]
        if version and version[0] != sc.SCHEMA_VERSION:
            con.close()
            raise RuntimeError(
                f"{path} has projection schema v{version[0]}, this ledger writes v{sc.SCHEMA_VERSION}: "
                f"rebuild it with `spz events replay --into NEWFILE` and swap the files")
    return con


def _rows(con: duckdb.DuckDBPyConnection, table: sc.Table) -> list[dict[str, Any]]:
    rows = con.sql(f'SELECT * FROM "{table.name}"').to_arrow_table().to_pylist()
    ts_cols = [c for c, t in table.columns if t == "TIMESTAMP"]
    for row in rows:
        for c in ts_cols:
            v = row[c]
            if v is not None:
                row[c] = v.replace(tzinfo=UTC)
    return rows


def load_state(con: duckdb.DuckDBPyConnection) -> State:
    state = State()
    for table in MUTABLE:
        bucket = state.rows[table.name]
        for row in _rows(con, table):
            bucket[key_of(table, row)] = row
    state.applied = {r[0] for r in con.execute("SELECT event_id FROM applied_events").fetchall()}
    state.foreign_usage = {r[0] for r in con.execute(
        "SELECT event_id FROM usage WHERE lifetime_id IS NULL OR lifetime_id NOT IN "
        "(SELECT DISTINCT lifetime_id FROM meters)").fetchall()}
    cp = con.execute("SELECT last_seq, records FROM checkpoint WHERE projection = ?", [sc.PROJECTION]).fetchall()[0]
    if cp:
        state.last_seq, state.records = int(cp[0]), int(cp[1])
    state.index()
    return state


@dataclass
class Changes:
    """One batch, ready to write (Arrow tables: immutable, safe to hand to a worker thread)."""

    last_seq: int
    records: int
    upserts: list[tuple[sc.Table, pa.Table]] = field(default_factory=list)
    deletes: list[tuple[sc.Table, pa.Table]] = field(default_factory=list)
    ops: list[pa.Table | Rebook] = field(default_factory=list)
    applied: pa.Table | None = None
    skipped: pa.Table | None = None
    usage_rows: int = 0


def snapshot(state: State) -> Changes:
    """What the current batch changed, as Arrow tables (call before the next batch starts)."""
    ch = Changes(last_seq=state.last_seq, records=state.records)
    for table in MUTABLE:
        keys = state.dirty[table.name]
        if not keys:
            continue
        bucket = state.rows[table.name]
        present = [bucket[k] for k in keys if k in bucket]
        # Every touched key is deleted, then the rows that still exist are inserted again.
        cols = {k: [g if len(table.key) == 1 else g[i] for g in keys] for i, k in enumerate(table.key)}
        ks = pa.schema([arrow_schema(table).field(k) for k in table.key])
        ch.deletes.append((table, pa.Table.from_pydict(cols, schema=ks)))
        if present:
            ch.upserts.append((table, pa.Table.from_pylist(present, schema=arrow_schema(table))))
    for op in state.ops:
        if isinstance(op, UsageColumns):
            if len(op):
                ch.ops.append(pa.Table.from_pydict(op.cols, schema=arrow_schema(sc.USAGE)))
                ch.usage_rows += len(op)
        else:
            ch.ops.append(op)
    if state.new_applied:
        ids, seqs, types = zip(*state.new_applied)
        ch.applied = pa.Table.from_pydict({"event_id": list(ids), "seq": list(seqs), "type": list(types)},
                                          schema=arrow_schema(sc.APPLIED))
    if state.new_skipped:
        cols = list(zip(*state.new_skipped))
        ch.skipped = pa.Table.from_pydict({c: list(v) for c, v in zip(sc.SKIPPED.column_names, cols)},
                                          schema=arrow_schema(sc.SKIPPED))
    return ch


def _cols(table: sc.Table) -> str:
    return ", ".join(f'"{c}"' for c in table.column_names)


def write(con: duckdb.DuckDBPyConnection, ch: Changes) -> None:
    """Write one batch and its checkpoint in one transaction (run it off the event loop)."""
    con.execute("BEGIN")
    try:
        n = 0
        for table, keys in ch.deletes:
            view = f"_del_{n}"
            n += 1
            con.register(view, keys)
            cond = " AND ".join(f't."{k}" = d."{k}"' for k in table.key)
            con.execute(f'DELETE FROM "{table.name}" t USING {view} d WHERE {cond}')
            con.unregister(view)
        for table, rows in ch.upserts:
            view = f"_up_{n}"
            n += 1
            con.register(view, rows)
            con.execute(f'INSERT INTO "{table.name}" ({_cols(table)}) SELECT {_cols(table)} FROM {view}')
            con.unregister(view)
        for op in ch.ops:
            if isinstance(op, Rebook):
                con.execute("UPDATE usage SET booked_period = ? WHERE booked_period = ? AND seq > ?",
                            [op.to_period, op.period, op.through_seq])
            else:
                view = f"_usage_{n}"
                n += 1
                con.register(view, op)
                con.execute(f"INSERT INTO usage ({_cols(sc.USAGE)}) SELECT {_cols(sc.USAGE)} FROM {view}")
                con.unregister(view)
        for table, rows in ((sc.APPLIED, ch.applied), (sc.SKIPPED, ch.skipped)):
            if rows is not None:
                view = f"_x_{n}"
                n += 1
                con.register(view, rows)
                con.execute(f'INSERT INTO "{table.name}" ({_cols(table)}) SELECT {_cols(table)} FROM {view}')
                con.unregister(view)
        con.execute("UPDATE checkpoint SET last_seq = ?, records = ? WHERE projection = ?",
                    [ch.last_seq, ch.records, sc.PROJECTION])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise

