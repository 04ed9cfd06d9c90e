"""The status service (open) on a real nats-server and real DuckDB files: the tables `spz status`,
`spz queue` and `spz jobs queue` read, its queries, idempotency, batch-size independence, newer
events, its audit, and the open broker running it without the platform (SKYPURZA_NO_PLUGINS=1).

The ledger keeps accounting only (tests/test_ledger_projection.py); both rebuild from a replay
of the same log the tables they keep live."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import duckdb
from ledger_history import History, publish_all, scripted, settlement_tail, unknown_and_poison, usage
from nats_fixtures import connect_bus

from skypurza.events import ledger_queries as lq
from skypurza.events import naming
from skypurza.events import status_queries as sq
from skypurza.events.models import ClusterProvisioned, TaskSubmitted
from skypurza.events.natsserver import free_port
from skypurza.events.projection.replay import audit, replay_into
from skypurza.services.ledger.ledgerconfig import LedgerConfig
from skypurza.services.ledger.service import LedgerService
from skypurza.services.status.projector import PROJECTION
from skypurza.services.status.service import StatusService

REPO = Path(__file__).resolve().parent.parent


def _rows(path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_scripted_history_answers_status_queue_and_jobs_queue(nats_server, tmp_path):
    async def main():
        bus = await connect_bus(nats_server)
        h = scripted()
        settlement_tail(h)
        # The meter's first hour of c5's node run (it is still running), stored twice.
        run = next(e for e in h.envs if e.event_name == "cluster_provisioned" and e.subject == "cluster/c5")
        start = ClusterProvisioned.model_validate(run.data).launched_at
        hour = usage("c5", 0, start, start + timedelta(hours=1), 96_000, lifetime_id=run.id)
        h.add(hour)
        last = await publish_all(bus, h.envs, unknown_and_poison())
        again = h.envs[-1]
        await bus.js.publish(bus.subject_of(again), again.to_json(), headers={"Nats-Msg-Id": again.id + "-again"})
        last = await bus.last_seq()
        svc = StatusService(tmp_path / "status.duckdb")
        await svc.start(bus)
        try:
            assert await svc.wait_written(last)
            pos = await sq.position(bus)
            status = {c["name"]: c for c in await sq.status(bus, all=True)}
            live = {c["name"] for c in await sq.status(bus)}
            queue = await sq.queue(bus, cluster="c1")
            mjobs = await sq.jobs_queue(bus)
            assert await sq.jobs_queue(bus, all=False) == []  # the one managed job has ended
        finally:
            await svc.close()
            await bus.close()
        return last, pos, status, live, queue, mjobs

    last, pos, status, live, queue, mjobs = asyncio.run(main())
    assert pos["checkpoint"] == last and pos["halted"] is None and pos["parked"] == 0
    assert pos["file"] == str(tmp_path / "status.duckdb")
    # clusters: c2 never came up and c3's launch failed: no record (as in SkyPilot)
    assert set(status) == {"c1", "mj-1", "c5", "sl6"} and live == {"c5"}
    c1 = status["c1"]
    assert c1["status"] == "TERMINATED" and c1["region"] == "us-east-2" and c1["zone"] == "us-east-2b"
    assert c1["team"] == "ml" and c1["project"] == "llm"  # from the task's labels
    assert c1["num_nodes"] == 2 and c1["hourly_price_micros"] == 1_100_000 and c1["user"] == "alice"
    assert c1["autostop"] == 10 and c1["autodown"] is True and c1["termination_reason"] == "user"
    assert [n["status"] for n in c1["nodes"]] == ["TERMINATED", "TERMINATED"]
    # the cost so far: the meter's usage along the current record's node runs (a repeat counts once)
    assert (status["c5"]["cost_micros"], status["c5"]["cost_usd"]) == (96_000, "0.096000")
    assert c1["cost_micros"] == 0 and c1["cost_usd"] == str(Decimal(0).scaleb(-6))
    assert status["mj-1"]["status"] == "TERMINATED" and status["mj-1"]["use_spot"] is True
    assert status["c5"]["status"] == "INIT" and status["c5"]["status_reason"] == "node 0 lost"
    assert [n["status"] for n in status["c5"]["nodes"]] == ["LOST"]
    # jobs: SkyPilot's states, final states stay final
    by_id = {j["job_id"]: j for j in queue}
    assert [j["job_id"] for j in queue] == [4, 3, 2, 1]
    # The task names no num_nodes: the job runs on one node of the two (events/fold.py job_num_nodes).
    assert by_id[1]["status"] == "SUCCEEDED" and by_id[1]["exit_code"] == 0 and by_id[1]["num_nodes"] == 1
    assert by_id[1]["resources"] == "1x[CPU:0.5]", "what it asked: no cpus declared is SkyPilot's 0.5"
    assert by_id[2]["status"] == "CANCELLED" and by_id[2]["cancel_requested"] is True
    assert by_id[3]["status"] == "FAILED_SETUP" and by_id[3]["failed_rank"] == 1
    assert by_id[4]["status"] == "FAILED" and by_id[4]["exit_code"] == 3
    # managed job: recovered once, cancelled; the RUNNING after CANCELLED is ignored
    assert len(mjobs) == 1
    mj = mjobs[0]
    assert mj["status"] == "CANCELLED" and mj["recoveries"] == 1 and mj["cancel_requested"] is True
    assert mj["cluster"] == "mj-1" and mj["started_at"] is not None and mj["ended_at"] is not None


def test_attempts_placements_node_runs_and_skipped_rows(nats_server, tmp_path):
    async def main():
        bus = await connect_bus(nats_server)
        await publish_all(bus, scripted().envs, unknown_and_poison())
        await replay_into(bus, tmp_path / "r.duckdb", PROJECTION)
        await bus.close()

    asyncio.run(main())
    f = tmp_path / "r.duckdb"
    assert _rows(f, "SELECT task_id, attempt, region, outcome, error_code FROM attempts ORDER BY task_id, attempt") == [
        ("t1", 1, "us-east-1", "capacity_error", "InsufficientInstanceCapacity"),
        ("t1", 2, "us-east-2", "provisioned", None),
        ("t3", 1, "us-east-1", "provision_failed", "UnauthorizedOperation"),
        ("t4", 1, "us-east-1", "provisioned", None),
        ("t5", 1, "us-east-1", "provisioned", None),
        ("t6", 1, "hpc", "provisioned", None),
    ]
    assert dict(_rows(f, "SELECT task_id, status FROM placements")) == {
        "t1": "PROVISIONED", "t2": "FAILED", "t3": "FAILED", "t4": "PROVISIONED", "t5": "PROVISIONED",
        "t6": "PROVISIONED"}
    assert _rows(f, "SELECT type, status FROM skipped ORDER BY seq") == [
        ("io.skypurza.future_thing.v1", "unknown"), ("io.skypurza.job_started.v1", "poison")]
    runs = _rows(f, "SELECT cluster, rank, lifetime_start, stop_at FROM node_runs "
                    "ORDER BY cluster, rank, lifetime_start")
    assert [(r[0], r[1]) for r in runs] == [("c1", 0), ("c1", 0), ("c1", 1), ("c1", 1), ("c5", 0), ("mj-1", 0),
                                            ("sl6", 0)]
    mj_run = [r for r in runs if r[0] == "mj-1"][0]
    assert (mj_run[3] - mj_run[2]).total_seconds() == 70 * 60  # ran until the preemption
    tables = {r[0] for r in _rows(f, "SELECT table_name FROM information_schema.tables")}
    assert not tables & {"usage", "meters", "settlements", "compensations"}  # no accounting here
    assert _rows(f, "SELECT projection FROM checkpoint") == [("status",)]


def test_same_log_same_tables_whatever_the_batches_and_repeats(nats_server, tmp_path):
    async def main():
        bus = await connect_bus(nats_server)
        h = scripted()
        settlement_tail(h)
        await publish_all(bus, h.envs, unknown_and_poison())
        for b in (5000, 1, 7):
            await replay_into(bus, tmp_path / f"b{b}.duckdb", PROJECTION, batch=b)
        # Every event stored a second time, as a late re-publisher would (new Nats-Msg-Id).
        for env in h.envs:
            await bus.js.publish(bus.subject_of(env), env.to_json(), headers={"Nats-Msg-Id": env.id + "-again"})
        await replay_into(bus, tmp_path / "twice.duckdb", PROJECTION)
        await bus.close()

    asyncio.run(main())
    for other in ("b1.duckdb", "b7.duckdb"):
        res = audit(tmp_path / "b5000.duckdb", tmp_path / other, PROJECTION)
        assert res["ok"], res["differing"]
    res = audit(tmp_path / "b5000.duckdb", tmp_path / "twice.duckdb", PROJECTION)
    assert set(res["differing"]) == {"checkpoint"}, res  # only the position: every read model is the same


def test_newer_event_version_stops_the_projection_before_it(nats_server, tmp_path):
    async def main():
        bus = await connect_bus(nats_server)
        h = History()
        h.add(TaskSubmitted(task_id="a", cluster="ca", task={}))
        await publish_all(bus, h.envs)
        newer = json.loads(h.envs[0].to_json())
        newer.update(id="newer-1", type="io.skypurza.task_submitted.v9")
        await bus.js.publish(bus.subject_of(h.envs[0]), json.dumps(newer).encode())
        svc = StatusService(tmp_path / "status.duckdb")
        await svc.start(bus)
        try:
            for _ in range(100):
                pos = await sq.position(bus)
                if pos["halted"]:
                    break
                await asyncio.sleep(0.05)
        finally:
            await svc.close()
            await bus.close()
        return pos

    pos = asyncio.run(main())
    assert pos["halted"] and "newer" in pos["halted"]
    assert pos["checkpoint"] == 1  # the event before it is committed, the newer one is not skipped


def test_status_and_ledger_each_rebuild_their_live_tables_from_a_replay(nats_server, tmp_path):
    """Both live services on one log, then each audits itself against a fresh replay: equal.
    A row edited behind the status service's back is found, by table and row."""
    async def main():
        bus = await connect_bus(nats_server)
        h = scripted()
        settlement_tail(h)
        await publish_all(bus, h.envs, unknown_and_poison())
        status = StatusService(tmp_path / "status.duckdb")
        ledger = LedgerService(tmp_path / "ledger.duckdb", tick_s=0, config=LedgerConfig())
        await status.start(bus)
        await ledger.start(bus)
        try:
            assert await status.wait_caught_up() and await ledger.wait_caught_up()
            audits = (await sq.audit(bus), await lq.audit(bus))
        finally:
            await ledger.close()
            await status.close()
        con = duckdb.connect(str(tmp_path / "status.duckdb"))
        con.execute("UPDATE jobs SET status = 'SUCCEEDED' WHERE cluster = 'c1' AND job_id = 4")
        con.close()
        status = StatusService(tmp_path / "status.duckdb")
        await status.start(bus)
        try:
            assert await status.wait_caught_up()
            tampered = await sq.audit(bus)
        finally:
            await status.close()
            await bus.close()
        return audits, tampered

    (status_audit, ledger_audit), tampered = asyncio.run(main())
    assert status_audit["ok"] and ledger_audit["ok"], (status_audit["differing"], ledger_audit["differing"])
    assert {t["table"] for t in status_audit["tables"]} == {t.name for t in PROJECTION.tables}
    assert "jobs" not in {t["table"] for t in ledger_audit["tables"]}
    assert not tampered["ok"] and tampered["differing"] == ["jobs"]
    jobs = next(t for t in tampered["tables"] if t["table"] == "jobs")
    assert jobs["only_live"][0]["status"] == "SUCCEEDED" and jobs["only_replay"][0]["status"] == "FAILED"


