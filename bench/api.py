"""API server benchmark: 50 concurrent clients over HTTP, beside the same through the embedded bus.

Starts, here: a nats-server (file storage, as the control plane runs it), the status service and
the API server as processes of their own (uvicorn), an admin with a token (the identity events),
and `--clusters` clusters known to the status service (each a TaskSubmitted, PlacementChosen and
ClusterProvisioned on the log). Then, in one run:

- `GET /api/v1/clusters` (every cluster: `all_users=true` as an admin): p50 and p99 latency with
  `--clients` concurrent clients (goal: p50 <= 25 ms with 1,000 clusters known), beside the status
  query the CLI makes on the embedded bus (events/status_queries.py), as many at once;
- task submissions per second: `POST /api/v1/tasks` by `--clients` concurrent clients (goal:
  >= 200/s), beside `bus.publish(TaskSubmitted)` as `spz launch` does on the embedded bus.

    python bench/api.py [--clusters 1000] [--clients 50] [--requests 1000] [--tasks 2000]

Nothing else runs (no optimizer): submissions are stored and folded, not placed. The figures are
this machine's; the goals are printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from skypurza.events import status_queries
from skypurza.events.bus import Bus
from skypurza.events.models import ClusterProvisioned, PlacementChosen, TaskSubmitted
from skypurza.events.natsserver import NatsServer, free_port
from skypurza.events.types import Candidate, NodeInfo

STAGE = "bench"
GOAL_P50_MS = 25.0
GOAL_SUBMITS_PER_S = 200.0
TASK = "name: bench\nrun: python train.py\nresources:\n  cpus: 2\n"


def _candidate() -> Candidate:
    return Candidate(infra="aws", region="us-east-1", zone="us-east-1a", instance_type="m6i.large",
                     accelerators=None, use_spot=False, vcpus=2, memory_gib=8, hourly_price_micros=96_000,
                     num_nodes=1)


async def seed_clusters(bus: Bus, n: int) -> int:
    """`n` clusters up, as the provisioner would have left them; returns the last sequence."""
    events = []
    for i in range(n):
        task_id, name = f"seed-{i}", f"c{i:05d}"
        events.append(bus.envelope(TaskSubmitted(task_id=task_id, cluster=name, task={"run": "true"},
                                                 user=f"u{i % 20}", team="ml")))
        placed = bus.envelope(PlacementChosen(task_id=task_id, cluster=name, attempt=1, candidate=_candidate(),
                                              num_nodes=1))
        events.append(placed)
        events.append(bus.envelope(ClusterProvisioned(
            cluster=name, task_id=task_id, placement_id=placed.id, candidate=_candidate(),
            nodes=[NodeInfo(rank=0, instance_id=f"i-{i:08x}", private_ip="10.0.0.1")],
            hourly_price_micros=96_000, launched_at=placed.time, user=f"u{i % 20}", team="ml")))
    for start in range(0, len(events), 3000):
        await bus.publish_many(events[start:start + 3000])
    return await bus.last_seq()


async def admin_token(bus: Bus) -> str:
    from skypurza.services.api.directory_io import add_team, add_user

    await add_team(bus, "ml", [], {})
    return (await add_user(bus, "bench", "ml", "admin")).token


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


async def _wait_http(url: str, token: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as c:
        while True:
            try:
                res = await c.get(f"{url}/api/v1/health", headers={"Authorization": f"Bearer {token}"})
                if res.status_code == 200 and res.json().get("caller"):
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the API server at {url} did not come up")
            await asyncio.sleep(0.2)


async def _wait_status(bus: Bus, seq: int, n: int) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            rows = await status_queries.status(bus, min_seq=seq, timeout=10)
            if len(rows) >= n:
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the status service did not catch up with the seeded clusters")
        await asyncio.sleep(0.5)


def _pcts(samples: list[float]) -> tuple[float, float]:
    qs = statistics.quantiles(samples, n=100, method="inclusive")
    return qs[49] * 1000, qs[98] * 1000


async def _concurrently(clients: int, total: int, one) -> tuple[list[float], float]:
    """`total` calls of `one(client)` spread over `clients` workers: each call's seconds, the wall time."""
    times: list[float] = []
    left = iter(range(total))

    async def worker(k: int) -> None:
        for _ in left:
            t = time.perf_counter()
            await one(k)
            times.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    return times, time.perf_counter() - t0


