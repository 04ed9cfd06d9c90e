"""Metrics (services/observability/): the pure samples alone, then a real Prometheus (Debian's
`prometheus`) scraping the real endpoint, run as a process beside real status and ledger
processes on a real nats-server, over a published history."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from ledger_history import publish_all, scripted, settlement_tail
from nats_fixtures import connect_bus
from prometheus_client.parser import text_string_to_metric_families

from skypurza.events import ledger_queries as lq
from skypurza.events import naming
from skypurza.events import status_queries as sq
from skypurza.events.natsserver import free_port
from skypurza.events.settings import SettingsError
from skypurza.services.observability.samples import OTHER, Snapshot, bound, families
from skypurza.services.observability.settings import DEFAULT_PORT, MetricsSettings


def _values(fams) -> dict[tuple[str, tuple], float]:
    out = {}
    for f in fams:
        for s in f.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_samples_from_query_answers_and_bounded_labels() -> None:
    clusters = [{"name": f"c{i}", "status": "UP", "num_nodes": 1, "hourly_price_micros": 1_000_000 * (i + 1),
                 "team": "ml", "user": "u", "project": None, "infra": "aws", "region": "us-east-1",
                 "instance_type": "p4d", "market": "spot"} for i in range(5)]
    clusters.append({"name": "gone", "status": "TERMINATED", "num_nodes": 3, "hourly_price_micros": 9})
    jobs = [{"status": "SUCCEEDED", "submitted_at": "2026-01-01T00:00:00+00:00", "started_at": "2026-01-01T00:00:02+00:00"},
            {"status": "PENDING", "submitted_at": "2026-01-01T00:00:00+00:00", "started_at": None}]
    costs = {d: {"lines": [{"key": k, "cost_micros": c} for k, c in (("a", 1_500_000), ("b", 250_000), ("c", 1))]}
             for d in ("team", "user", "project", "cluster")}
    v = _values(families(Snapshot(clusters=clusters, jobs=jobs, costs=costs, sources={"status": True}), max_series=3))
    assert v[("skypurza_clusters", (("state", "UP"),))] == 5
    assert v[("skypurza_clusters", (("state", "TERMINATED"),))] == 1
    assert v[("skypurza_nodes", (("infra", "aws"), ("instance_type", "p4d"), ("market", "spot"),
                                 ("region", "us-east-1")))] == 5  # the terminated cluster's nodes are gone
    rates = {dict(k[1])["cluster"]: x for k, x in v.items() if k[0] == "skypurza_cost_rate_dollars_per_hour"}
    assert rates == {"c4": 5.0, "c3": 4.0, OTHER: 6.0}  # 3 series at most: the largest two, then "other"
    assert v[("skypurza_queue_wait_seconds_count", ())] == 1  # only the job that started
    assert v[("skypurza_queue_wait_seconds_sum", ())] == 2.0
    assert v[("skypurza_team_spent_dollars_total", (("team", "a"),))] == 1.5
    assert v[("skypurza_team_spent_dollars_total", (("team", "b"),))] == 0.25
    assert v[("skypurza_metrics_source_up", (("source", "status"),))] == 1
    # A source that did not answer leaves its families out.
    assert not any(k[0].startswith("skypurza_jobs") for k in _values(families(Snapshot(), 3)))


def test_bound_folds_into_other_and_keeps_the_total() -> None:
    values = {(f"u{i}",): float(i) for i in range(200)}
    out = bound(values, 0, 10)
    assert len(out) == 10 and (OTHER,) in out
    assert sum(out.values()) == sum(values.values())


def test_settings_are_bounded() -> None:
    assert MetricsSettings.load(env={}, config={}).port == DEFAULT_PORT
    assert MetricsSettings.load(env={}, config={"observability": {"metrics_port": 9100}}).port == 9100
    with pytest.raises(SettingsError, match="SKYPURZA_METRICS_PORT='70000'"):
        MetricsSettings.load(env={"SKYPURZA_METRICS_PORT": "70000"}, config={})
    with pytest.raises(SettingsError, match="SKYPURZA_METRICS_MAX_SERIES"):
        MetricsSettings.load(env={"SKYPURZA_METRICS_MAX_SERIES": "0"}, config={})


# ---------------------------------------------------------------- a real Prometheus

PROMETHEUS = shutil.which("prometheus")


def _get(url: str, timeout: float = 5.0, accept: str | None = None) -> tuple[str, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.headers.get("Content-Type", ""), r.read()


def _prom_query(base: str, q: str) -> list[dict]:
    _, body = _get(f"{base}/api/v1/query?query={urllib.parse.quote(q)}")
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _wait(what: str, fn, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"{what}: gave up; last {last!r}")


@pytest.fixture
def plane(nats_server, spz_home, tmp_path):
    """A published history; the status, ledger and observability services as processes."""
    h = scripted()
    settlement_tail(h)

    async def publish():
        bus = await connect_bus(nats_server)
        last = await publish_all(bus, h.envs)
        await bus.close()
        return last

    last = asyncio.run(publish())
    port = free_port()
    env = {**os.environ, "SKYPURZA_HOME": str(spz_home), "SKYPURZA_METRICS_PORT": str(port)}
    procs = [subprocess.Popen([sys.executable, "-m", f"skypurza.services.{m}.service", "--nats", nats_server.url,
                               "--stage", "test", *extra], env=env,
                              stdout=open(tmp_path / f"{m}.log", "wb"), stderr=subprocess.STDOUT)
             for m, extra in (("ledger", ["--tick", "0"]), ("status", []), ("observability", []))]

    async def caught_up():
        bus = await connect_bus(nats_server)
        try:
            for _ in range(400):
                try:
                    if (await lq.position(bus, timeout=1.0))["checkpoint"] == last and \
                            (await sq.position(bus, timeout=1.0))["checkpoint"] == last:
                        return bus
                except Exception:
                    pass
                await asyncio.sleep(0.05)
            raise AssertionError("the ledger or the status service did not catch up")
        except BaseException:
            await bus.close()
            raise

    async def costs():
        bus = await caught_up()
        try:
            return await lq.cost_report(bus, by="team")
        finally:
            await bus.close()

    report = asyncio.run(costs())
    try:
        yield {"url": f"http://127.0.0.1:{port}/metrics", "events": h.envs, "report": report,
               "home": spz_home, "last": last}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def prometheus(tmp_path):
    assert PROMETHEUS, "the prometheus binary is missing: apt-get install prometheus (README, .ci/run)"
    procs = []

    def start(target: str) -> str:
        port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                       f"  - job_name: spz\n    static_configs:\n      - targets: ['{target}']\n")
        procs.append(subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"],
                                      stdout=open(tmp_path / "prometheus.log", "wb"), stderr=subprocess.STDOUT))
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def test_prometheus_scrapes_costs_and_histograms_that_match_the_projections(plane, prometheus) -> None:
    url = plane["url"]
    # The endpoint itself: both formats, parsed by prometheus-client's own parser.
    ctype, body = _wait("metrics endpoint", lambda: _get(url))
    assert ctype.startswith("text/plain")
    text_fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    ctype, om = _get(url, accept="application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and om.rstrip().endswith(b"# EOF")
    assert {"skypurza_clusters", "skypurza_team_spent_dollars", "skypurza_queue_wait_seconds",
            "skypurza_provisioning_seconds", "skypurza_nodes", "skypurza_dead_letters"} <= set(text_fams)
    recorded = json.loads(naming.metrics_endpoint_file("test").read_text())
    assert recorded["url"] == url

    base = prometheus(url.removeprefix("http://").removesuffix("/metrics"))
    events = [e.type.split(".")[2] for e in plane["events"]]  # io.skypurza.<name>.v<N>

    def team_counter() -> dict[str, float]:
        rows = _prom_query(base, "skypurza_team_spent_dollars_total")
        return {r["metric"]["team"]: float(r["value"][1]) for r in rows}

    stored = _wait("Prometheus has the team counters", team_counter)
    per_team: dict[str, float] = {}
    for line in plane["report"]["lines"]:
        per_team[line["key"]] = per_team.get(line["key"], 0) + int(line["cost_micros"]) / 1e6
    assert any(v > 0 for v in per_team.values())
    # The ledger meters nothing here (--tick 0): within one scrape's accrual means equal.
    assert stored == pytest.approx(per_team, abs=1e-6)
    # By job too: every dollar of the report lands on one job key (bounded; "(none)": no managed job).
    by_job = _prom_query(base, "sum(skypurza_job_spent_dollars_total)")
    assert float(by_job[0]["value"][1]) == pytest.approx(sum(per_team.values()), abs=1e-6)

    started = events.count("job_started")
    assert started > 0
    submitted: set[str] = set()
    provisioned = 0
    for kind, e in zip(events, plane["events"]):
        if kind == "task_submitted":
            submitted.add(e.data.get("task_id"))
        elif kind == "cluster_provisioned" and e.data.get("task_id") in submitted:
            provisioned += 1
    assert provisioned > 0
    waits = _prom_query(base, "skypurza_queue_wait_seconds_count")
    assert [float(r["value"][1]) for r in waits] == [started]
    prov = _prom_query(base, "skypurza_provisioning_seconds_count")
    assert [float(r["value"][1]) for r in prov] == [provisioned]
    assert float(_prom_query(base, "skypurza_preemptions_total")[0]["value"][1]) == events.count("spot_preempted")
    fails = _prom_query(base, "sum(skypurza_failovers_total)")
    assert float(fails[0]["value"][1]) == events.count("capacity_error")
    up = {r["metric"]["source"]: r["value"][1] for r in _prom_query(base, "skypurza_metrics_source_up")}
    assert up == {"status": "1", "ledger": "1", "jetstream": "1"}
    lag = {r["metric"]["service"]: float(r["value"][1]) for r in _prom_query(base, "skypurza_projection_lag_events")}
    assert lag == {"status": 0.0, "ledger": 0.0}


def test_prometheus_scrapes_a_real_control_plane_running_local_jobs(tmp_path, prometheus) -> None:
    from local_cli import local_cli, spz

    with local_cli(tmp_path, "metrics") as env:
        env["SKYPURZA_METERING_TICK_S"] = "2"  # usage (free, on local) within the test: the spend panels' series
        r = spz(env, "launch", "-y", "-c", "mc", "echo one", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        r = spz(env, "exec", "mc", "echo two", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        st = json.loads(spz(env, "api", "status", "-o", "json").stdout)
        url = st["metrics_url"]
        assert url and url.endswith(f":{env['SKYPURZA_METRICS_PORT']}/metrics"), st
        base = prometheus(url.removeprefix("http://").removesuffix("/metrics"))

        jobs = json.loads(spz(env, "queue", "mc", "-o", "json").stdout)
        started = [j for j in (jobs if isinstance(jobs, list) else jobs.get("jobs", [])) if j.get("started_at")]
        assert len(started) == 2, jobs

        def counts() -> tuple[float, float] | None:
            w = _prom_query(base, "skypurza_queue_wait_seconds_count")
            p = _prom_query(base, "skypurza_provisioning_seconds_count")
            got = (float(w[0]["value"][1]), float(p[0]["value"][1])) if w and p else None
            return got if got == (2.0, 1.0) else None

        assert _wait("Prometheus has the histograms", counts, timeout=60) == (2.0, 1.0)
        clusters = {r["metric"]["state"]: float(r["value"][1]) for r in _prom_query(base, "skypurza_clusters")}
        assert clusters == {"UP": 1.0}
        nodes = _prom_query(base, "skypurza_nodes")
        assert [(r["metric"]["infra"], float(r["value"][1])) for r in nodes] == [("local", 1.0)]
        def team_spend_matches() -> dict[str, float] | None:
            report = json.loads(spz(env, "cost-report", "--by", "team", "-o", "json").stdout)
            want: dict[str, float] = {}
            for line in report["lines"]:
                want[line["key"]] = want.get(line["key"], 0) + int(line["cost_micros"]) / 1e6
            stored = {r["metric"]["team"]: float(r["value"][1])
                      for r in _prom_query(base, "skypurza_team_spent_dollars_total")}
            return stored if want and stored == pytest.approx(want, abs=1e-6) else None

        # The local infra is free: equal, within no accrual at all, once a scrape follows the meter's tick.
        assert _wait("Prometheus's team spend equals spz cost-report", team_spend_matches, timeout=60)
        durables = {r["metric"]["consumer"] for r in _prom_query(base, "skypurza_consumer_pending_messages")}
        assert {naming.consumer("metrics", s) for s in ("optimizer", "provisioner")} <= durables, durables

        # Every dashboard panel's query runs on this Prometheus: none fails, and each that a plane
        # which ran jobs must have data for has some (services/observability/dashboards.py).
        from skypurza.services.observability.dashboards import targets

        time.sleep(3)  # rate() and increase() need two scrapes inside their window
        empty = []
        for uid, title, t in targets():
            if t.expect_data and not _wait(f"{uid} / {title}: {t.expr}", lambda: _prom_query(base, t.expr), timeout=20):
                empty.append(t.expr)
            else:
                _prom_query(base, t.expr)  # a query error fails here (status != success)
        assert not empty

        # The summary path equals the rows path on a plane with an UP, idle cluster.
        async def both():
            from skypurza.events.bus import Bus
            from skypurza.services.observability.service import ObservabilityService

            bus = await Bus.connect(f"nats://127.0.0.1:{env['SKYPURZA_NATS_PORT']}", "metrics", source="/tests")
            try:
                svc = ObservabilityService(MetricsSettings(port=0))
                svc.bus = bus
                return await svc.snapshot(), await svc.snapshot_rows()
            finally:
                await bus.close()

        fast, rows = asyncio.run(both())
        vf, vr = _values(families(fast, 100)), _values(families(rows, 100))
        assert ("skypurza_oldest_idle_cluster_without_autostop_timestamp_seconds", ()) in vr
        assert {k: v for k, v in vf.items() if k in vr} == pytest.approx(vr)
        assert [dict(k[1])["cluster"] for k in vf if k[0] == "skypurza_cost_rate_dollars_per_hour"] == ["mc"]

        # spz top, one frame for a script: the cluster, its $/h (free: 0.00), no job running.
        r = spz(env, "top", "--once", "-o", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        top = json.loads(r.stdout)
        assert [c["name"] for c in top["clusters"]] == ["mc"] and top["totals"]["up"] == 1
        assert top["totals"]["rate_usd_per_hour"] == "0.00" and top["totals"]["jobs_running"] == 0
        r = spz(env, "top", "--once")
        assert r.returncode == 0 and "mc" in r.stdout and "Clusters" in r.stdout, r.stdout + r.stderr
        # A job running now: top counts it, and cost-report --live has its line (the local infra is free).
        assert spz(env, "exec", "mc", "-d", "sleep 30", timeout=120).returncode == 0

        def running() -> dict | None:
            f = json.loads(spz(env, "top", "--once", "-o", "json").stdout)
            return f if f["totals"]["jobs_running"] == 1 else None

        top = _wait("spz top sees the job running", running, timeout=60)
        assert [(j["cluster"], j["job_id"]) for j in top["jobs"]] == [("mc", 3)]
        r = spz(env, "cost-report", "--live", "-o", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        live = json.loads(r.stdout)
        assert [(x["job"], x["kind"], x["estimate"], float(x["cost_usd"])) for x in live["lines"]] == \
            [("mc/3", "cluster", True, 0.0)]
        assert spz(env, "cost-report", "--live", "--days", "2").returncode != 0  # --live is now: no range
        assert spz(env, "down", "-y", "mc", timeout=120).returncode == 0


def test_the_summary_path_gives_what_the_rows_path_gives(plane, nats_server) -> None:
    """The endpoint asks the projections for aggregates (status `metrics_summary`, ledger
    `spend_summary`); the first path (every cluster, job and cost report) is the reference."""
    from skypurza.services.observability.service import ObservabilityService

    async def both():
        bus = await connect_bus(nats_server)
        try:
            svc = ObservabilityService(MetricsSettings(port=0, max_series=3))
            svc.bus = bus
            fast, rows = await svc.snapshot(), await svc.snapshot_rows()
            # the rows path reads one cost report per dimension; the job dimension is the summary's
            return fast, rows, await lq.cost_report(bus, by="team")
        finally:
            await bus.close()

    fast, rows, report = asyncio.run(both())
    assert fast.sources == rows.sources == {"status": True, "ledger": True, "jetstream": True}
    vf, vr = _values(families(fast, 3)), _values(families(rows, 3))
    job_keys = {k for k in vf if k[0].startswith(("skypurza_job_", "skypurza_team_paid"))}
    assert {k: v for k, v in vf.items() if k not in job_keys} == pytest.approx(vr)
    # ...over a history with something in each family the summaries compute
    assert vf[("skypurza_clusters", (("state", "TERMINATED"),))] >= 2 and vf[("skypurza_clusters", (("state", "INIT"),))] == 1
    assert len({k for k in vf if k[0] == "skypurza_jobs"}) >= 4
    assert vf[("skypurza_managed_jobs", (("state", "CANCELLED"),))] == 1
    assert vf[("skypurza_queue_wait_seconds_count", ())] > 0
    # Every dollar lands on some job key ("(none)": a cluster no managed job launched).
    total = int(report["total"]["cost_micros"]) / 1e6
    assert total > 0
    assert sum(v for k, v in vf.items() if k[0] == "skypurza_job_spent_dollars_total") == pytest.approx(total)
