"""The scrape's page encoded run by run (services/observability/render.py): a summary whose answer
did not change reuses its encoding, the page is byte for byte what encoding every family at once
gives (both formats), and a scrape after new events shows them — pure, then on a real nats-server
with the real status, ledger and observability services."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from nats_fixtures import connect_bus
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from skypurza.events import ledger_queries as lq
from skypurza.events import status_queries as sq
from skypurza.events.models import (ClusterProvisioned, JobQueued, JobStarted, JobSucceeded, PlacementChosen,
                                    TaskSubmitted)
from skypurza.events.types import Candidate, NodeInfo
from skypurza.services.observability import render
from skypurza.services.observability.samples import Segment, Snapshot, families, segments
from skypurza.services.observability.settings import MetricsSettings

OM = "application/openmetrics-text; version=1.0.0"
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _gauge(name: str, value: float) -> list:
    g = GaugeMetricFamily(name, f"{name} doc", labels=["k"])
    g.add_metric(["a"], value)
    return [g]


def test_an_unchanged_run_is_reused_and_a_changed_one_rebuilt():
    built: list[str] = []

    def run(name: str, key, value: float) -> Segment:
        return Segment(name, key, lambda: (built.append(name), _gauge(f"spz_{name}", value))[1])

    cache = render.PageCache()
    for accept in (None, OM):
        first, _ = cache.page([run("summary", {"n": 1}, 1.0), run("rest", None, 5.0)], accept)
        again, _ = cache.page([run("summary", {"n": 1}, 1.0), run("rest", None, 5.0)], accept)
        assert again == first
    assert built == ["summary", "rest", "rest", "summary", "rest", "rest"]  # per content type; rest every time
    changed, _ = cache.page([run("summary", {"n": 2}, 2.0), run("rest", None, 5.0)], None)
    assert b'spz_summary{k="a"} 2.0' in changed and b'spz_summary{k="a"} 1.0' not in changed
    assert (cache.hits, cache.misses) == (2, 3)


def _snapshot(rate_rows: list[list]) -> Snapshot:
    summary = {"clusters_by_state": [["UP", 2], ["TERMINATED", 1]], "jobs_by_state": [["RUNNING", 3]],
               "nodes": [["aws", "us-east-1", "g5.xlarge", "spot", 2]], "rate": rate_rows,
               "queue_wait": {"buckets": [0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400],
                              "cumulative": [0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3], "count": 3, "sum": 7.5},
               "oldest_idle_without_autostop": None, "oldest_pending": 1.7e9, "managed_by_state": [["RUNNING", 1]],
               "managed_recoveries": [2, 1]}
    spend = {"by": {"team": [{"key": "ml", "cost_micros": 2_500_000, "gpu_seconds": 7200}],
                    "cluster": [{"key": f"c{i}", "cost_micros": 1000 * i, "gpu_seconds": 0} for i in range(8)],
                    "job": [{"key": "(none)", "cost_micros": 2_500_000, "gpu_seconds": 7200}]}}
    return Snapshot(summary=summary, spend=spend, consumers=[{"consumer": "status", "num_pending": 4}],
                    dead_letters={"ledger": 1}, last_seq=40, projections={"status": {"checkpoint": 38}},
                    sources={"status": True, "ledger": True, "jetstream": True})


@pytest.mark.parametrize("accept", [None, OM])
def test_the_page_is_what_encoding_every_family_at_once_gives(accept):
    rows = [["ml", f"u{i % 3}", "p", f"c{i}", 1_000_000 * (i + 1)] for i in range(9)]
    cache = render.PageCache()
    for snap in (_snapshot(rows), _snapshot(rows), _snapshot(rows[:4]), _snapshot(rows[:4])):
        page, ctype = cache.page(segments(snap, 5), accept)
        whole, whole_type = render.encode(families(snap, 5), accept)
        assert (page, ctype) == (whole, whole_type)
        assert page.count(b"# EOF") == (1 if accept else 0)
    assert (cache.hits, cache.misses) == (5, 3)  # summary: built twice, reused twice; spend: built once


# ---------------------------------------------------------------- the real services


def _cluster(i: int, team: str) -> list:
    name, task = f"c{i}", f"t{i}"
    cand = Candidate(infra="aws", region="us-east-1", zone="a", instance_type="g5.xlarge", accelerators={"A10G": 1},
                     use_spot=False, vcpus=4, memory_gib=16, hourly_price_micros=1_500_000, num_nodes=1)
    return [TaskSubmitted(task_id=task, cluster=name, task={"run": "x"}, user="u1", team=team),
            PlacementChosen(task_id=task, cluster=name, attempt=1, candidate=cand),
            ClusterProvisioned(cluster=name, task_id=task, placement_id=f"p{i}", candidate=cand,
                               nodes=[NodeInfo(rank=0, instance_id=f"i-{i}", private_ip="10.0.0.1", zone="a")],
                               hourly_price_micros=1_500_000, launched_at=T0, user="u1", team=team),
            JobQueued(cluster=name, job_id=1, task_id=f"{task}.1", task={"run": "x"}, user="u1"),
            JobStarted(cluster=name, job_id=1, started_at=T0 + timedelta(seconds=5))]


def _values(body: bytes) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode()) for s in f.samples}


@pytest.mark.timeout(120)
def test_a_scrape_after_new_events_shows_them(nats_server, spz_home):
    from skypurza.services.ledger.service import LedgerService
    from skypurza.services.observability.service import ObservabilityService
    from skypurza.services.status.service import StatusService

    async def scrape(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        await writer.drain()
        data = await reader.read()
        writer.close()
        return data.split(b"\r\n\r\n", 1)[1]

    async def caught_up(bus, seq: int) -> None:
        for _ in range(600):
            try:
                if (await sq.position(bus, timeout=2))["checkpoint"] >= seq and \
                        (await lq.position(bus, timeout=2))["checkpoint"] >= seq:
                    return
            except Exception:  # not answering yet
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"the status or ledger service did not reach {seq}")

    async def main():
        bus = await connect_bus(nats_server)
        stop = asyncio.Event()
        metrics = ObservabilityService(MetricsSettings(port=0))
        tasks = [asyncio.create_task(s.run(bus, stop)) for s in (StatusService(), LedgerService(tick_s=0, meter=False),
                                                                 metrics)]
        try:
            acks = await bus.publish_many(_cluster(0, "ml") + _cluster(1, "ml"))
            await caught_up(bus, acks[-1].seq)
            await metrics.serving()
            port = int(metrics.url.rsplit(":", 1)[1].split("/")[0])
            first = _values(await scrape(port))
            assert first[("skypurza_clusters", (("state", "UP"),))] == 2
            assert first[("skypurza_jobs", (("state", "RUNNING"),))] == 2
            hits = metrics.page.hits
            assert _values(await scrape(port)) == first and metrics.page.hits > hits  # nothing moved: reused
            # New events: a third cluster for another team, its job running, and c0's job done.
            acks = await bus.publish_many(_cluster(2, "vision") + [JobSucceeded(cluster="c0", job_id=1, ended_at=T0)])
            await caught_up(bus, acks[-1].seq)
            after = _values(await scrape(port))
            assert after[("skypurza_clusters", (("state", "UP"),))] == 3
            assert after[("skypurza_jobs", (("state", "RUNNING"),))] == 2
            assert after[("skypurza_jobs", (("state", "SUCCEEDED"),))] == 1
            rate = {dict(k[1])["cluster"]: (dict(k[1])["team"], v) for k, v in after.items()
                    if k[0] == "skypurza_cost_rate_dollars_per_hour"}
            assert rate == {"c0": ("ml", 1.5), "c1": ("ml", 1.5), "c2": ("vision", 1.5)}
            # ...and the page is what building every family now gives.
            whole, _ = render.encode(families(await metrics.snapshot(), metrics.settings.max_series), None)
            assert _values(whole) == after
        finally:
            stop.set()
            await asyncio.wait(tasks, timeout=20)
            await bus.close()

    asyncio.run(main())
