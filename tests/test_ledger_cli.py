"""The ledger's CLI against a real ledger process, a real status service process and nats-server:
cost-report, settle, audit (both projections), events export, events replay --into."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys

import duckdb
import pyarrow.parquet as pq
import pytest
from ledger_history import publish_all, scripted, settlement_tail
from nats_fixtures import connect_bus
from typer.testing import CliRunner

from skypurza.cli.main import app
from skypurza.events import ledger_queries as lq
from skypurza.events import naming
from skypurza.events import status_queries as sq


@pytest.fixture
def ledger(nats_server, spz_home, monkeypatch, tmp_path):
    """A published history, a running ledger process and status service process; the CLI
    pointed at them."""
    h = scripted()
    settlement_tail(h)

    async def publish():
        bus = await connect_bus(nats_server)
        last = await publish_all(bus, h.envs)
        await bus.close()
        return last

    last = asyncio.run(publish())
    env = {**os.environ, "SKYPURZA_HOME": str(spz_home)}
    proc = subprocess.Popen([sys.executable, "-m", "skypurza.services.ledger.service", "--nats", nats_server.url,
                             "--stage", "test", "--tick", "0"], env=env,
                            stdout=open(tmp_path / "ledger.log", "wb"), stderr=subprocess.STDOUT)
    status = subprocess.Popen([sys.executable, "-m", "skypurza.services.status.service", "--nats", nats_server.url,
                               "--stage", "test"], env=env,
                              stdout=open(tmp_path / "status.log", "wb"), stderr=subprocess.STDOUT)

    async def caught_up():
        bus = await connect_bus(nats_server)
        try:
            for _ in range(300):
                try:
                    if (await lq.position(bus, timeout=1.0))["checkpoint"] == last and \
                            (await sq.position(bus, timeout=1.0))["checkpoint"] == last:
                        return
                except Exception:
                    pass
                await asyncio.sleep(0.05)
            raise AssertionError("the ledger or the status service did not catch up")
        finally:
            await bus.close()

    asyncio.run(caught_up())
    for k, v in {"SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test"}.items():
        monkeypatch.setenv(k, v)
    yield {"last": last, "events": h.envs}
    for p in (proc, status):
        p.terminate()
        p.wait(10)


def spz(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return res.exit_code, res.output


def test_cost_report_outputs(ledger):
    code, out = spz("cost-report", "--by", "team", "-o", "json")
    assert code == 0, out
    rep = json.loads(out)
    assert [(line["key"], line["kind"], line["cost_micros"]) for line in rep["lines"]] == [
        ("(none)", "usage", 18_333), ("ml", "usage", 55_000), ("ml", "compensation", 18_333)]
    assert rep["total"]["cost_usd"] == "0.091666" and rep["through_seq"] == ledger["last"]
    code, out = spz("cost-report", "--by", "day", "-o", "csv", "--since", "2026-11-01")
    assert code == 0, out
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0][:4] == ["day", "kind", "for_period", "cost_usd"]
    assert [r[:4] for r in rows[1:]] == [["2026-11-01", "usage", "", "0.018333"],
                                         ["2026-11-01", "compensation", "2026-10", "0.018333"]]
    code, out = spz("cost-report")
    assert code == 0 and "TOTAL" in out and "$0.09" in out and "compensation" in out
    code, out = spz("cost-report", "--by", "galaxy")
    assert code == 2 and "accepted" in out


def test_settle_settlements_and_audit(ledger):
    code, out = spz("ledger", "settle", "--period", "2026-10")
    assert code == 1 and "already settled" in out
    code, out = spz("ledger", "settle", "--period", "2099-01")
    assert code == 1 and "not over" in out
    code, out = spz("ledger", "settle", "--period", "2026-09", "-o", "json")
    assert code == 0, out
    res = json.loads(out)
    assert res["period"] == "2026-09" and res["through_seq"] == ledger["last"] and res["total_micros"] == 0
    code, out = spz("ledger", "settlements", "-o", "json")
    assert [s["period"] for s in json.loads(out)] == ["2026-09", "2026-10"]
    code, out = spz("audit", "-o", "json")
    assert code == 0, out
    audit = json.loads(out)
    assert audit["ok"] and audit["differing"] == []
    # each projection against its own fresh replay, the new PeriodSettled included
    assert set(audit["projections"]) == {"status", "ledger"}
    assert {p["through_seq"] for p in audit["projections"].values()} == {ledger["last"] + 1}
    assert {t["table"] for t in audit["tables"] if t["projection"] == "ledger"} >= {
        "clusters", "usage", "settlements", "checkpoint"}
    assert {t["table"] for t in audit["tables"] if t["projection"] == "status"} >= {
        "clusters", "jobs", "managed_jobs", "attempts", "node_runs", "checkpoint"}
    code, out = spz("audit")
    assert code == 0 and "status:" in out and "ledger:" in out and "The projections match the log." in out


def test_events_export_and_replay_into(ledger, tmp_path):
    n = ledger["last"]
    code, out = spz("events", "export", "--format", "jsonl", str(tmp_path / "log.jsonl"))
    assert code == 0, out
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(lines) == n and [x["sequence"] for x in lines] == [str(i) for i in range(1, n + 1)]
    assert [x["id"] for x in lines] == [e.id for e in ledger["events"]]
    assert all(x["specversion"] == "1.0" and x["type"].startswith("io.skypurza.") for x in lines)
    code, out = spz("events", "export", "--format", "parquet", "--since", "10", "--until", "20", str(tmp_path / "log.parquet"))
    assert code == 0, out
    t = pq.read_table(tmp_path / "log.parquet")
    assert t.num_rows == 11 and t.column("sequence").to_pylist() == list(range(10, 21))
    assert json.loads(t.column("data")[0].as_py()) == ledger["events"][9].data

    code, out = spz("events", "replay", "--into", str(tmp_path / "a.duckdb"))
    assert code == 0, out
    code, out = spz("events", "replay", "--into", str(tmp_path / "b.duckdb"), "--until", "20")
    assert code == 0, out
    con = duckdb.connect(str(tmp_path / "b.duckdb"), read_only=True)
    assert con.execute("SELECT last_seq FROM checkpoint").fetchall() == [(20,)]
    con.close()
    code, out = spz("events", "replay", "--into", str(tmp_path / "c.duckdb"))
    assert code == 0
    code, out = spz("audit", "--live", str(tmp_path / "a.duckdb"), "--replay", str(tmp_path / "c.duckdb"))
    assert code == 0 and "ledger:" in out and "match the log" in out
    code, out = spz("audit", "--live", str(tmp_path / "a.duckdb"), "--replay", str(tmp_path / "b.duckdb"))
    assert code == 1 and "DIFF" in out and "differ from the log in: ledger." in out
    code, out = spz("events", "replay", "--into", str(tmp_path / "a.duckdb"))
    assert code == 1 and "exists" in out
    # the running services write the stage's own files, named by the naming module
    assert naming.projections_file("test").exists() and naming.status_db_file("test").exists()
