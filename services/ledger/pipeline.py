"""From raw log messages to committed projection batches, with decoding and writing overlapped.

The event loop decodes and applies batch N+1 while a worker thread commits batch N (DuckDB
releases the GIL while it executes), one commit at a time and in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import duckdb

from . import store
from .decoding import decode_record
from .logreader import RawMsg
from .projector import NewerEventError, State, apply


class Projector:
    """One projections file, its in-memory state, and the one connection that writes it."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.con: duckdb.DuckDBPyConnection = store.connect(self.path)
        self.state: State = store.load_state(self.con)
        self.written_seq = self.state.last_seq

    def apply_raw(self, raw: list[RawMsg]) -> tuple[store.Changes, NewerEventError | None]:
        """Apply a batch in memory; return its changes (and the error that stopped it, if any)."""
        st = self.state
        st.start_batch()
        err = None
        last = st.last_seq
        for seq, _ts, data in raw:
            if seq <= last:
                continue
            try:
                apply(st, decode_record(data, seq))
            except NewerEventError as exc:
                err = exc
                break
        return store.snapshot(st), err

    def write(self, ch: store.Changes) -> None:
        store.write(self.con, ch)
        self.written_seq = ch.last_seq

    def close(self) -> None:
        self.con.close()


async def project(projector: Projector, batches: AsyncIterator[list[RawMsg]]) -> None:
    """Apply and commit every batch; raises NewerEventError after committing what precedes it."""
    pending: asyncio.Task | None = None
    try:
        async for raw in batches:
            if not raw:
                continue
            ch, err = projector.apply_raw(raw)
            if pending is not None:
                await pending
            pending = asyncio.create_task(asyncio.to_thread(projector.write, ch))
            if err is not None:
                await pending
                raise err
    finally:
        if pending is not None:
            await pending
