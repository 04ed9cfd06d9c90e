"""Ledger bench: replay rate into DuckDB, and cost-report latency over 10 million usage rows.

    python bench/ledger.py [--events 1000000] [--usage-rows 10000000] [--skip-replay] [--skip-report]

1. Replay. A real nats-server (JetStream, file storage) gets N events, published fast with
   core `nc.publish` (each with its Nats-Msg-Id). The mix is what a running ledger sees: for
   every cluster, its lifecycle (submit, placement, provisioned, nodes ready, jobs, terminated)
   and one UsageRecorded per node per metering tick; about 95 % usage. Then
   `replay_into(bus, new file)` reads the whole log through the real decoder and reducers and
   commits it in bulk: events/s = events / wall time (reading + decoding + DuckDB).
2. Cost report. A DuckDB file with M usage rows (generated in SQL: 40 teams, 2,000 clusters,
   200 users, minute intervals over 2026), then `queries.cost_report(by=team)`, as the ledger
   answers it; median and worst of 7 runs after one warm-up.

Targets on the 2-core dev box: replay >= 25,000 events/s; report < 200 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.envelope import make_envelope
from skypurza.events.models import (
    ClusterProvisioned, ClusterTerminated, JobQueued, JobStarted, JobSucceeded, NodeReady, PlacementChosen,
    TaskSubmitted, UsageRecorded,
)
from skypurza.events.natsserver import NatsServer, free_port
from skypurza.events.types import Candidate, NodeInfo
from skypurza.services.ledger import queries, store
from skypurza.services.ledger.replay import replay_into

STAGE = "bench"
NODES = 4
TICKS = 60  # usage intervals per node of each cluster
T0 = datetime(2026, 10, 1, tzinfo=UTC)


def _subject(env) -> str:  # noqa: ANN001
    return naming.event_subject(STAGE, env.aggregate, env.aggregate_id, env.event_name)


def cluster_events(i: int) -> list[tuple[str, bytes, str]]:
    """(subject, payload, id) of one cluster's life: 10 + NODES control events, NODES × TICKS usage."""
    name, task = f"c{i}", f"t{i}"
    team, user = f"team{i % 40}", f"user{i % 200}"
    start = T0 + timedelta(minutes=7 * i)
    cand = Candidate(infra="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                     accelerators={"A10G": 1}, vcpus=4, memory_gib=16, hourly_price_micros=1_006_000,
                     num_nodes=NODES)
    envs = []

    def add(ev, **kw):  # noqa: ANN001, ANN003
        env = make_envelope(ev, source="/bench", id=str(uuid.uuid4()), time=kw.get("time", start))
        envs.append(env)
        return env

    add(TaskSubmitted(task_id=task, cluster=name, task={"run": "x"}, num_nodes=NODES, user=user, team=team))
    pc = add(PlacementChosen(task_id=task, cluster=name, attempt=1, candidate=cand, num_nodes=NODES))
    prov = add(ClusterProvisioned(cluster=name, task_id=task, placement_id=pc.id, candidate=cand,
                                  nodes=[NodeInfo(rank=r, instance_id=f"i-{i}-{r}") for r in range(NODES)],
                                  hourly_price_micros=1_006_000, launched_at=start, user=user, team=team))
    for r in range(NODES):
        add(NodeReady(cluster=name, rank=r))
    add(JobQueued(cluster=name, job_id=1, task_id=task, task={"run": "x"}, user=user))
    add(JobStarted(cluster=name, job_id=1, started_at=start))
    add(JobSucceeded(cluster=name, job_id=1, ended_at=start + timedelta(minutes=TICKS)))
    out = [(_subject(e), e.to_json(), e.id) for e in envs]
    # Usage: one model, then only the fields that change per interval (fast to generate).
    proto = make_envelope(UsageRecorded(
        cluster=name, rank=0, instance_id="i", start=start, end=start, instance_type="g5.xlarge",
        region="us-east-1", zone="us-east-1a", hourly_price_micros=1_006_000, cost_micros=16_766,
        tres={"cpu": 4, "mem": 16384, "node": 1, "gres/gpu": 1, "gres/gpu:a10g": 1}, billing_seconds=600,
        user=user, team=team, lifetime_id=prov.id), source="/bench", id="x", time=start)
    doc = json.loads(proto.to_json())
    usage_subject = _subject(proto)
    for tick in range(TICKS):
        s = start + timedelta(minutes=tick)
        for r in range(NODES):
            doc["id"] = str(uuid.uuid4())
            d = doc["data"]
            d["rank"], d["instance_id"] = r, f"i-{i}-{r}"
            d["start"] = s.strftime("%Y-%m-%dT%H:%M:%SZ")
            d["end"] = (s + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            d["final"] = tick == TICKS - 1
            out.append((usage_subject, json.dumps(doc, separators=(",", ":")).encode(), doc["id"]))
    end = add(ClusterTerminated(cluster=name, terminated_at=start + timedelta(minutes=TICKS)))
    out.append((_subject(end), end.to_json(), end.id))
    return out


async def bench_replay(n_events: int, work: Path) -> dict:
    server = NatsServer(store_dir=work / "js", port=free_port(), sync_always=False).start()
    try:
        bus = await Bus.connect(server.url, STAGE, source="/bench")
        t0 = time.perf_counter()
        sent, i = 0, 0
        while sent < n_events:
            for subject, payload, eid in cluster_events(i):
                if sent >= n_events:
                    break
                await bus.nc.publish(subject, payload, headers={"Nats-Msg-Id": eid})
                sent += 1
                if sent % 20_000 == 0:
                    await bus.nc.flush()
            i += 1
        await bus.nc.flush()
        while await bus.last_seq() < n_events:
            await asyncio.sleep(0.1)
        publish_s = time.perf_counter() - t0
        # CPU beside wall: on a shared 2-core box the wall figure moves with the load, the CPU
        # seconds (the process's, and the event loop's thread: the replay's critical path) less.
        cpu, main = time.process_time(), time.thread_time()
        out = await replay_into(bus, work / "replay.duckdb")
        out["cpu_s"], out["main_s"] = time.process_time() - cpu, time.thread_time() - main
        await bus.close()
    finally:
        server.stop()
    out["publish_s"] = round(publish_s, 1)
    out["clusters"] = i
    return out


def bench_report(rows: int, work: Path) -> dict:
    path = work / "report.duckdb"
    con = store.connect(path)
    t0 = time.perf_counter()
    con.execute(f"""
        INSERT INTO usage
        SELECT 'u' || i::VARCHAR, i, 'c' || (i % 2000)::VARCHAR, (i % 4)::INTEGER, NULL, 'i-' || (i % 8000)::VARCHAR,
               TIMESTAMP '2026-01-01' + to_minutes(i // 8000), TIMESTAMP '2026-01-01' + to_minutes(i // 8000 + 1),
               'g5.xlarge', 'aws', CASE i % 3 WHEN 0 THEN 'us-east-1' WHEN 1 THEN 'us-west-2' ELSE 'eu-west-1' END,
               NULL, CASE WHEN i % 5 = 0 THEN 'spot' ELSE 'on-demand' END, 1006000, 16766 + (i % 7), 600,
               '{{"cpu":4,"node":1}}', 'user' || (i % 200)::VARCHAR, 'team' || (i % 40)::VARCHAR, NULL,
               strftime(TIMESTAMP '2026-01-01' + to_minutes(i // 8000), '%Y-%m'),
               strftime(TIMESTAMP '2026-01-01' + to_minutes(i // 8000), '%Y-%m'), false, false
        FROM range({rows}) t(i)""")
    con.execute("CHECKPOINT")
    load_s = time.perf_counter() - t0
    cur = con.cursor()
    queries.cost_report(cur, {"by": "team"})  # warm-up (first touch of the columns)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        rep = queries.cost_report(cur, {"by": "team"})
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    queries.cost_report(cur, {"by": "day", "since": "2026-03-01", "until": "2026-04-01"})
    day_s = time.perf_counter() - t
    con.close()
    return {"rows": rows, "load_s": round(load_s, 1), "lines": len(rep["lines"]),
            "median_ms": round(statistics.median(times) * 1000, 1), "max_ms": round(max(times) * 1000, 1),
            "by_day_one_month_ms": round(day_s * 1000, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--usage-rows", type=int, default=10_000_000)
    p.add_argument("--skip-replay", action="store_true")
    p.add_argument("--skip-report", action="store_true")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ledger-bench-"))
    os.environ.setdefault("SKYPURZA_HOME", str(work / "home"))
    try:
        if not args.skip_replay:
            r = asyncio.run(bench_replay(args.events, work))
            print(f"replay: {r['records']:,} events ({r['clusters']:,} clusters) into DuckDB in {r['seconds']:.2f} s "
                  f"= {r['events_per_s']:,} events/s   (publishing them took {r['publish_s']} s)")
            print(f"        CPU {r['cpu_s']:.1f} s = {r['records'] / r['cpu_s']:,.0f} events/CPU-s; the event loop's "
                  f"thread {r['main_s']:.1f} s = {r['records'] / r['main_s']:,.0f} events/s of it   "
                  f"(load average {os.getloadavg()[0]:.1f})")
        if not args.skip_report:
            r = bench_report(args.usage_rows, work)
            print(f"cost-report --by team over {r['rows']:,} usage rows: median {r['median_ms']} ms, "
                  f"max {r['max_ms']} ms ({r['lines']} lines; by day over one month: {r['by_day_one_month_ms']} ms; "
                  f"rows generated in {r['load_s']} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
