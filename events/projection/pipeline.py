"""From raw log messages to committed projection batches, with decoding and writing overlapped.

The event loop decodes and applies batch N+1 while a worker thread commits batch N (DuckDB
releases the GIL while it executes), one commit at a time and in order.

One bad event never stops the projection. When a batch fails — an event's reducer raises, or
its rows cannot be converted or written (a number too large for its column) — the state goes
back to what the file holds and the batch is applied again in halves, down to the one event
that fails on its own. That event is recorded in `skipped` (status `failed`, with the error),
handed to `on_failed` (a live projection parks it on the dead-letter stream), and the checkpoint
moves past it; every other event of the batch is committed as usual. An event is thus skipped
exactly when it cannot be applied on top of every event before it, which a replay decides the
same way. A failure that is not an event's (the file cannot be written at all) still raises:
even recording the skip fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from skypurza.events.deadletters import describe

from . import store
from .logreader import RawMsg
from .records import decode_record, salvage_id_and_type
from .state import NewerEventError, State, apply

SKIPPED_FAILED = "failed"  # `skipped.status` of an event whose application raised


@dataclass(frozen=True)
class Failed:
    """One event the projection could not apply."""

    seq: int
    payload: bytes
    error: str  # "OverflowError: Python int too large to convert to C long"
    error_type: str


OnFailed = Callable[[Failed], Awaitable[None]]


class Projector:
    """One projection file, its in-memory state, and the one connection that writes it."""

    def __init__(self, path: Path | str, projection: store.Projection):
        self.path = Path(path)
        self.projection = projection
        self.con: duckdb.DuckDBPyConnection = store.connect(self.path, projection)
        self.state: State = store.load_state(self.con, projection)
        self.written_seq = self.state.last_seq

    def apply_raw(self, raw: list[RawMsg]) -> tuple[store.Changes, NewerEventError | None]:
        """Apply a batch in memory; return its changes (and the error that stopped it, if any).
        Anything else an event raises leaves here, with the state half-changed: `reload` it."""
        st = self.state
        st.start_batch()
        err = None
        last = st.last_seq
        fold = self.projection.fold
        for seq, _ts, data in raw:
            if seq <= last:
                continue
            try:
                apply(st, decode_record(data, seq), fold)
            except NewerEventError as exc:
                err = exc
                break
        return store.snapshot(st, self.projection), err

    def committed_state(self) -> State:
        """The state as the file holds it (run off the event loop; assign it on the loop)."""
        return store.load_state(self.con, self.projection)

    def failed(self, seq: int, payload: bytes, exc: BaseException) -> tuple[store.Changes, Failed]:
        """The changes that record one event as failed (a `skipped` row) and move past it."""
        st = self.state
        st.start_batch()
        kind, text = describe(exc)
        event_id, type_name = salvage_id_and_type(payload)
        st.last_seq = seq
        st.records += 1
        st.new_skipped.append((seq, event_id, type_name, SKIPPED_FAILED, text[:500]))
        return store.snapshot(st, self.projection), Failed(seq, payload, text, kind)

    def write(self, ch: store.Changes) -> None:
        store.write(self.con, ch, self.projection)
        self.written_seq = ch.last_seq

    def close(self) -> None:
        self.con.close()


async def apply_isolating(projector: Projector, raw: list[RawMsg], write: Callable[[store.Changes], Awaitable[None]],
                          on_failed: OnFailed | None = None) -> NewerEventError | None:
    """Apply and commit `raw` on the committed state (nothing pending), skipping the events that
    fail on their own (see the module docstring). Returns the NewerEventError that stopped it."""

    async def attempt(part: list[RawMsg]) -> NewerEventError | None:
        try:
            ch, err = projector.apply_raw(part)
            await write(ch)
            return err
        except Exception as exc:
            projector.state = await asyncio.to_thread(projector.committed_state)
            todo = [m for m in part if m[0] > projector.state.last_seq]
            if len(todo) > 1:
                mid = len(todo) // 2
                return await attempt(todo[:mid]) or await attempt(todo[mid:])
            if not todo:
                raise  # nothing of this part is left to blame: not an event's failure
            ch, failure = projector.failed(todo[0][0], todo[0][2], exc)
            if on_failed is not None:
                await on_failed(failure)
            await write(ch)  # if even this fails, the file is the problem: raise
            return None

    return await attempt(raw)


class Pipeline:
    """Feeds batches to a projector: commit N overlaps the apply of N+1, failures are isolated.

    One caller at a time (a live projection holds its lock; a replay is one loop)."""

    def __init__(self, projector: Projector, *, on_written: Callable[[], Awaitable[None]] | None = None,
                 on_failed: OnFailed | None = None, guard: asyncio.Lock | None = None):
        self.projector = projector
        self.on_written = on_written
        self.on_failed = on_failed
        # Held from a failed apply until the state is reloaded: whoever else reads the state
        # (the ledger's meter) must not see a half-applied batch.
        self.guard = guard or asyncio.Lock()
        self.pending: asyncio.Task | None = None  # the commit in flight, if any
        self._pending_raw: list[RawMsg] = []
        self.isolated = 0  # batches that went through isolation

    async def _write(self, ch: store.Changes) -> None:
        await asyncio.to_thread(self.projector.write, ch)
        if self.on_written is not None:
            await self.on_written()

    async def feed(self, raw: list[RawMsg]) -> None:
        """Apply `raw` and start its commit. Raises NewerEventError once what precedes it is committed."""
        p = self.projector
        try:
            ch, err = p.apply_raw(raw)
        except Exception:
            async with self.guard:  # taken before anything else can run on the half-applied state
                err = await self._isolate(await self._settle() + raw)
        else:
            redo = await self._settle()
            if redo:  # the previous commit failed: redo it with this batch
                async with self.guard:
                    err = await self._isolate(redo + raw)
            else:
                self._pending_raw = raw
                self.pending = asyncio.create_task(self._write(ch))
        if err is not None:
            await self.flush()
            raise err

    async def flush(self) -> None:
        """Wait until everything fed is committed (a commit that failed is redone, isolated)."""
        redo = await self._settle()
        if redo:
            async with self.guard:
                err = await self._isolate(redo)
            if err is not None:
                raise err

    async def _settle(self) -> list[RawMsg]:
        """Wait for the commit in flight; the batch to do again if it failed."""
        pending, raw = self.pending, self._pending_raw
        self.pending, self._pending_raw = None, []
        if pending is None:
            return []
        try:
            await pending
        except Exception:
            return raw
        return []

    async def _isolate(self, raw: list[RawMsg]) -> NewerEventError | None:
        self.isolated += 1
        p = self.projector
        p.state = await asyncio.to_thread(p.committed_state)
        return await apply_isolating(p, raw, self._write, self.on_failed)


async def project(projector: Projector, batches: AsyncIterator[list[RawMsg]]) -> None:
    """Apply and commit every batch; raises NewerEventError after committing what precedes it."""
    pipeline = Pipeline(projector)
    try:
        async for raw in batches:
            if raw:
                await pipeline.feed(raw)
    finally:
        await pipeline.flush()