async def bench_http(url: str, token: str, clients: int, requests: int, tasks: int, clusters: int) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    pool = [httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) for _ in range(clients)]
    try:
        async def listing(k: int) -> None:
            res = await pool[k].get("/api/v1/clusters", params={"all_users": "true"})
            # (checked without parsing: the clients share this process's one core with each other)
            if res.status_code != 200 or res.content.count(b'"status":') < clusters:
                raise SystemExit(f"GET /api/v1/clusters: {res.status_code} {res.text[:200]}")

        await _concurrently(clients, clients, listing)  # warm: connections, caches
        lat, _ = await _concurrently(clients, requests, listing)

        async def submit(k: int) -> None:
            res = await pool[k].post("/api/v1/tasks", json={"task": TASK, "cluster": f"s-{uuid.uuid4().hex[:10]}"})
            if res.status_code != 202:
                raise SystemExit(f"POST /api/v1/tasks: {res.status_code} {res.text[:200]}")

        _, wall = await _concurrently(clients, tasks, submit)
    finally:
        for c in pool:
            await c.aclose()
    p50, p99 = _pcts(lat)
    return {"p50_ms": p50, "p99_ms": p99, "submits_per_s": tasks / wall}


async def bench_embedded(bus: Bus, clients: int, requests: int, tasks: int, clusters: int) -> dict:
    async def listing(k: int) -> None:
        seq = await bus.last_seq()  # as the CLI and the server ask: caught up with the log
        rows = await status_queries.status(bus, min_seq=seq, timeout=30)
        if len(rows) < clusters:
            raise SystemExit(f"status: {len(rows)} rows")

    await _concurrently(clients, clients, listing)
    lat, _ = await _concurrently(clients, requests, listing)

    async def submit(k: int) -> None:
        name = f"e-{uuid.uuid4().hex[:10]}"
        await bus.publish(TaskSubmitted(task_id=str(uuid.uuid4()), cluster=name, task={"run": "python train.py"},
                                        user="bench", team="ml"))

    _, wall = await _concurrently(clients, tasks, submit)
    p50, p99 = _pcts(lat)
    return {"p50_ms": p50, "p99_ms": p99, "submits_per_s": tasks / wall}


async def run(args: argparse.Namespace, work: Path) -> dict:
    server = NatsServer(work / "js", free_port()).start()
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "SKYPURZA_NO_PLUGINS": "1"}
    try:
        bus = await Bus.connect(server.url, STAGE, source="/bench/api")
        try:
            token = await admin_token(bus)
            seq = await seed_clusters(bus, args.clusters)
            procs.append(_spawn(["skypurza.services.status.service", "--nats", server.url, "--stage", STAGE,
                                 "--db", str(work / "status.duckdb")], work / "status.log", env))
            await _wait_status(bus, seq, args.clusters)
            port = free_port()
            procs.append(_spawn(["skypurza.services.api", "--nats", server.url, "--stage", STAGE, "--host",
                                 "127.0.0.1", "--port", str(port), "--log-level", "warning"], work / "api.log", env))
            url = f"http://127.0.0.1:{port}"
            await _wait_http(url, token)
            http = await bench_http(url, token, args.clients, args.requests, args.tasks, args.clusters)
            embedded = await bench_embedded(bus, args.clients, args.requests, args.tasks, args.clusters)
        finally:
            await bus.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        server.stop()
    return {"http": http, "embedded": embedded}


def report(res: dict, args: argparse.Namespace) -> str:
    h, e = res["http"], res["embedded"]
    ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
    lines = [
        f"API server bench: {args.clients} concurrent clients, {args.clusters:,} clusters known",
        f"{'':34}{'API server':>14}{'embedded bus':>16}{'goal':>12}",
        f"{'GET /api/v1/clusters p50 (ms)':34}{h['p50_ms']:>14.1f}{e['p50_ms']:>16.1f}{'<= 25':>12}  "
        f"{ok(h['p50_ms'] <= GOAL_P50_MS)}",
        f"{'GET /api/v1/clusters p99 (ms)':34}{h['p99_ms']:>14.1f}{e['p99_ms']:>16.1f}",
        f"{'task submissions per second':34}{h['submits_per_s']:>14.0f}{e['submits_per_s']:>16.0f}{'>= 200':>12}  "
        f"{ok(h['submits_per_s'] >= GOAL_SUBMITS_PER_S)}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clusters", type=int, default=1000)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--requests", type=int, default=1000, help="GET /api/v1/clusters requests in all")
    p.add_argument("--tasks", type=int, default=2000, help="submissions in all")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="spz-bench-api-") as d:
        res = asyncio.run(run(args, Path(d)))
    print(report(res, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
