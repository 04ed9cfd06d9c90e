"""The ledger's projection file: its `Projection` (events/projection/store.py) and what only the
ledger writes besides rows — usage appended in bulk through Arrow, and the re-booking of usage
that arrived after its period was settled — inside the same one transaction per batch as its
rows, applied ids and checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from skypurza.events.projection import store as ps
from skypurza.events.projection.store import Changes

from . import schema as sc
from .projector import FOLD, LedgerState, Rebook, UsageColumns

__all__ = ["Changes", "PROJECTION", "connect", "load_state", "snapshot", "write"]


def _load_extra(con: duckdb.DuckDBPyConnection, state: LedgerState) -> None:  # type: ignore[override]
    state.foreign_usage = {r[0] for r in con.execute(
        "SELECT event_id FROM usage WHERE lifetime_id IS NULL OR lifetime_id NOT IN "
        "(SELECT DISTINCT lifetime_id FROM meters)").fetchall()}


def _snapshot_ops(state: LedgerState, ch: Changes) -> None:  # type: ignore[override]
    for op in state.ops:
        if isinstance(op, UsageColumns):
            if len(op):
                ch.ops.append(pa.Table.from_pydict(op.cols, schema=ps.arrow_schema(sc.USAGE)))
                ch.usage_rows += len(op)
        else:
            ch.ops.append(op)


def _write_ops(con: duckdb.DuckDBPyConnection, ch: Changes) -> None:
    for n, op in enumerate(ch.ops):
        if isinstance(op, Rebook):
            con.execute("UPDATE usage SET booked_period = ? WHERE booked_period = ? AND seq > ?",
                        [op.to_period, op.period, op.through_seq])
        else:
            ps.insert_arrow(con, sc.USAGE, op, f"_usage_{n}")


PROJECTION = ps.Projection(
    name=sc.PROJECTION, version=sc.SCHEMA_VERSION, tables=sc.TABLES, new_state=LedgerState, fold=FOLD,
    rebuild_hint="rebuild it with `spz events replay --into NEWFILE` and swap the files",
    load_extra=_load_extra, snapshot_ops=_snapshot_ops, write_ops=_write_ops,  # type: ignore[arg-type]
)


def connect(path: Path | str, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (and on first use create) the ledger's file."""
    return ps.connect(path, PROJECTION, read_only=read_only)


def load_state(con: duckdb.DuckDBPyConnection) -> LedgerState:
    return ps.load_state(con, PROJECTION)  # type: ignore[return-value]


def snapshot(state: LedgerState) -> Changes:
    return ps.snapshot(state, PROJECTION)


def write(con: duckdb.DuckDBPyConnection, ch: Changes) -> None:
    ps.write(con, ch, PROJECTION)