def _spz(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_the_open_broker_runs_and_answers_status_without_the_platform(tmp_path):
    """SKYPURZA_NO_PLUGINS=1: the embedded control plane runs the open services only, a local
    task launches, and `spz status` / `spz queue` are answered by the status service."""
    home = tmp_path / "home"
    env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": "openonly", "SKYPURZA_USER": "dana",
           "SKYPURZA_NO_PLUGINS": "1", "SKYPURZA_AGENT_KILL_GRACE_S": "1", "SKYPURZA_NATS_PORT": str(free_port()),
           "COLUMNS": "200"}
    env.pop("SKYPURZA_NATS_URL", None)
    task = tmp_path / "hello.yaml"
    task.write_text("name: hello\nrun: echo hello from the open broker\n")
    try:
        r = _spz(env, "launch", "-y", "-c", "open1", str(task))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "hello from the open broker" in r.stdout
        assert "Traceback" not in r.stderr
        r = _spz(env, "api", "status", "-o", "json")
        assert r.returncode == 0, r.stderr
        api = json.loads(r.stdout)
        running = {s["name"]: s["state"] for s in api["services"]}
        assert running.get("status") == "running" and "ledger" not in running, running
        r = _spz(env, "status", "-o", "json")
        assert r.returncode == 0, r.stderr
        assert [(c["name"], c["status"], c["infra"]) for c in json.loads(r.stdout)] == [("open1", "UP", "local")]
        r = _spz(env, "queue", "open1", "-o", "json")
        assert r.returncode == 0, r.stderr
        jobs = json.loads(r.stdout)
        assert [(j["job_id"], j["status"]) for j in jobs] == [(1, "SUCCEEDED")], jobs

        # Those answers are the status service's: it holds the same rows, over the bus.
        async def ask() -> tuple[dict, list, list]:
            from skypurza.events.bus import Bus

            bus = await Bus.connect(api["nats_url"], "openonly", source="/tests/status")
            try:
                return await sq.position(bus), await sq.status(bus), await sq.queue(bus, cluster="open1")
            finally:
                await bus.close()

        pos, clusters, queue = asyncio.run(ask())
        assert pos["file"] == str(home / "openonly" / naming.status_db_file("openonly").name)
        assert pos["checkpoint"] > 0 and pos["parked"] == 0
        assert [c["name"] for c in clusters] == ["open1"] and [j["status"] for j in queue] == ["SUCCEEDED"]
        r = _spz(env, "audit", "-o", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert list(json.loads(r.stdout)["projections"]) == ["status"]
        r = _spz(env, "down", "-y", "open1")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        _spz(env, "api", "stop", timeout=60)


def test_a_column_appended_to_a_table_is_added_to_an_older_file(tmp_path):
    """`jobs.resources` (what `spz queue` shows as RESOURCES) was appended to the table: a status
    file made before it opens without a rebuild, the column added, NULL in its older rows."""
    from skypurza.events.projection import store as ps
    from skypurza.services.status import schema as sc

    path = tmp_path / "old.duckdb"
    old = sc.JOBS.__class__(sc.JOBS.name, sc.JOBS.columns[:-1], sc.JOBS.key)
    con = duckdb.connect(str(path))
    con.execute(old.ddl())
    con.execute("INSERT INTO jobs (cluster, job_id, status) VALUES ('c', 1, 'RUNNING')")
    con.close()
    con = ps.connect(path, PROJECTION)
    try:
        assert [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE "
                                          "table_name = 'jobs' ORDER BY ordinal_position").fetchall()] == \
            sc.JOBS.column_names
        assert con.execute("SELECT job_id, resources FROM jobs").fetchall() == [(1, None)]
    finally:
        con.close()
