"""Metrics benchmark: `GET /metrics` latency and size with 1,000 clusters and 10,000 jobs known,
beside the first path (every cluster, job and cost report at each scrape: `render(rows=True)`)
and the status service's `status` + `queue` queries alone (the baseline) in the same run, then
each source's own time (where a scrape's time goes).

A real nats-server, the status service, the ledger (no metering) and the observability service
run in this process; the history is published first and both projections catch up before the
clock starts. Goal: p50 <= 50 ms. The load average is printed beside the figures (they move
with it on a shared machine); `render_no_page_cache` is a render with the page cache
(services/observability/render.py) emptied first, the same-run "before" of that cache.

    python bench/metrics.py [--clusters 1000] [--jobs-per-cluster 10] [--scrapes 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from skypurza.events import ledger_queries as lq
from skypurza.events import status_queries as sq
from skypurza.events.bus import Bus
from skypurza.events.models import ClusterProvisioned, JobQueued, JobStarted, PlacementChosen, TaskSubmitted
from skypurza.events.natsserver import NatsServer, free_port
from skypurza.events.types import Candidate, NodeInfo

STAGE = "bench"
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def history(clusters: int, jobs: int) -> list:
    out = []
    for i in range(clusters):
        name, task_id = f"c{i}", f"t{i}"
        cand = Candidate(infra="aws", region=("us-east-1", "us-west-2", "eu-west-1")[i % 3], zone="a",
                         instance_type=("g5.xlarge", "p4d.24xlarge", "m6i.large")[i % 3], accelerators={"A10G": 1},
                         use_spot=i % 2 == 0, vcpus=4, memory_gib=16, hourly_price_micros=1_000_000, num_nodes=1)
        out.append(TaskSubmitted(task_id=task_id, cluster=name, task={"run": "x"}, user=f"u{i % 50}",
                                 team=f"team{i % 12}"))
        out.append(PlacementChosen(task_id=task_id, cluster=name, attempt=1, candidate=cand))
        out.append(ClusterProvisioned(cluster=name, task_id=task_id, placement_id=f"p{i}", candidate=cand,
                                      nodes=[NodeInfo(rank=0, instance_id=f"i-{i}", private_ip="10.0.0.1", zone="a")],
                                      hourly_price_micros=1_000_000, launched_at=T0, user=f"u{i % 50}",
                                      team=f"team{i % 12}"))
        for j in range(1, jobs + 1):
            out.append(JobQueued(cluster=name, job_id=j, task_id=f"{task_id}.{j}", task={"run": "x"}, user=f"u{i % 50}"))
            out.append(JobStarted(cluster=name, job_id=j, started_at=T0 + timedelta(seconds=j)))
    return out


async def http_get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def bench(args: argparse.Namespace, work: Path) -> dict:
    os.environ["SKYPURZA_HOME"] = str(work / "home")
    from skypurza.services.ledger.service import LedgerService
    from skypurza.services.observability.samples import QUEUE_WAIT_BUCKETS
    from skypurza.services.observability.service import ObservabilityService
    from skypurza.services.observability.settings import MetricsSettings
    from skypurza.services.status.service import StatusService

    server = NatsServer(store_dir=work / "js", port=free_port(), sync_always=False).start()
    stop = asyncio.Event()
    try:
        bus = await Bus.connect(server.url, STAGE, source="/bench")
        t0 = time.perf_counter()
        acks = await bus.publish_many(history(args.clusters, args.jobs_per_cluster))
        last = acks[-1].seq
        publish_s = time.perf_counter() - t0
        status, ledger = StatusService(), LedgerService(tick_s=0, meter=False)
        metrics = ObservabilityService(MetricsSettings(port=0))
        tasks = [asyncio.create_task(s.run(bus, stop)) for s in (status, ledger, metrics)]
        while True:
            try:
                if (await sq.position(bus, timeout=2))["checkpoint"] >= last and \
                        (await lq.position(bus, timeout=2))["checkpoint"] >= last:
                    break
            except Exception:
                pass
            await asyncio.sleep(0.2)
        await metrics.serving()
        while metrics.counters.last_seq < last:
            await asyncio.sleep(0.1)
        port = int(metrics.url.rsplit(":", 1)[1].split("/")[0])
        base, scrape, rows, size, rows_size = [], [], [], 0, 0
        for _ in range(args.scrapes):
            t = time.perf_counter()
            await sq.status(bus, all=True)
            await sq.queue(bus)
            base.append(time.perf_counter() - t)
            t = time.perf_counter()
            body = await http_get(port)
            scrape.append(time.perf_counter() - t)
            size = len(body)
            t = time.perf_counter()
            rows_size = len((await metrics.render(None, rows=True))[0])  # the first path, same process
            rows.append(time.perf_counter() - t)
        if args.profile:
            await _profile(metrics, args.profile)
        # Where one scrape's time goes: each source alone (p50 of --sources-runs); the page built
        # with and without the page cache, and a whole HTTP scrape, in the same run.
        sources = {"status_metrics_summary": lambda: sq.metrics_summary(bus, QUEUE_WAIT_BUCKETS),
                   "ledger_spend_summary": lambda: lq.spend_summary(bus),
                   "old_status_all": lambda: sq.status(bus, all=True), "old_queue": lambda: sq.queue(bus),
                   "old_jobs_queue": lambda: sq.jobs_queue(bus),
                   "old_cost_report_x1": lambda: lq.cost_report(bus, by="team"),
                   "all_sources_at_once": metrics.snapshot, "render_in_process": lambda: metrics.render(None),
                   "render_no_page_cache": lambda: _uncached(metrics), "http_scrape_alone": lambda: http_get(port)}
        # Each alone, back to back (a round robin puts each after the old rows queries, whose
        # aftermath on the shared loop swamps the small ones). Wall and this process's CPU time
        # (the in-process services' answers included): CPU moves less with the machine's load.
        each = {}
        for name, fn in sources.items():
            wall, cpu = [], []
            for _ in range(args.sources_runs):
                t, c = time.perf_counter(), time.process_time()
                await fn()
                wall.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            each[f"source_{name}_p50_ms"] = round(statistics.median(wall) * 1000, 1)
            if name.startswith(("render", "http", "all_sources")):
                each[f"source_{name}_cpu_p50_ms"] = round(statistics.median(cpu) * 1000, 1)
        stop.set()
        await asyncio.wait(tasks, timeout=20)
        await bus.close()
    finally:
        server.stop()
    ms = lambda x: round(x * 1000, 1)  # noqa: E731
    return {"events": last, "publish_s": round(publish_s, 1), "metrics_bytes": size,
            "metrics_p50_ms": ms(statistics.median(scrape)), "metrics_p99_ms": ms(pct(scrape, 0.99)),
            "old_rows_path_p50_ms": ms(statistics.median(rows)), "old_rows_path_p99_ms": ms(pct(rows, 0.99)),
            "old_rows_path_bytes": rows_size,
            "baseline_status_queue_p50_ms": ms(statistics.median(base)), "baseline_p99_ms": ms(pct(base, 0.99)),
            **each}


async def _uncached(metrics) -> tuple[bytes, str]:
    """A render as before the page cache (render.py): every family built and encoded."""
    from skypurza.services.observability.render import PageCache

    kept, metrics.page = metrics.page, PageCache()
    try:
        return await metrics.render(None)
    finally:
        metrics.page = kept


async def _profile(metrics, n: int) -> None:
    """cProfile of `n` in-process renders (the sources' answers and the page), top 25 by own time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        await metrics.render(None)
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--clusters", type=int, default=1000)
    p.add_argument("--jobs-per-cluster", type=int, default=10)
    p.add_argument("--scrapes", type=int, default=50)
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N in-process renders (stderr)")
    p.add_argument("--sources-runs", type=int, default=5, help="runs of each source alone (their p50)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = asyncio.run(bench(args, Path(d)))
    print(f"{'load_average_1_5_15':32} {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for k, v in out.items():
        print(f"{k:32} {v}")
    goal = out["metrics_p50_ms"] <= 50
    print(f"goal p50 <= 50 ms: {'met' if goal else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
