"""One bad event never stops a service (issue 11 §2), against real parts: a real nats-server, the
real services process (`python -m skypurza.cli.serve`), real DuckDB files, real node agents.

Event models stay lenient (the log must keep old events readable), so the poison here is
published straight on the bus, the way an old CLI (`spz launch -i 99999999999999999999`) put it
there: an autostop interval or a job id no column and no clock can hold.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from agent_harness import job_end, job_lines, of, provision, terminate, wait_events
from nats_fixtures import connect_bus
from typer.testing import CliRunner

from skypurza.cli import health
from skypurza.cli.main import app
from skypurza.events import deadletters, naming
from skypurza.events import ledger_queries as lq
from skypurza.events import status_queries as sq
from skypurza.events.envelope import REGISTRY, UPCASTERS, Event, register, upcaster, utcnow
from skypurza.events.jobqueue import queue_job
from skypurza.events.models import (AutostopSet, Candidate, ClusterProvisioned, JobQueued, NodeInfo, UsageRecorded,
                                    all_event_types)
from skypurza.events.service import ServiceContract, ServiceRunner, handles
from skypurza.services.agent.view import MAX_COUNTABLE_IDLE_MINUTES
from skypurza.services.provisioner.local import LocalAdapter

HUGE = 10**20  # what `-i 99999999999999999999` put in the log


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def services(nats_server, spz_home, tmp_path):
    """Start the real services process (what the embedded control plane runs); killed after."""
    procs: list[subprocess.Popen] = []

    def start(names: str = "ledger") -> subprocess.Popen:
        env = {**os.environ, "SKYPURZA_HOME": str(spz_home), "SKYPURZA_METERING_TICK_S": "0"}
        env.pop("SKYPURZA_NATS_URL", None)
        log = open(tmp_path / f"services-{len(procs)}.log", "wb")
        p = subprocess.Popen([sys.executable, "-m", "skypurza.cli.serve", "--nats", nats_server.url, "--stage",
                              "test", "--services", names], env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


@pytest.fixture
def cli(nats_server, spz_home, monkeypatch):
    """`spz …` in this process, pointed at the test's NATS (external mode) and home."""
    monkeypatch.setenv("SKYPURZA_NATS_URL", nats_server.url)
    monkeypatch.setenv("SKYPURZA_STAGE", "test")

    def spz(*args: str) -> tuple[int, str]:
        res = CliRunner().invoke(app, list(args), catch_exceptions=False)
        return res.exit_code, res.output

    return spz


