"""What a cluster's log says about its provisioning and its autostop, and a job's output written
to files: `spz logs --provision`, `--autostop` and `--sync-down` (and `spz jobs logs -s`).

SkyPilot keeps provision.log and the autostop log on the cluster; here the event log is that
record, so these read it. `event_line` is pure (one event -> one line); the rest reads the bus.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

# The events of `--provision`: the task's placement and launch, the cluster coming up.
PROVISION_EVENTS = {"task_submitted", "placement_chosen", "capacity_error", "placement_failed", "provision_failed",
                    "cluster_provisioned", "node_ready", "start_requested", "cluster_started"}
# The events of `--autostop`: the setting, the idle report, and what it made happen.
AUTOSTOP_EVENTS = {"autostop_set", "cluster_idle", "stop_requested", "down_requested", "cluster_stopped",
                   "cluster_terminated"}
_SKIP_FIELDS = {"task", "cluster", "task_id", "secrets_key", "tres", "nodes", "candidate", "attempts", "zones"}


def _short(value: Any) -> str:
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def event_line(event: Any, at: datetime) -> str:
    """`<time> <event>: key=value ...` with the event's short fields (the task and node lists left out)."""
    data = event.model_dump() if hasattr(event, "model_dump") else {}
    parts = []
    candidate = getattr(event, "candidate", None)
    if candidate is not None and hasattr(candidate, "label"):
        parts.append(candidate.label())
    nodes = getattr(event, "nodes", None)
    if nodes:
        parts.append(f"{len(nodes)} node(s)")
    for key, value in data.items():
        if key in _SKIP_FIELDS or value in (None, "", [], {}):
            continue
        parts.append(f"{key}={_short(value)}")
    return f"{at.isoformat(timespec='seconds')} {event.EVENT_NAME}" + (f": {' '.join(parts)}" if parts else "")


async def history_lines(bus: Any, cluster: str, kinds: set[str]) -> list[str]:
    """The cluster's events of `kinds`, and (for provisioning) those of the tasks that launched it,
    oldest first."""
    from skypurza.events import naming

    found: list[tuple[int, str]] = []
    task_ids: list[str] = []
    async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "cluster", cluster)):
        if s.event is None or s.envelope is None:
            continue
        name = s.event.EVENT_NAME
        if name == "cluster_provisioned" and s.event.task_id not in task_ids:
            task_ids.append(s.event.task_id)
        if name in kinds:
            found.append((s.seq, event_line(s.event, s.envelope.time)))
    if "task_submitted" in kinds:
        for task_id in task_ids:
            async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "task", task_id)):
                if s.event is not None and s.envelope is not None and s.event.EVENT_NAME in kinds:
                    found.append((s.seq, event_line(s.event, s.envelope.time)))
    return [line for _, line in sorted(found)]


def sky_logs_dir() -> Path:
    """Where `--sync-down` writes, as SkyPilot's ~/sky_logs."""
    return Path.home() / "sky_logs"


async def sync_down(bus: Any, cluster: str, job_id: int, dest: Path) -> list[Path]:
    """Write a job's output, one file per node (`rank-N.log`, setup lines marked `(setup)`), under
    `dest`; returns the files. Each line once, in order, as `spz logs` prints it."""
    from skypurza.events import naming

    from .jobwatch import ChunkFilter, format_line, parse_log

    chunks = ChunkFilter()
    by_rank: dict[int, list[str]] = {}
    async for msg in bus.replay_raw(stream=bus.logs_stream,
                                    filter_subject=naming.logs_subject_filter(bus.stage, cluster, job_id)):
        line = parse_log(msg)
        if chunks.fresh(line):
            by_rank.setdefault(line.rank, []).append(format_line(line, 1))
    dest.mkdir(parents=True, exist_ok=True)
    files = []
    for rank in sorted(by_rank):
        path = dest / f"rank-{rank}.log"
        path.write_text("".join(text + "\n" for text in by_rank[rank]))
        files.append(path)
    return files
