"""A job's output written to files: `spz logs --sync-down` (and `spz jobs logs -s`); the
provisioning and autostop histories (`--provision`, `--autostop`) are read by
events/clusterhistory.py, which the API server shares (re-exported here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skypurza.events.clusterhistory import (  # noqa: F401  (moved there: the API server prints the same)
    AUTOSTOP_EVENTS,
    PROVISION_EVENTS,
    event_line,
    history_lines,
    job_file_lines,
    log_file_name,
)


def sky_logs_dir() -> Path:
    """Where `--sync-down` writes, as SkyPilot's ~/sky_logs."""
    return Path.home() / "sky_logs"


async def sync_down(bus: Any, cluster: str, job_id: int, dest: Path) -> list[Path]:
    """Write a job's output, one file per node (`rank-N.log`, setup lines marked `(setup)`), under
    `dest`; returns the files. Each line once, in order, as `spz logs` prints it."""
    by_rank: dict[int, list[str]] = {}
    async for rank, text in job_file_lines(bus, cluster, job_id):
        by_rank.setdefault(rank, []).append(text)
    dest.mkdir(parents=True, exist_ok=True)
    files = []
    for rank in sorted(by_rank):
        path = dest / log_file_name(rank)
        path.write_text("".join(text + "\n" for text in by_rank[rank]))
        files.append(path)
    return files
