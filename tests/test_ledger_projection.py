"""Ledger projections on a real nats-server and real DuckDB files: a scripted history of every
event type, idempotency per event id, batch-size independence, unknown and newer events.

The ledger keeps accounting only (and its private copy of clusters, nodes, placements for the
meter); what `spz status` shows is the status service's: tests/test_status_projection.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import duckdb
from ledger_history import History, publish_all, scripted, settlement_tail, unknown_and_poison
from nats_fixtures import connect_bus

from skypurza.events import ledger_queries as lq
from skypurza.events.models import TaskSubmitted
from skypurza.services.ledger.ledgerconfig import LedgerConfig
from skypurza.services.ledger.replay import audit, replay_into
from skypurza.services.ledger.service import LedgerService


def _rows(path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_scripted_history_projects_every_table(nats_server, tmp_path):
    async def main():
        bus = await connect_bus(nats_server)
        h = scripted()
        settlement_tail(h)
        last = await publish_all(bus, h.envs, unknown_and_poison())
        svc = LedgerService(tmp_path / "live.duckdb", tick_s=0, config=LedgerConfig())
        await svc.start(bus)
        try:
            assert await svc.wait_written(last)
            pos = await lq.position(bus)
            assert pos["checkpoint"] == last and pos["caught_up"] in (True, False)
            report = await lq.cost_report(bus, by="team")
            for query in ("status", "queue", "jobs_queue"):  # the status service's, not the ledger's
                try:
                    await bus.request("ledger", query, {}, timeout=1)
                except Exception as exc:
                    assert type(exc).__name__ in ("NoRespondersError", "TimeoutError"), exc
                else:
                    raise AssertionError(f"the ledger answered {query}")
        finally:
            await svc.close()
            await bus.close()
        return report

    report = asyncio.run(main())
    f = tmp_path / "live.duckdb"
    # what the meter needs of the fleet, in the ledger's own tables: c2 never came up and c3's
    # launch failed (no record); attribution from the task's labels
    clusters = {r[0]: r[1:] for r in _rows(f, "SELECT name, status, team, project, hourly_price_micros FROM clusters")}
    assert set(clusters) == {"c1", "mj-1", "c5", "sl6"}
    assert clusters["c1"] == ("TERMINATED", "ml", "llm", 1_100_000)
    tables = {r[0] for r in _rows(f, "SELECT table_name FROM information_schema.tables")}
    assert not tables & {"jobs", "managed_jobs", "attempts"}  # accounting only
    # usage: October settled; the late October interval is a compensation booked in November
    lines = {(line["key"], line["kind"]): line for line in report["lines"]}
    assert lines[("ml", "usage")]["cost_micros"] == 18_333 + 18_334 + 18_333
    assert lines[("(none)", "usage")]["cost_micros"] == 18_333
    comp = lines[("ml", "compensation")]
    assert comp["cost_micros"] == 18_333 and comp["for_period"] == "2026-10"


def test_placements_meters_and_skipped_rows(nats_server, tmp_path):
    async def main():
        bus = await connect_bus(nats_server)
        h = scripted()
        await publish_all(bus, h.envs, unknown_and_poison())
        await replay_into(bus, tmp_path / "r.duckdb")
        await bus.close()

    asyncio.run(main())
    f = tmp_path / "r.duckdb"
    placements = dict(_rows(f, "SELECT task_id, status FROM placements"))
    assert placements == {"t1": "PROVISIONED", "t2": "FAILED", "t3": "FAILED", "t4": "PROVISIONED",
                          "t5": "PROVISIONED", "t6": "PROVISIONED"}
    skipped = _rows(f, "SELECT type, status FROM skipped ORDER BY seq")
    assert skipped == [("io.skypurza.future_thing.v1", "unknown"), ("io.skypurza.job_started.v1", "poison")]
    # node runs for the meter: c1 ran twice (stop/start), mj-1 was preempted (its run ends then)
    meters = _rows(f, "SELECT cluster, rank, lifetime_start, stop_at FROM meters ORDER BY cluster, rank, lifetime_start")
    assert [(m[0], m[1]) for m in meters] == [("c1", 0), ("c1", 0), ("c1", 1), ("c1", 1), ("c5", 0), ("mj-1", 0),
                                                 ("sl6", 0)]
    assert all(m[3] is not None for m in meters if m[0] != "c5")
    mj_run = [m for m in meters if m[0] == "mj-1"][0]
    assert (mj_run[3] - mj_run[2]).total_seconds() == 70 * 60  # billed until the preemption


def test_same_log_same_tables_whatever_the_batches(nats_server, tmp_path):
    async def main():
        bus = await connect_bus(nats_server)
        h = scripted()
        settlement_tail(h)
        await publish_all(bus, h.envs, unknown_and_poison())
        await replay_into(bus, tmp_path / "big.duckdb", batch=5000)
        await replay_into(bus, tmp_path / "one.duckdb", batch=1)
        await replay_into(bus, tmp_path / "seven.duckdb", batch=7)
        await bus.close()

    asyncio.run(main())
    for other in ("one.duckdb", "seven.duckdb"):
        res = audit(tmp_path / "big.duckdb", tmp_path / other)
        assert res["ok"], res["differing"]


def test_repeated_events_are_applied_once(nats_server, tmp_path):
    """An event stored twice (published again after the de-duplication window) changes nothing."""
    async def main():
        bus = await connect_bus(nats_server)
        h = scripted()
        settlement_tail(h)
        await publish_all(bus, h.envs)
        await replay_into(bus, tmp_path / "once.duckdb")
        # Store every event a second time, as a late re-publisher would (new Nats-Msg-Id).
        for env in h.envs:
            await bus.js.publish(bus.subject_of(env), env.to_json(), headers={"Nats-Msg-Id": env.id + "-again"})
        assert await bus.last_seq() == 2 * len(h.envs)
        await replay_into(bus, tmp_path / "twice.duckdb")
        await bus.close()

    asyncio.run(main())
    res = audit(tmp_path / "once.duckdb", tmp_path / "twice.duckdb")
    differing = set(res["differing"])
    # Only the position differs (checkpoint); every read model is the same.
    assert differing <= {"checkpoint"}, res
    assert _rows(tmp_path / "twice.duckdb", "SELECT count(*) FROM usage") == \
        _rows(tmp_path / "once.duckdb", "SELECT count(*) FROM usage")


def test_newer_event_version_stops_the_projection_before_it(nats_server, tmp_path):
    async def main():
        bus = await connect_bus(nats_server)
        h = History()
        h.add(TaskSubmitted(task_id="a", cluster="ca", task={}))
        await publish_all(bus, h.envs)
        newer = json.loads(h.envs[0].to_json())
        newer.update(id="newer-1", type="io.skypurza.task_submitted.v9")
        await bus.js.publish(bus.subject_of(h.envs[0]), json.dumps(newer).encode())
        svc = LedgerService(tmp_path / "live.duckdb", tick_s=0, config=LedgerConfig())
        await svc.start(bus)
        try:
            for _ in range(100):
                pos = await lq.position(bus)
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


def test_the_ledger_continues_after_a_nats_server_restart(tmp_path):
    from skypurza.events.natsserver import NatsServer, free_port

    port = free_port()
    store = tmp_path / "js"

    async def main():
        server = NatsServer(store_dir=store, port=port).start()
        bus = await connect_bus(server)
        h = scripted()
        await bus.publish_many(h.envs[:30])
        svc = LedgerService(tmp_path / "live.duckdb", tick_s=0, config=LedgerConfig())
        await svc.start(bus)
        try:
            assert await svc.wait_written(30)
            server.kill()  # a crash, not a shutdown
            await asyncio.sleep(0.5)
            server = NatsServer(store_dir=store, port=port).start()
            for _ in range(50):
                try:
                    await bus.publish_many(h.envs[30:])
                    break
                except Exception:
                    await asyncio.sleep(0.2)
            assert await svc.wait_written(len(h.envs), timeout=30)
            return await lq.position(bus)
        finally:
            await svc.close()
            await bus.close()
            server.stop()

    pos = asyncio.run(main())
    assert pos["checkpoint"] == len(scripted().envs)
    assert dict(_rows(tmp_path / "live.duckdb", "SELECT name, status FROM clusters")) == {
        "c1": "TERMINATED", "mj-1": "TERMINATED", "c5": "INIT", "sl6": "TERMINATED"}


def test_both_log_transports_read_the_same_batches(nats_server):
    from skypurza.events.projection.logreader import LogReader

    async def main():
        bus = await connect_bus(nats_server)
        h = scripted()
        await publish_all(bus, h.envs, unknown_and_poison())
        out = {}
        for kind in ("raw", "natspy"):
            got = []
            async for batch in LogReader(bus, start_seq=5, batch=7, transport=kind).batches():
                got.extend(batch)
            out[kind] = got
        await bus.close()
        return out, len(h.envs) + 2

    out, n = asyncio.run(main())
    assert [m[0] for m in out["raw"]] == list(range(5, n + 1))
    assert [(s, d) for s, _, d in out["raw"]] == [(s, d) for s, _, d in out["natspy"]]