def provisioned(cluster: str, *, price: int = 3_600_000, idle_minutes: int | None = None) -> ClusterProvisioned:
    return ClusterProvisioned(
        cluster=cluster, task_id=f"task-{cluster}", placement_id=f"p-{cluster}",
        candidate=Candidate(infra="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                            hourly_price_micros=price, num_nodes=1),
        nodes=[NodeInfo(rank=0, instance_id=f"i-{cluster}")], hourly_price_micros=price,
        launched_at=utcnow() - timedelta(minutes=5), user="ana", team="ml", idle_minutes=idle_minutes)


async def wait_checkpoint(bus, seq: int, position=lq.position, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = await position(bus, timeout=1.0)
            if last["checkpoint"] >= seq:  # type: ignore[index]
                return last  # type: ignore[return-value]
        except Exception as exc:  # not up yet
            last = exc
        await asyncio.sleep(0.1)
    raise AssertionError(f"the projection did not reach seq {seq}: {last!r}")


def ledger_health(spz, name: str = "ledger") -> dict:
    code, out = spz("api", "status", "-o", "json")
    assert code == 0, out
    st = json.loads(out)
    return next(s for s in st["services"] if s["name"] == name)


# ---------------------------------------------------------------- the ledger


def test_the_projections_park_poison_and_project_everything_else(nats_server, services, cli):
    """Poison in the middle of a catch-up batch and then live: the status service and the ledger
    each park exactly the events they cannot apply (with their errors), project every other one,
    never restart, and audit, status and cost-report work."""

    async def before():
        bus = await connect_bus(nats_server)
        await bus.publish(provisioned("c1"))
        await bus.publish(AutostopSet(cluster="c1", idle_minutes=HUGE))  # seq 2: poison
        await bus.publish(provisioned("c2"))
        start = utcnow() - timedelta(minutes=4)
        await bus.publish(UsageRecorded(cluster="c2", rank=0, instance_id="i-c2", start=start,
                                        end=start + timedelta(seconds=1000), instance_type="g5.xlarge",
                                        region="us-east-1", hourly_price_micros=3_600_000, cost_micros=1_000_000,
                                        billing_seconds=1000, user="ana", team="ml"))
        await bus.publish(AutostopSet(cluster="c2", idle_minutes=30))
        last = await bus.last_seq()
        await bus.close()
        return last

    last = asyncio.run(before())
    proc = services("status,ledger")

    async def live():
        bus = await connect_bus(nats_server)
        await wait_checkpoint(bus, last)  # the whole backlog came as one batch
        await wait_checkpoint(bus, last, sq.position)
        await bus.publish(JobQueued(cluster="c2", job_id=HUGE, task_id="t-huge", task={"run": "x"}))  # poison
        poison_seq = await bus.last_seq()
        await bus.publish(AutostopSet(cluster="c1", idle_minutes=15))
        await bus.publish(JobQueued(cluster="c2", job_id=1, task_id="t-1", task={"run": "echo hi"}))
        end = await bus.last_seq()
        pos = await wait_checkpoint(bus, end)
        status_pos = await wait_checkpoint(bus, end, sq.position)
        await bus.close()
        return poison_seq, end, pos, status_pos

    poison_seq, end, pos, status_pos = asyncio.run(live())
    assert pos["checkpoint"] == end and pos["halted"] is None
    assert status_pos["checkpoint"] == end and status_pos["halted"] is None and status_pos["parked"] == 2

    code, out = cli("status", "-o", "json")
    assert code == 0, out
    clusters = {c["name"]: c for c in json.loads(out)}
    assert clusters["c1"]["autostop"] == 15, "the event after the poison was not projected"
    assert clusters["c2"]["autostop"] == 30
    code, out = cli("queue", "c2", "-o", "json")
    assert code == 0, out
    assert "t-1" in out or '"job_id": 1' in out

    code, out = cli("events", "dlq", "-o", "json")
    assert code == 0, out
    parked = sorted(json.loads(out), key=lambda p: (p["service"], p["stream_seq"]))
    # The ledger keeps no jobs (accounting only): the job id it cannot hold is the status service's.
    assert [(p["service"], p["stream_seq"], p["event_type"]) for p in parked] == [
        ("ledger", 2, "io.skypurza.autostop_set.v1"),
        ("status", 2, "io.skypurza.autostop_set.v1"), ("status", poison_seq, "io.skypurza.job_queued.v1")]
    assert "clusters.autostop_minutes = 100000000000000000000" in parked[0]["error"]
    assert "clusters.autostop_minutes = 100000000000000000000" in parked[1]["error"]
    assert "jobs.job_id = 100000000000000000000" in parked[2]["error"]
    for p in parked:
        assert p["error_type"] == "OverflowError" and p["error"].startswith("OverflowError: ")
        assert str(HUGE) in p["payload"], "the dead letter must hold the original event"
        assert p["subject"].startswith(naming.subject_prefix("test") + ".evt.")
    code, out = cli("events", "dlq")
    assert code == 0 and "OverflowError" in out and "io.skypurza.autostop_set.v1" in out

    code, out = cli("audit", "-o", "json")
    assert code == 0, out
    audit = json.loads(out)
    assert audit["ok"], audit["differing"]
    skipped = {t["projection"]: t for t in audit["tables"] if t["table"] == "skipped"}
    # the parked events, recorded in each projection as well
    assert (skipped["status"]["live_rows"], skipped["ledger"]["live_rows"]) == (2, 1)

    code, out = cli("cost-report", "-o", "json")
    assert code == 0, out
    report = json.loads(out)
    assert sum(line["cost_micros"] for line in report["lines"]) == 1_000_000
    code, out = cli("cost-report")
    assert code == 0 and "not running" not in out

    for name in ("ledger", "status"):
        h = ledger_health(cli, name)
        assert (h["state"], h["restarts"], h["last_error"]) == ("running", 0, None), name
    assert proc.poll() is None


def test_replays_in_any_batch_size_skip_exactly_the_same_events(nats_server, tmp_path):
    """Isolation decides per event (can it be applied on top of everything before it?), so
    batch sizes 1, 4 and 5000 give equal files, each with the poison recorded as failed."""
    import duckdb

    from skypurza.services.ledger.replay import audit, replay_into

    async def main():
        bus = await connect_bus(nats_server)
        poison = []
        for i in range(12):
            await bus.publish(provisioned(f"c{i}"))
            if i % 5 == 2:
                await bus.publish(AutostopSet(cluster=f"c{i}", idle_minutes=HUGE))
                poison.append(await bus.last_seq())
            await bus.publish(AutostopSet(cluster=f"c{i}", idle_minutes=i))
        for b in (1, 4, 5000):
            res = await replay_into(bus, tmp_path / f"b{b}.duckdb", batch=b)
            assert res["last_seq"] == await bus.last_seq()
        await bus.close()
        return poison

    poison = asyncio.run(main())
    for b in (1, 4):
        result = audit(tmp_path / "b5000.duckdb", tmp_path / f"b{b}.duckdb")
        assert result["ok"], result["differing"]
    con = duckdb.connect(str(tmp_path / "b5000.duckdb"), read_only=True)
    try:
        skipped = con.execute("SELECT seq, status, type, reason FROM skipped ORDER BY seq").fetchall()
        autostops = con.execute("SELECT name, autostop_minutes FROM clusters ORDER BY name").fetchall()
    finally:
        con.close()
    assert [(seq, status, t) for seq, status, t, _ in skipped] == [
        (seq, "failed", "io.skypurza.autostop_set.v1") for seq in poison]
    assert all(reason.startswith("OverflowError") for *_, reason in skipped)
    assert sorted(autostops) == sorted((f"c{i}", i) for i in range(12))


def test_a_service_that_keeps_dying_shows_as_failing_with_its_error(nats_server, services, cli, spz_home):
    """A projections file that is not a DuckDB database: the ledger dies at every start; the
    supervisor restarts it with back-off and `spz api status` says it is failing, and why."""
    db = naming.projections_file("test")
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(b"this is not a duckdb file\n" * 200)
    proc = services("ledger,optimizer")

    deadline = time.monotonic() + 30
    while True:
        code, out = cli("api", "status", "-o", "json")
        assert code == 0, out
        by_name = {s["name"]: s for s in json.loads(out)["services"]}
        if by_name.get("ledger", {}).get("state") == "failing":
            break
        assert time.monotonic() < deadline, by_name
        time.sleep(0.2)
    ledger = by_name["ledger"]
    assert ledger["restarts"] >= 2 and ledger["restarts_last_minute"] >= 2 and not ledger["healthy"]
    assert "IOException" in ledger["last_error"] and "not a valid DuckDB database" in ledger["last_error"]
    assert by_name["optimizer"]["state"] == "running", "one failing service must not stop the others"
    code, out = cli("api", "status")
    assert code == 0 and "ledger is failing: IOException: IO Error" in out and "not a valid DuckDB" in out
    assert proc.poll() is None, "the services process itself must not die with its ledger"
    code, out = cli("cost-report")  # nobody answers: the user is told why, not "start it"
    assert code == 1 and "ledger service is failing" in out and "not a valid DuckDB" in out
    assert "Traceback" not in out

    # The file is atomic JSON in the stage's state dir, named by the naming module.
    doc = json.loads(naming.services_health_file("test").read_text())
    assert doc["pid"] == proc.pid and doc["services"]["ledger"]["state"] in ("restarting", "running")


def test_health_is_judged_at_read_time():
    now = 1_000_000.0
    entry = {"state": "running", "restarts": 2, "restart_times": [now - 100, now - 90], "last_error": "E: x"}
    assert health.service_view("s", entry, now)["state"] == "running"  # an old crash loop is over
    assert health.service_view("s", entry, now - 80)["state"] == "failing"
    assert health.service_view("s", {"state": "running", "restart_times": [now - 5]}, now)["state"] == "running"
    assert health.service_view("s", entry, now, process_alive=False)["state"] == "down"


# ---------------------------------------------------------------- the ServiceRunner


_BROKEN = "test_broken_upcast"


def test_an_event_no_code_can_read_is_parked_and_the_consumer_goes_on(nats_server):
    """An upcaster that raises (a bug, not a validation error) on an old event: the runner parks
    that message with the error and handles the next; it never dies on it."""

    class Broken(Event):
        EVENT_NAME = _BROKEN
        VERSION = 2
        AGGREGATE = "cluster"
        AGGREGATE_KEY = "cluster"
        cluster: str

    register(Broken)

    @upcaster(_BROKEN, 1)
    def _v1_to_v2(data: dict) -> dict:
        return {"cluster": data["no_such_field"]}

    class Echo:
        contract = ServiceContract(name="echo", consumes=tuple(all_event_types()))
        seen: list[int] = []

        async def start(self, bus):
            pass

        async def close(self):
            pass

        @handles(*all_event_types())
        async def on_any(self, stored, ctx):
            self.seen.append(stored.seq)
            return []

    async def main():
        bus = await connect_bus(nats_server)
        old = {"specversion": "1.0", "id": "old-1", "source": "/old", "type": f"io.skypurza.{_BROKEN}.v1",
               "time": utcnow().isoformat(), "subject": "cluster/c", "data": {"cluster": "c"}}
        await bus.js.publish(naming.event_subject("test", "cluster", "c", _BROKEN), json.dumps(old).encode())
        await bus.publish(AutostopSet(cluster="c", idle_minutes=5))
        svc = Echo()
        runner = ServiceRunner(bus, svc)
        task = asyncio.create_task(runner.run())
        deadline = time.monotonic() + 15
        while not (runner.stats.parked == 1 and svc.seen == [2]):
            assert time.monotonic() < deadline and not task.done(), runner.stats
            await asyncio.sleep(0.05)
        runner.stop()
        await asyncio.wait_for(task, 10)
        parked = await deadletters.dead_letters(bus, "echo")
        await bus.close()
        return parked

    try:
        parked = asyncio.run(main())
    finally:
        REGISTRY.pop(_BROKEN, None)
        UPCASTERS.pop((_BROKEN, 1), None)
    assert len(parked) == 1 and parked[0]["stream_seq"] == 1 and parked[0]["event_type"].endswith(f"{_BROKEN}.v1")
    assert parked[0]["error_type"] == "PoisonEvent" and "KeyError" in parked[0]["error"]


# ---------------------------------------------------------------- the node agent


@pytest.fixture
def fast_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.5")


def test_the_agent_parks_an_autostop_it_cannot_count_and_reports_the_job(nats_server, tmp_path: Path,
                                                                         fast_agents) -> None:
    """`launch -i 99999999999999999999` as it reached the agents: the ClusterProvisioned carries
    the interval, and an AutostopSet carries it again while a job runs. The agents park both, run
    and report the jobs, and autostop still works once a sane interval is set."""

    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        try:
            await provision(bus, adapter, "pz", 2, idle_minutes=HUGE)
            first, _ = await queue_job(bus, cluster="pz", task_id="t1", task={"run": "sleep 1; echo first",
                                                                            "num_nodes": 2})
            await asyncio.sleep(0.3)
            await bus.publish(AutostopSet(cluster="pz", idle_minutes=HUGE, down=False))  # while it runs
            end1 = await job_end(bus, "pz", first.job_id)
            second, _ = await queue_job(bus, cluster="pz", task_id="t2", task={"run": "echo second"})
            end2 = await job_end(bus, "pz", second.job_id)
            lines = await job_lines(bus, "pz", second.job_id)
            await bus.publish(AutostopSet(cluster="pz", idle_minutes=0))
            evs = await wait_events(bus, "pz", lambda evs: len(of(evs, "cluster_idle")) == 1)
            parked = await deadletters.dead_letters(bus)
        finally:
            await terminate(adapter, "pz")
            await bus.close()
        return end1, end2, lines, evs, parked

    end1, end2, lines, evs, parked = asyncio.run(main())
    assert end1.EVENT_NAME == "job_succeeded" and end2.EVENT_NAME == "job_succeeded"
    assert any(x["line"] == "second" for x in lines)
    assert of(evs, "cluster_idle")[0].idle_minutes == 0
    by_service: dict[str, list[dict]] = {}
    for p in parked:
        by_service.setdefault(p["service"], []).append(p)
    assert sorted(by_service) == ["agent:pz:0", "agent:pz:1"], "every node parks what it cannot take"
    for entries in by_service.values():
        assert [e["event_type"] for e in entries] == ["io.skypurza.cluster_provisioned.v1",
                                                      "io.skypurza.autostop_set.v1"]
        for e in entries:
            assert e["error_type"] == "RefusedEvent" and str(HUGE) in e["error"]
            assert str(MAX_COUNTABLE_IDLE_MINUTES) in e["error"] and str(HUGE) in e["payload"]
