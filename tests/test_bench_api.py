"""bench/api.py runs end to end at a small size: real nats-server, status service and API server
processes; the report has both columns (API server, embedded bus) with figures from this run, a
member's listing and an admin's all-users one, and the load they were measured at, with each
process's CPU per request. (Each listing
request of the bench checks its row count: a member's is exactly their own clusters.)"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import re
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "api.py"


def test_the_api_bench_measures_the_server_beside_the_embedded_bus() -> None:
    spec = importlib.util.spec_from_file_location("spz_bench_api", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = argparse.Namespace(clusters=30, clients=5, members=4, requests=30, tasks=40)
    with tempfile.TemporaryDirectory() as d:
        res = asyncio.run(bench.run(args, Path(d)))
    for side in ("http", "embedded"):
        assert res[side]["p50_ms"] > 0 and res[side]["p99_ms"] >= res[side]["p50_ms"], res
        assert res[side]["member_p50_ms"] > 0 and res[side]["member_p99_ms"] >= res[side]["member_p50_ms"], res
        assert res[side]["submits_per_s"] > 0, res
    text = bench.report(res, args)
    assert "5 concurrent clients, 30 clusters known, 4 members; load average " in text
    assert re.search(r"a member's GET /api/v1/clusters p50 \(ms\)\s+[\d.]+\s+[\d.]+\s+<= 25", text), text
    assert re.search(r"admin, all users .* p99 \(ms\)\s+[\d.]+\s+[\d.]+\n", text), text
    assert re.search(r"task submissions per second\s+\d+\s+\d+\s+>= 200", text), text
    # where each listing's CPU went, the load generator's own included, and what a gunzip adds
    assert re.search(r"CPU ms per request .*admin: api server [\d.]+, status [\d.]+, nats [\d.]+, client [\d.]+",
                     text), text
    # (a few requests are a tick or two of /proc's 10 ms CPU clock, often none: counted, not judged)
    cpu = res["http"]["cpu_ms"]
    assert set(cpu) == {"member", "admin", "admin_gzip"}, cpu
    assert all(set(row) == {"api server", "status", "nats", "client"} and min(row.values()) >= 0
               for row in cpu.values()), cpu
    assert re.search(r"a client's gunzip of one costs [\d.]+ ms", text), text
