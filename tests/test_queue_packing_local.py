"""`spz queue` of a cluster that runs several jobs at once, as a user sees it on the `local` infra.

A real control plane and real agents (tests/support/local_cli.py). The local cluster has this
machine's CPUs (the optimizer's LocalResources), so the jobs ask half of them each: two run,
the third waits; cancelling one starts the third and leaves the other running.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from local_cli import local_cli, spz

CPUS = len(os.sched_getaffinity(0))
HALF = f"{CPUS / 2:g}"


def _queue(env: dict[str, str]) -> dict[int, dict]:
    r = spz(env, "queue", "qp", "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    return {j["job_id"]: j for j in json.loads(r.stdout)}


def _wait(env: dict[str, str], want: dict[int, str], timeout: float = 60) -> dict[int, dict]:
    deadline = time.monotonic() + timeout
    while True:
        jobs = _queue(env)
        if all(jobs.get(j, {}).get("status") == s for j, s in want.items()):
            return jobs
        if time.monotonic() > deadline:
            raise AssertionError(f"wanted {want}; queue: {[(j, v['status']) for j, v in jobs.items()]}")
        time.sleep(0.3)


def test_queue_shows_concurrent_jobs_running_with_their_resources(tmp_path: Path) -> None:
    with local_cli(tmp_path, "qpack") as env:
        r = spz(env, "launch", "-y", "-c", "qp", "--cpus", HALF, "echo up", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        for _ in range(3):
            r = spz(env, "exec", "qp", "--async", "--cpus", HALF, "sleep 60")
            assert r.returncode == 0, r.stdout + r.stderr
        jobs = _wait(env, {2: "RUNNING", 3: "RUNNING"})
        time.sleep(1.5)  # the head has seen both start: the third must still wait
        jobs = _wait(env, {2: "RUNNING", 3: "RUNNING", 4: "PENDING"})
        assert {jobs[j]["resources"] for j in (2, 3, 4)} == {f"1x[CPU:{HALF}]"}
        assert all(jobs[j]["num_nodes"] == 1 for j in (2, 3, 4))
        table = spz(env, "queue", "qp")
        assert table.returncode == 0
        header = next(line for line in table.stdout.splitlines() if "RESOURCES" in line)
        assert header.split().index("RESOURCES") == header.split().index("NODES") + 1
        running = [line for line in table.stdout.splitlines() if "RUNNING" in line]
        assert len(running) == 2 and all(f"1x[CPU:{HALF}]" in line for line in running), table.stdout

        r = spz(env, "cancel", "-y", "qp", "2")
        assert r.returncode == 0, r.stdout + r.stderr
        _wait(env, {2: "CANCELLED", 3: "RUNNING", 4: "RUNNING"})
        assert spz(env, "down", "-y", "qp", timeout=120).returncode == 0
