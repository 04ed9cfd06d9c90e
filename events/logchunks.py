"""A job's output as the logs stream stores it: one chunk per message, read the same by every reader.

The node agents publish chunks (events/bus.py `publish_log`); the CLI (`spz logs`, `spz jobs
logs`, cli/jobwatch.py) and the API server's log streams (services/api/routes_streams.py) read
them with `parse_log`, drop copies with `ChunkFilter` and prefix them with `format_line`, so a
job's output reads the same whichever way it is fetched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class LogLine:
    seq: int  # the logs stream's sequence
    ts: str
    rank: int
    stream: str
    line: str
    offset: int | None = None  # where the chunk starts in its phase's output file
    chunk_id: str | None = None  # its Nats-Msg-Id
    where: str = ""  # cluster and job
    end: str = "\n"  # how the chunk ended: a line, "\r" (a progress state) or "" (a partial line)


def parse_log(msg: Any) -> LogLine:
    try:
        body = json.loads(msg.data)
        if not isinstance(body, dict):
            raise ValueError("not an object")
    except ValueError:
        body = {"line": msg.data.decode(errors="replace")}
    offset = body.get("offset")
    chunk_id = body.get("id")
    try:
        rank = int(body.get("rank", 0) or 0)
    except (TypeError, ValueError):
        rank = 0
    end = body.get("end", "\n")
    return LogLine(msg.metadata.sequence.stream, str(body.get("ts", "")), rank,
                   str(body.get("stream", "stdout")), str(body.get("line", "")),
                   offset if isinstance(offset, int) and not isinstance(offset, bool) else None,
                   chunk_id if isinstance(chunk_id, str) else None,
                   f"{body.get('cluster', '')}/{body.get('job_id', '')}",
                   end if end in ("\n", "\r", "") else "\n")


class ChunkFilter:
    """Each chunk of output once, even when the logs stream holds a copy: JetStream drops a
    chunk sent again within the stream's duplicate window (by its Nats-Msg-Id); one sent later
    (an agent that came back after a long outage re-sends from the offset it had recorded) is
    dropped here. A phase's chunks are stored in the order of their offsets, so a chunk at or
    before the last offset printed for its (cluster, job, rank, phase) is a copy; notices
    without an offset are known by their id. Chunks from before chunks had ids always print."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int, str], int] = {}
        self._ids: set[str] = set()

    def fresh(self, line: LogLine) -> bool:
        if line.offset is not None:
            key = (line.where, line.rank, line.stream)
            last = self._last.get(key)
            if last is not None and line.offset <= last:
                return False
            self._last[key] = line.offset
            return True
        if line.chunk_id is not None:
            if line.chunk_id in self._ids:
                return False
            self._ids.add(line.chunk_id)
        return True


def format_line(line: LogLine, num_nodes: int, timestamps: bool = False) -> str:
    """SkyPilot-like prefixes: `(head, rank=0)` / `(worker1, rank=1)` for multi-node jobs,
    `(setup)` for setup output; agent notices as they are."""
    text = line.line
    if line.stream != "agent":
        who = ""
        if num_nodes > 1:
            who = "head, rank=0" if line.rank == 0 else f"worker{line.rank}, rank={line.rank}"
        if line.stream == "setup":
            who = f"setup, {who}" if who else "setup"
        if who:
            text = f"({who}) {text}"
    if timestamps and line.ts:
        text = f"{line.ts} {text}"
    return text
