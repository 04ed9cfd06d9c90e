"""Rebuild the ledger's file from the log, and compare two of its files (the shared code is
events/projection/replay.py; the status service's file is rebuilt and compared the same way)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from skypurza.events.projection import replay as pr
from skypurza.events.projection.pipeline import Projector

from .store import PROJECTION


async def replay_into(bus: Any, file: Path | str, until_seq: int | None = None,
                      until_time: datetime | None = None, *, overwrite: bool = False,
                      batch: int = pr.REPLAY_BATCH) -> dict[str, Any]:
    """Project the log (from its start) into a new ledger file; returns what was done."""
    return await pr.replay_into(bus, file, PROJECTION, until_seq, until_time, overwrite=overwrite, batch=batch)


async def catch_up_into(bus: Any, projector: Projector, until_seq: int, *, batch: int = 5000) -> None:
    await pr.catch_up_into(bus, projector, until_seq, batch=batch)


def compare(con: duckdb.DuckDBPyConnection, live: str, replay: str, *, sample: int = 5) -> dict[str, Any]:
    return pr.compare(con, live, replay, PROJECTION, sample=sample)


def compare_attached(cur: Any, replay_path: Path) -> dict[str, Any]:
    return pr.compare_attached(cur, replay_path, PROJECTION)


def audit(live_file: Path | str, replay_file: Path | str, *, sample: int = 5) -> dict[str, Any]:
    """Compare two ledger files that no process is writing (e.g. a stopped ledger's file)."""
    return pr.audit(live_file, replay_file, PROJECTION, sample=sample)
