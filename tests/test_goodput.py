"""Goodput (services/observability/goodput.py): the pure fold of node samples into useful
GPU-seconds, the ratio over the ledger's paid GPU-seconds and the idle dollars; samples the real
Sampler takes through the fake nvidia-smi; and the whole path through a real nats-server: the
status, ledger and observability services, a provisioned GPU cluster, its metered usage and its
samples on core NATS, read back from `/metrics`."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta

import pytest
from fake_gpu import install
from nats_fixtures import connect_bus
from prometheus_client.parser import text_string_to_metric_families

from skypurza.events import ledger_queries as lq
from skypurza.events import naming
from skypurza.events import status_queries as sq
from skypurza.events.models import ClusterProvisioned, UsageRecorded
from skypurza.events.nodesample import GpuSample, NodeSample
from skypurza.events.types import Candidate, NodeInfo
from skypurza.services.agent import sampling
from skypurza.services.observability import goodput as gp
from skypurza.services.observability.samples import goodput_families

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _sample(cluster: str, t: float, utils: list[float | None], rank: int = 0) -> NodeSample:
    return NodeSample(cluster=cluster, rank=rank, ts=(T0 + timedelta(seconds=t)).isoformat(),
                      gpus=[GpuSample(index=i, utilization_pct=u) for i, u in enumerate(utils)])


def test_useful_seconds_count_busy_gpus_between_samples() -> None:
    f = gp.GoodputFold(busy_pct=10.0, max_gap_s=60.0)
    gp.own(f, "train", "ml", 7)
    assert gp.observe(f, _sample("train", 0, [97, 95])) == 0  # the first sample has no interval
    assert gp.observe(f, _sample("train", 10, [97, 3])) == 10  # one GPU of two at or above 10 %
    assert gp.observe(f, _sample("train", 20, [10, 55])) == 20  # the threshold itself counts
    assert gp.observe(f, _sample("train", 15, [99, 99])) == 0  # out of order: no interval, no rewind
    assert gp.observe(f, _sample("train", 320, [99, 99])) == 120  # a silence of 300 s counts 60 s
    assert gp.observe(f, _sample("train", 330, [None, 9.9])) == 0  # [N/A] and below: idle
    assert f.useful_s == {("ml", "7"): 150.0}
    # A cluster whose provisioning the fold never saw is nobody's: "(none)", still counted.
    gp.observe(f, _sample("stray", 0, [90]))
    gp.observe(f, _sample("stray", 5, [90]))
    assert gp.by(f, "team") == {"ml": 150.0, gp.UNASSIGNED: 5.0}
    assert gp.by(f, "job") == {"7": 150.0, gp.UNASSIGNED: 5.0}


def test_the_fold_is_bounded() -> None:
    f = gp.GoodputFold()
    for i in range(gp.MAX_OWNERS + 5):
        gp.own(f, f"c{i}", "t", None)
    assert len(f.owners) == gp.MAX_OWNERS and "c0" not in f.owners
    for i in range(gp.MAX_NODES + 5):
        gp.observe(f, _sample("c", 0, [], rank=i))
    assert len(f.last_ts) == gp.MAX_NODES


def test_ratio_idle_dollars_and_the_window() -> None:
    assert gp.ratio(50, 200) == 0.25 and gp.ratio(300, 200) == 1.0 and gp.ratio(5, 0) is None
    g = gp.goodput(50, 200, 8.0)
    assert (g.ratio, g.idle_dollars) == (0.25, 6.0)  # three quarters of $8 of GPU time was idle
    assert gp.goodput(0, 0, 3.0).idle_dollars == 0.0  # nothing paid: no ratio, no idle cost
    f = gp.GoodputFold()
    # The first scrape sets the window's start: what was paid before the endpoint heard samples.
    first = gp.report(f, {"team": {"ml": (1000.0, 10.0)}, "job": {}})
    assert first["team"]["ml"].paid_s == 0 and first["team"]["ml"].ratio is None
    f.useful_s[("ml", "(none)")] = 30.0
    later = gp.report(f, {"team": {"ml": (1100.0, 12.0), "new": (40.0, 1.0)}, "job": {"(none)": (140.0, 3.0)}})
    ml = later["team"]["ml"]
    assert (ml.useful_s, ml.paid_s, ml.ratio) == (30.0, 100.0, 0.3)
    assert ml.idle_dollars == pytest.approx(2.0 * 0.7)
    assert later["team"]["new"].paid_s == 40.0 and later["team"]["new"].ratio == 0.0  # paid, never busy
    assert later["job"]["(none)"].ratio == pytest.approx(30 / 140)
    fams = {f.name: f for f in goodput_families(later, max_series=10)}
    ratio = {s.labels["team"]: s.value for s in fams["skypurza_team_goodput_ratio"].samples}
    assert ratio == {"ml": 0.3, "new": 0.0}
    idle = {s.labels["team"]: s.value for s in fams["skypurza_team_idle_gpu_dollars"].samples}
    assert idle == pytest.approx({"ml": 1.4, "new": 1.0})
    useful = {s.labels["team"]: s.value for s in fams["skypurza_team_useful_gpu_hours"].samples}
    assert useful == {"ml": 30 / 3600}


@pytest.mark.parametrize("case,busy", [("healthy", 2), ("xid79", 0)])
def test_samples_of_the_fake_nvidia_smi(case, busy, tmp_path, monkeypatch) -> None:
    """The real Sampler runs the fake nvidia-smi (tests/support/fake_gpu.py): the healthy node's
    two GPUs are busy (97 %, 95 %), the one left on the xid79 node sits at 0 %."""
    bin_dir = install(tmp_path / "bin")
    home = tmp_path / "clusters" / "c1" / "node-0"
    home.mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SPZ_FAKE_GPU_MAP", f"c1={case}")
    monkeypatch.chdir(home)
    sampler = sampling.Sampler(home)
    f = gp.GoodputFold()
    gp.own(f, "c1", "vision", 3)
    for t in (0, 10, 20):
        s = sampler.sample("c1", 0, "i-1", (T0 + timedelta(seconds=t)).isoformat(), expected_gpus=2, busy_gpus=[0, 1])
        gp.observe(f, s)
    assert gp.busy_gpus(s, f.busy_pct) == busy
    assert gp.by(f, "team") == ({"vision": 20.0 * busy} if busy else {})


# ---------------------------------------------------------------- the whole path


def _metrics(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def _get(url: str) -> str:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1].decode()


def test_goodput_on_metrics_from_samples_and_the_ledgers_usage(nats_server, spz_home) -> None:
    from skypurza.services.ledger.service import LedgerService
    from skypurza.services.observability.service import ObservabilityService
    from skypurza.services.observability.settings import MetricsSettings
    from skypurza.services.status.service import StatusService

    cand = Candidate(infra="aws", region="us-east-1", zone="a", instance_type="g5.12xlarge",
                     accelerators={"A10G": 2}, use_spot=False, vcpus=48, memory_gib=192,
                     hourly_price_micros=3_600_000, num_nodes=1)
    tres = {"cpu": 48, "mem": 196608, "node": 1, "gres/gpu": 2}
    prov = ClusterProvisioned(cluster="gp", task_id="t1", placement_id="p1", candidate=cand,
                              nodes=[NodeInfo(rank=0, instance_id="i-1", private_ip="10.0.0.1", zone="a")],
                              hourly_price_micros=3_600_000, launched_at=T0, user="ann", team="ml",
                              managed_job_id=42, tres=tres)

    def usage(a: int, b: int) -> UsageRecorded:  # $3.60/h: one micro-dollar a millisecond
        return UsageRecorded(cluster="gp", rank=0, instance_id="i-1", start=T0 + timedelta(seconds=a),
                             end=T0 + timedelta(seconds=b), instance_type="g5.12xlarge", region="us-east-1",
                             hourly_price_micros=3_600_000, cost_micros=(b - a) * 1000, tres=tres, user="ann",
                             team="ml", lifetime_id="p1")

    async def go() -> dict:
        bus = await connect_bus(nats_server)
        stop = asyncio.Event()
        status, ledger = StatusService(), LedgerService(tick_s=0, meter=False)
        metrics = ObservabilityService(MetricsSettings(port=0, busy_pct=50.0))
        tasks = [asyncio.create_task(s.run(bus, stop)) for s in (status, ledger, metrics)]
        try:
            async def caught_up(seq: int) -> None:
                for _ in range(400):
                    try:
                        if (await lq.position(bus, timeout=1))["checkpoint"] >= seq and \
                                (await sq.position(bus, timeout=1))["checkpoint"] >= seq:
                            return
                    except Exception:
                        pass
                    await asyncio.sleep(0.05)
                raise AssertionError("the projections did not catch up")

            seq = (await bus.publish_many([prov, usage(0, 100)]))[-1].seq
            await caught_up(seq)
            await metrics.serving()
            while metrics.counters.last_seq < seq or "gp" not in metrics.goodput.owners:
                await asyncio.sleep(0.05)
            before = _metrics(await _get(metrics.url))  # the window starts: 200 GPU-s paid before it
            # 100 s more paid (2 GPUs: 200 GPU-s); samples over 50 s with one GPU of two busy.
            seq = (await bus.publish_many([usage(100, 200)]))[-1].seq
            subject = naming.sample_subject(bus.stage, "gp", 0)
            for t, utils in ((100, [80, 5]), (110, [80, 5]), (120, [80, 5]), (130, [80, 5]), (140, [80, 5]),
                             (150, [80, 5])):
                await bus.nc.publish(subject, _sample("gp", t, utils).model_dump_json().encode())
            await bus.nc.publish(subject, b"not a sample")  # dropped, counted, nothing stops
            await bus.nc.flush()
            await caught_up(seq)
            for _ in range(100):
                if gp.by(metrics.goodput, "team").get("ml") == 50.0 and metrics.samples_dropped == 1:
                    break
                await asyncio.sleep(0.05)
            return {"before": before, "after": _metrics(await _get(metrics.url)), "dropped": metrics.samples_dropped}
        finally:
            stop.set()
            await asyncio.wait(tasks, timeout=20)
            await bus.close()

    r = asyncio.run(go())
    before, after = r["before"], r["after"]
    assert r["dropped"] == 1
    assert before[("skypurza_team_paid_gpu_hours_total", (("team", "ml"),))] == pytest.approx(200 / 3600)
    assert ("skypurza_team_goodput_ratio", (("team", "ml"),)) not in before  # nothing paid in the window yet
    assert after[("skypurza_team_paid_gpu_hours_total", (("team", "ml"),))] == pytest.approx(400 / 3600)
    assert after[("skypurza_job_spent_dollars_total", (("job", "42"),))] == pytest.approx(0.2)
    assert after[("skypurza_team_useful_gpu_hours_total", (("team", "ml"),))] == pytest.approx(50 / 3600)
    # 50 useful of the 200 GPU-seconds paid in the window; $0.10 of GPU node paid in it, 3/4 idle.
    assert after[("skypurza_team_goodput_ratio", (("team", "ml"),))] == pytest.approx(0.25)
    assert after[("skypurza_job_goodput_ratio", (("job", "42"),))] == pytest.approx(0.25)
    assert after[("skypurza_team_idle_gpu_dollars", (("team", "ml"),))] == pytest.approx(0.075)
