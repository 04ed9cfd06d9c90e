"""What a cluster's log says about its provisioning and its autostop, and a job's output as files:
`spz logs --provision`, `--autostop` and `--sync-down`, on the embedded bus (cli/clusterhistory.py)
and through the API server (services/api/routes_history.py) alike, so both print the same.

SkyPilot keeps provision.log and the autostop log on the cluster; here the event log is that
record. `event_line` is pure (one event -> one line); the rest reads the bus.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from . import naming
from .logchunks import ChunkFilter, format_line, parse_log

# The events of `--provision`: the task's placement and launch, the cluster coming up.
PROVISION_EVENTS = frozenset({"task_submitted", "placement_chosen", "capacity_error", "placement_failed",
                              "provision_failed", "cluster_provisioned", "node_ready", "start_requested",
                              "cluster_started"})
# The events of `--autostop`: the setting, the idle report, and what it made happen.
AUTOSTOP_EVENTS = frozenset({"autostop_set", "cluster_idle", "stop_requested", "down_requested", "cluster_stopped",
                             "cluster_terminated"})
HISTORIES = {"provision": PROVISION_EVENTS, "autostop": AUTOSTOP_EVENTS}
# A node's `--sync-down` file through the API server is cut after this many bytes (the logs
# stream keeps at most 2 GiB of every job's output together).
MAX_LOG_FILE_BYTES = 512 * 1024 * 1024
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


async def history_lines(bus: Any, cluster: str, kinds: frozenset[str] | set[str]) -> list[str]:
    """The cluster's events of `kinds`, and (for provisioning) those of the tasks that launched it,
    oldest first."""
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


def log_file_name(rank: int) -> str:
    """A node's file of `--sync-down` (as SkyPilot's, one per node)."""
    return f"rank-{rank}.log"


async def job_file_lines(bus: Any, cluster: str, job_id: int, rank: int | None = None) -> AsyncIterator[tuple[int, str]]:
    """(rank, line) of a job's output as its `--sync-down` files hold it (setup lines marked
    `(setup)`), each chunk once, in order; `rank`: that node's only."""
    subject = (naming.logs_subject_filter(bus.stage, cluster, job_id) if rank is None
               else naming.log_subject(bus.stage, cluster, job_id, rank))
    chunks = ChunkFilter()
    async for msg in bus.replay_raw(stream=bus.logs_stream, filter_subject=subject):
        line = parse_log(msg)
        if chunks.fresh(line) and (rank is None or line.rank == rank):
            yield line.rank, format_line(line, 1)
