"""Helpers for tests of the node agent: a local cluster of real agent processes, and waiting on
its events and output.

`provision()` does what the provisioner does for a placement on `local`: the LocalAdapter
spawns one agent per node (reading from the stream position before the launch), then
ClusterProvisioned is published with the nodes.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.envelope import utcnow
from skypurza.events.models import Candidate, ClusterProvisioned, NodeInfo
from skypurza.services.provisioner.adapter import ClusterRef, LaunchSpec
from skypurza.services.provisioner.local import LocalAdapter

TERMINAL = ("job_succeeded", "job_failed", "job_cancelled")


async def provision(bus: Bus, adapter: LocalAdapter, cluster: str, num_nodes: int = 1, *,
                    idle_minutes: int | None = None, down: bool = False, token: str | None = None,
                    candidate: Candidate | None = None) -> list[NodeInfo]:
    start_seq = await bus.last_seq() + 1
    nodes = await adapter.launch(LaunchSpec(stage=bus.stage, cluster=cluster, launch_token=token or f"tok-{cluster}",
                                            instance_type="local", region="local", num_nodes=num_nodes, infra="local",
                                            labels={"start_seq": str(start_seq)}))
    event_nodes = [NodeInfo(rank=n.rank or 0, instance_id=n.instance_id, private_ip=n.private_ip) for n in nodes]
    await bus.publish(ClusterProvisioned(
        cluster=cluster, task_id=f"task-{cluster}", placement_id=f"p-{cluster}",
        candidate=candidate or Candidate(infra="local", num_nodes=num_nodes), nodes=event_nodes,
        hourly_price_micros=0, launched_at=utcnow(), idle_minutes=idle_minutes, down_when_idle=down,
        down_after_job=down))
    return event_nodes


async def terminate(adapter: LocalAdapter, cluster: str) -> list[str]:
    return await adapter.terminate(ClusterRef(stage=adapter.stage, cluster=cluster, infra="local"))


async def events(bus: Bus, cluster: str) -> list[Stored]:
    return [s async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "cluster", cluster))]


async def wait_events(bus: Bus, cluster: str, pred: Callable[[list[Any]], bool], timeout: float = 20.0) -> list[Any]:
    """Poll the cluster's events until `pred(list of events)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        evs = [s.event for s in await events(bus, cluster) if s.event is not None]
        if pred(evs):
            return evs
        if time.monotonic() > deadline:
            names = [(e.EVENT_NAME, getattr(e, "job_id", None)) for e in evs]
            raise AssertionError(f"timed out; events of {cluster}: {names}")
        await asyncio.sleep(0.1)


async def job_end(bus: Bus, cluster: str, job_id: int, timeout: float = 20.0) -> Any:
    evs = await wait_events(bus, cluster, lambda evs: any(
        e.EVENT_NAME in TERMINAL and e.job_id == job_id for e in evs), timeout)
    return next(e for e in evs if e.EVENT_NAME in TERMINAL and e.job_id == job_id)


def of(evs: list[Any], name: str, job_id: int | None = None) -> list[Any]:
    return [e for e in evs if e.EVENT_NAME == name and (job_id is None or getattr(e, "job_id", None) == job_id)]


async def job_lines(bus: Bus, cluster: str, job_id: int) -> list[dict[str, Any]]:
    out = []
    async for msg in bus.replay_raw(stream=bus.logs_stream,
                                    filter_subject=naming.logs_subject_filter(bus.stage, cluster, job_id)):
        out.append(json.loads(msg.data))
    return out


def rank_lines(lines: list[dict[str, Any]], rank: int, stream: str = "run") -> list[str]:
    return [x["line"] for x in lines if x["rank"] == rank and x["stream"] == stream]


async def wait_lines(bus: Bus, cluster: str, job_id: int, pred: Callable[[list[dict[str, Any]]], bool],
                     timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        lines = await job_lines(bus, cluster, job_id)
        if pred(lines):
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; lines: {[x['line'] for x in lines][-20:]}")
        await asyncio.sleep(0.1)


def parse_env_dump(lines: list[str]) -> dict[str, str]:
    """`env -0`-like dumps are awkward in line logs: the scripts print `NAME=<json value>`."""
    out = {}
    for line in lines:
        if line.startswith("ENV ") and "=" in line:
            name, _, value = line[4:].partition("=")
            out[name] = json.loads(value)
    return out


# Prints every SKYPILOT_*/SKYPURZA_* variable and a few others as `ENV NAME=<json>` (a secret as its hash).
ENV_DUMP = (
    "python3 - <<'PY'\n"
    "import hashlib, json, os\n"
    "for k in sorted(os.environ):\n"
    "    if k.startswith(('SKYPILOT_', 'SKYPURZA_')) or k in ('MY_ENV', 'HOME', 'PYTHONUNBUFFERED'):\n"
    "        print('ENV ' + k + '=' + json.dumps(os.environ[k]))\n"
    "if 'MY_SECRET' in os.environ:\n"
    "    print('ENV MY_SECRET_SHA256=' + json.dumps(hashlib.sha256(os.environ['MY_SECRET'].encode()).hexdigest()))\n"
    "print('ENV CWD=' + json.dumps(os.getcwd()))\n"
    "PY"
)
