"""Rebuild a projection from the log into a new file, and compare two projection files.

`replay_into` reads the log from the first event (up to a sequence or a time) through the same
reducers as the live service, so the same log gives the same tables and the same query answers.
`compare` and `audit` say, table by table, whether two files hold the same rows: row counts, an
order-independent content checksum, and a few rows found on one side only.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any

import duckdb

from .logreader import LogReader
from .pipeline import Projector, project
from .store import Projection, column_list


# A replay's batches are larger than a live projection's: each commit costs a fixed ~10 ms of
# DuckDB (statements, WAL sync), which at 5,000 events a batch was a third of the write's CPU.
REPLAY_BATCH = 20_000


async def replay_into(bus: Any, file: Path | str, projection: Projection, until_seq: int | None = None,
                      until_time: datetime | None = None, *, overwrite: bool = False,
                      batch: int = REPLAY_BATCH) -> dict[str, Any]:
    """Project the log (from its start) into a new DuckDB file; returns what was done."""
    path = Path(file)
    if path.exists():
        if not overwrite:
            raise FileExistsError(f"{path} exists; replay builds a new file (remove it or pick another name)")
        path.unlink()
        Path(f"{path}.wal").unlink(missing_ok=True)
    t0 = time.perf_counter()
    projector = await asyncio.to_thread(Projector, path, projection)
    try:
        # The new file is this replay's alone and only written: DuckDB's worker threads would
        # contend with the event loop (the critical path) for the cores and cost more CPU in
        # scheduling its bulk inserts than they save (a quarter of the writer's CPU, measured).
        projector.con.execute("SET threads TO 1")
        reader = LogReader(bus, start_seq=1, until_seq=until_seq, until_time=until_time, batch=batch,
                           reader=projection.name)
        await project(projector, reader.batches())
        last_seq, records = projector.state.last_seq, projector.state.records
    finally:
        await asyncio.to_thread(projector.close)
    seconds = time.perf_counter() - t0
    return {"file": str(path), "last_seq": last_seq, "records": records, "seconds": round(seconds, 3),
            "events_per_s": round(records / seconds) if seconds > 0 else None}


async def catch_up_into(bus: Any, projector: Projector, until_seq: int, *, batch: int = 5000) -> None:
    """Continue an open projection up to `until_seq` (used by the live audits)."""
    if until_seq > projector.state.last_seq:
        reader = LogReader(bus, start_seq=projector.state.last_seq + 1, until_seq=until_seq, batch=batch,
                           reader=projector.projection.name)
        await project(projector, reader.batches())


def compare(con: duckdb.DuckDBPyConnection, live: str, replay: str, projection: Projection, *,
            sample: int = 5) -> dict[str, Any]:
    """Compare every table of a projection in two attached catalogs (`live`, `replay`)."""
    tables = []
    ok = True
    for table in projection.tables:
        cols = column_list(table)
        stats = {}
        for side in (live, replay):
            n, checksum = con.execute(
                f'SELECT count(*), coalesce(sum(hash({cols})::HUGEINT), 0) FROM "{side}".main."{table.name}"'
            ).fetchall()[0]
            stats[side] = (int(n), str(checksum))
        entry: dict[str, Any] = {
            "table": table.name, "live_rows": stats[live][0], "replay_rows": stats[replay][0],
            "live_checksum": stats[live][1], "replay_checksum": stats[replay][1],
        }
        entry["equal"] = stats[live] == stats[replay]
        if not entry["equal"]:
            ok = False
            for name, a, b in (("only_live", live, replay), ("only_replay", replay, live)):
                res = con.execute(
                    f'SELECT * FROM (SELECT {cols} FROM "{a}".main."{table.name}" EXCEPT ALL '
                    f'SELECT {cols} FROM "{b}".main."{table.name}") ORDER BY {table.order_by} LIMIT {sample}')
                names = [d[0] for d in res.description]
                entry[name] = [{k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in zip(names, row)}
                               for row in res.fetchall()]
        tables.append(entry)
    return {"ok": ok, "tables": tables,
            "differing": [t["table"] for t in tables if not t["equal"]]}


def audit(live_file: Path | str, replay_file: Path | str, projection: Projection, *,
          sample: int = 5) -> dict[str, Any]:
    """Compare two projection files that no process is writing (e.g. a stopped service's file)."""
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{quote(live_file)}' AS live (READ_ONLY)")
        con.execute(f"ATTACH '{quote(replay_file)}' AS replay (READ_ONLY)")
        out = compare(con, "live", "replay", projection, sample=sample)
    finally:
        con.close()
    out["live_file"], out["replay_file"] = str(live_file), str(replay_file)
    return out


def compare_attached(cur: Any, replay_path: Path, projection: Projection) -> dict[str, Any]:
    """Compare the live file a cursor is on with a replay file (attached read-only for the call)."""
    live = cur.execute("SELECT current_database()").fetchall()[0][0]
    alias = f"{projection.name}_audit_replay"
    cur.execute(f"ATTACH '{quote(replay_path)}' AS {alias} (READ_ONLY)")
    try:
        return compare(cur, live, alias, projection)
    finally:
        cur.execute(f"DETACH {alias}")


async def audit_live(bus: Any, *, live_path: Path, projection: Projection, projector: Any, pipeline: Any,
                     lock: asyncio.Lock, read: Callable[[Callable[[Any], Any]], Awaitable[Any]],
                     open_replay: Callable[[Path], Any], keep: str | None = None) -> dict[str, Any]:
    """Replay the log into a fresh file and compare it with a live projection, table by table.

    The replay runs up to the live position while the projection goes on; then the projection
    pauses (holding `lock`; queries still answer) while the replay catches up with it and the files
    are compared. The one audit routine of every projection (status, ledger)."""
    path = Path(keep) if keep else live_path.with_name(live_path.stem + ".audit.duckdb")
    for f in (path, Path(f"{path}.wal")):
        f.unlink(missing_ok=True)
    replay = await asyncio.to_thread(open_replay, path)
    closed = False
    try:
        await catch_up_into(bus, replay, projector.written_seq)
        async with lock:
            await pipeline.flush()
            through = projector.written_seq
            await catch_up_into(bus, replay, through)
            await asyncio.to_thread(replay.close)
            closed = True
            result = await read(lambda cur: compare_attached(cur, path, projection))
    finally:
        if not closed:
            replay.close()
        if not keep:
            for f in (path, Path(f"{path}.wal")):
                f.unlink(missing_ok=True)
    result["through_seq"] = through
    result["live_file"] = str(live_path)
    if keep:
        result["replay_file"] = str(path)
    return result


def quote(path: Path | str) -> str:
    return str(path).replace("'", "''")
