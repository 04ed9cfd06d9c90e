"""Crash safety: SIGKILL the ledger (a real process) in the middle of a stream of 10,000 events,
restart it, and its tables equal a clean replay; `audit` finds a tampered row."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import duckdb
from ledger_history import History, cand, publish_all, scripted, settlement_tail, usage
from nats_fixtures import connect_bus

from skypurza.events import ledger_queries as lq
from skypurza.events.models import (
    ClusterProvisioned, ClusterStopped, ClusterTerminated, JobQueued, JobStarted, JobSucceeded, NodeReady,
    PlacementChosen, TaskSubmitted,
)
from skypurza.events.types import NodeInfo
from skypurza.services.ledger.ledgerconfig import LedgerConfig
from skypurza.services.ledger.replay import audit, replay_into
from skypurza.services.ledger.service import LedgerService

N_EVENTS = 10_000


def stream(n: int) -> list:
    """Cluster lifecycles, jobs and usage intervals, interleaved: n envelopes."""
    h = History(prefix="stream")
    i = 0
    while len(h.envs) < n:
        name, task = f"k{i}", f"kt{i}"
        h.add(TaskSubmitted(task_id=task, cluster=name, task={"run": "x"}, num_nodes=2, user=f"u{i % 5}",
                            team=f"team{i % 3}"))
        pc = h.add(PlacementChosen(task_id=task, cluster=name, attempt=1, candidate=cand(num_nodes=2), num_nodes=2))
        start = h.t
        h.add(ClusterProvisioned(cluster=name, task_id=task, placement_id=pc.id, candidate=cand(num_nodes=2),
                                 nodes=[NodeInfo(rank=0, instance_id=f"i-{i}-0"), NodeInfo(rank=1, instance_id=f"i-{i}-1")],
                                 hourly_price_micros=1_006_000, launched_at=start, user=f"u{i % 5}"))
        h.add(NodeReady(cluster=name, rank=0))
        for j in (1, 2):
            h.add(JobQueued(cluster=name, job_id=j, task_id=f"{task}-{j}", task={"run": "x"}, user=f"u{i % 5}"))
            h.add(JobStarted(cluster=name, job_id=j, started_at=h.t))
            h.add(JobSucceeded(cluster=name, job_id=j, ended_at=h.t))
        for m in range(20):
            s = start + timedelta(minutes=m)
            for r in (0, 1):
                h.add(usage(name, r, s, s + timedelta(minutes=1), 16_766, team=f"team{i % 3}"))
        if i % 2:
            h.add(ClusterStopped(cluster=name, stopped_at=h.t))
        else:
            h.add(ClusterTerminated(cluster=name, terminated_at=h.t))
        i += 1
    return h.envs[:n]


def start_ledger(url: str, db: Path, home: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "SKYPURZA_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "skypurza.services.ledger.service", "--nats", url, "--stage", "test",
         "--db", str(db), "--tick", "0", "--batch", "100"],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)


async def position(bus) -> dict | None:
    try:
        return await lq.position(bus, timeout=1.0)
    except Exception:
        return None  # not serving yet


async def wait_position(bus, proc: subprocess.Popen, reached, timeout: float = 60.0) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        assert proc.poll() is None, "the ledger exited"
        pos = await position(bus)
        if pos is not None and reached(pos):
            return pos
        await asyncio.sleep(0.01)
    raise AssertionError("the ledger did not get there in time")


def test_sigkill_mid_stream_then_restart_equals_a_clean_replay(nats_server, spz_home, tmp_path):
    envs = stream(N_EVENTS)
    db = tmp_path / "live.duckdb"
    log = tmp_path / "ledger.log"

    async def main():
        bus = await connect_bus(nats_server)
        done = asyncio.Event()

        async def publisher():
            for k in range(0, len(envs), 500):
                await bus.publish_many(envs[k:k + 500])
                await asyncio.sleep(0.02)
            done.set()

        pub = asyncio.create_task(publisher())
        kills = []
        for target in (1_500, 4_000, 7_000):
            proc = start_ledger(nats_server.url, db, spz_home, log)
            pos = await wait_position(bus, proc, lambda p, t=target: p["applied_seq"] >= t)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills.append(pos["applied_seq"])
        proc = start_ledger(nats_server.url, db, spz_home, log)
        await pub
        final = await wait_position(bus, proc, lambda p: p["checkpoint"] == N_EVENTS)
        proc.send_signal(signal.SIGKILL)  # even the last stop is a crash
        proc.wait(10)
        clean = await replay_into(bus, tmp_path / "clean.duckdb")
        await bus.close()
        return kills, final, clean

    kills, final, clean = asyncio.run(main())
    assert all(k < N_EVENTS for k in kills), kills  # every kill happened mid-stream
    assert final["checkpoint"] == clean["last_seq"] == N_EVENTS
    res = audit(db, tmp_path / "clean.duckdb")
    assert res["ok"], res
    con = duckdb.connect(str(db), read_only=True)
    n_usage = con.execute("SELECT count(*) FROM usage").fetchall()[0][0]
    con.close()
    assert n_usage == sum(1 for e in envs if e.event_name == "usage_recorded")


def test_audit_finds_a_tampered_row(nats_server, tmp_path):
    db = tmp_path / "live.duckdb"

    async def run_ledger_until_caught_up(bus):
        svc = LedgerService(db, tick_s=0, config=LedgerConfig())
        await svc.start(bus)
        try:
            assert await svc.wait_caught_up()
            return await lq.audit(bus)
        finally:
            await svc.close()

    async def main():
        bus = await connect_bus(nats_server)
        h = scripted()
        settlement_tail(h)
        await publish_all(bus, h.envs)
        before = await run_ledger_until_caught_up(bus)
        # Someone edits the projection behind the ledger's back (the ledger is stopped).
        con = duckdb.connect(str(db))
        con.execute("UPDATE usage SET cost_micros = cost_micros + 1 WHERE cluster = 'c9' AND rank = 1")
        con.execute("UPDATE clusters SET status = 'UP' WHERE name = 'c1'")  # its private copy for the meter
        con.close()
        after = await run_ledger_until_caught_up(bus)
        await replay_into(bus, tmp_path / "replay.duckdb")
        await bus.close()
        return before, after

    before, after = asyncio.run(main())
    assert before["ok"] and before["differing"] == []
    assert not after["ok"] and set(after["differing"]) == {"usage", "clusters"}
    clusters = next(t for t in after["tables"] if t["table"] == "clusters")
    assert clusters["live_rows"] == clusters["replay_rows"] and clusters["live_checksum"] != clusters["replay_checksum"]
    assert clusters["only_live"][0]["status"] == "UP" and clusters["only_replay"][0]["status"] == "TERMINATED"
    usage_t = next(t for t in after["tables"] if t["table"] == "usage")
    assert usage_t["only_live"][0]["cost_micros"] == usage_t["only_replay"][0]["cost_micros"] + 1
    # The offline audit of the two files says the same.
    offline = audit(db, tmp_path / "replay.duckdb")
    assert set(offline["differing"]) == {"usage", "clusters"}
