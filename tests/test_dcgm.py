"""DCGM as the node agent's GPU source: parsing recorded `dcgmi discovery -l` / `dcgmi dmon`
outputs (pure), the sampler against a fake `dcgmi` on PATH (and its fallback to nvidia-smi when
DCGM is down, prints garbage or hangs), and real agents through the real health manager down to
GpuUnhealthy and the node drained."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_harness import events, provision, terminate, wait_events
from fake_gpu import FIXTURES, install
from managed_fixtures import until
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.models import Candidate
from skypurza.events.nodesample import decode_sample
from skypurza.events.settings import SettingsError
from skypurza.services.agent import dcgm, sampling
from skypurza.services.agent.view import ClusterView
from skypurza.services.agent.settings import AgentSettings
from skypurza.services.observability.gpuhealth.service import GpuHealthService
from skypurza.services.observability.gpuhealth.settings import HealthSettings
from skypurza.services.provisioner.local import LocalAdapter

NOW = "2026-12-01T00:00:00+00:00"


def _read(case: str, name: str) -> str:
    return (FIXTURES / case / name).read_text()


def _reading(case: str) -> dcgm.DcgmReading:
    found, errors = dcgm.parse_discovery(_read(case, "dcgm_discovery.txt"))
    assert errors == []
    return dcgm.parse_dmon(_read(case, "dcgm_dmon.txt"), found)


# ---------------------------------------------------------------- pure parsing


def test_discovery_lists_each_gpu_with_name_and_bus_id_and_stops_at_other_tables():
    found, errors = dcgm.parse_discovery(_read("healthy", "dcgm_discovery.txt"))
    assert errors == []
    assert found == {0: dcgm.DiscoveredGpu(0, "NVIDIA H100 80GB HBM3", "00000000:18:00.0"),
                     1: dcgm.DiscoveredGpu(1, "NVIDIA H100 80GB HBM3", "00000000:2A:00.0")}
    down, errors = dcgm.parse_discovery(_read("dcgm-down", "dcgm_discovery.txt"))
    assert down == {} and errors[0].startswith("Error: unable to establish a connection")


def test_healthy_dmon_rows_with_na_as_none():
    r = _reading("healthy")
    assert r.errors == [] and r.unreachable == [] and r.rows == 2
    g0, g1 = r.gpus
    assert (g0.index, g0.name, g0.pci_bus_id) == (0, "NVIDIA H100 80GB HBM3", "00000000:18:00.0")
    assert (g0.utilization_pct, g0.memory_used_mib, g0.memory_total_mib, g0.power_w, g0.temperature_c) == \
        (97.0, 61234.0, 81559.0, 512.34, 61.0)
    assert g0.ecc_uncorrected_volatile == 0 and g0.ecc_corrected_volatile == 0 and g0.xids == []
    assert g1.power_w is None and g1.ecc_uncorrected_volatile is None  # N/A is unknown, never 0
    assert g1.throttle_reasons == ["sw_power_cap"]  # DCGM prints the NVML mask in decimal


def test_ecc_dbe_and_the_last_xid():
    g0 = _reading("ecc").gpus[0]
    assert (g0.ecc_uncorrected_volatile, g0.ecc_corrected_volatile) == (2, 17)
    assert [(x.code, x.count) for x in g0.xids] == [(48, 1)]


def test_a_gpu_with_no_readings_is_unreachable_with_its_xid():
    r = _reading("xid79")
    assert [g.index for g in r.gpus] == [0]
    assert [(d.pci_bus_id, [x.code for x in d.xids]) for d in r.unreachable] == [("00000000:2A:00.0", [79])]
    assert r.errors == ["GPU 1 (00000000:2A:00.0): no readings from DCGM"]


def test_a_missing_gpu_is_simply_not_there():
    r = _reading("missing")
    assert [g.index for g in r.gpus] == [0] and r.unreachable == []


def test_garbage_short_rows_blanks_and_mig_entities_never_become_gpus():
    found = {0: dcgm.DiscoveredGpu(0, "A", "00000000:18:00.0"), 1: dcgm.DiscoveredGpu(1, "B", "00000000:2A:00.0")}
    vals = "0 50 1 2 3 4 5 6 0 0"
    text = "\n".join([
        "#Entity NVIDX GPUTL", "ID", f"GPU 0 {vals}", f"GPU 0 {vals.replace('50', '99')}",  # a duplicate row
        "GPU-I 3 " + vals, "GPU 1 1 2", "GPU x " + vals, "segfault", f"GPU 7 {vals}",
        "GPU 1 1 nan 9223372036854775792 2147483632 140737488355328.0 inf -4 N/A 0 zz"])
    r = dcgm.parse_dmon(text, found)
    assert [g.index for g in r.gpus] == [0, 1]  # GPU 7: index 0 again (its NVIDX), dropped
    assert r.gpus[0].utilization_pct == 50.0
    b = r.gpus[1]
    assert b.utilization_pct is None and b.memory_used_mib is None and b.memory_total_mib is None
    assert b.power_w is None and b.ecc_uncorrected_volatile is None and b.throttle_reasons == []
    assert r.errors == ["GPU 1 1 2", "GPU x " + vals, "segfault"]
    assert not dcgm.parse_dmon(_read("dcgm-garbage", "dcgm_dmon.txt"), found).usable


def test_field_ids_are_dcgms():
    assert dcgm.FIELD_IDS == "52,203,252,250,155,150,311,310,230,112"
    assert dcgm.DMON_ARGS == ("dmon", "-e", dcgm.FIELD_IDS, "-c", "1")


def test_gpu_source_settings_are_bounded():
    assert AgentSettings.load({}).gpu_source == "auto"
    assert AgentSettings.load({"SKYPURZA_AGENT_GPU_SOURCE": "DCGM"}).gpu_source == "dcgm"
    assert AgentSettings.load({"SKYPURZA_AGENT_GPU_SOURCE": "nvidia-smi"}).gpu_source == "nvidia-smi"
    with pytest.raises(SettingsError, match="SKYPURZA_AGENT_GPU_SOURCE"):
        AgentSettings.load({"SKYPURZA_AGENT_GPU_SOURCE": "nvml"})
    assert AgentSettings.load({"SKYPURZA_AGENT_TOOL_TIMEOUT_S": "2"}).tool_timeout_s == 2.0
    for bad in ("0", "500", "x"):
        with pytest.raises(SettingsError, match="SKYPURZA_AGENT_TOOL_TIMEOUT_S"):
            AgentSettings.load({"SKYPURZA_AGENT_TOOL_TIMEOUT_S": bad})


def test_the_rules_name_dcgm_as_the_source():
    from datetime import datetime, timezone

    from skypurza.events.nodesample import NodeSample
    from skypurza.services.observability.gpuhealth.rules import evaluate

    r = _reading("xid79")
    s = NodeSample(cluster="c", rank=0, ts=NOW, expected_gpus=2, gpus=r.gpus, unlisted=r.unreachable,
                   gpu_error=r.errors[0], gpu_source="dcgm", xid_source="dcgm")
    found = {f.rule: f for f in evaluate(s, datetime(2026, 12, 1, tzinfo=timezone.utc), {}, HealthSettings()).findings}
    assert found["xid"].detail.startswith("the GPU at 00000000:2A:00.0 (no readings from DCGM): Xid 79")
    assert found["xid"].severity == "fatal" and found["xid"].evidence["source"] == "dcgm"
    assert found["gpu_missing"].detail == "1 of 2 GPUs visible (dcgm: GPU 1 (00000000:2A:00.0): no readings from DCGM)"


# ---------------------------------------------------------------- the sampler and the fake dcgmi


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node home under clusters/c1 with the fake tools (dcgmi too) first on PATH."""
    bin_dir = install(tmp_path / "bin", dcgm=True)
    home = tmp_path / "clusters" / "c1" / "node-0"
    home.mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(home)

    def sample(case: str, sampler: sampling.Sampler | None = None, **kw):
        monkeypatch.setenv("SPZ_FAKE_GPU_MAP", f"c1={case}")
        s = sampler or sampling.Sampler(home, **kw)
        return s.sample("c1", 0, "i-1", NOW, expected_gpus=2, busy_gpus=[0])

    return sample


def test_the_sampler_reads_dcgm_when_it_answers(node):
    healthy = node("healthy")
    assert healthy.gpu_source == "dcgm" and healthy.xid_source == "dcgm+dmesg" and healthy.gpu_error == ""
    assert [g.utilization_pct for g in healthy.gpus] == [97.0, 95.0] and healthy.unlisted == []
    ecc = node("ecc")
    assert ecc.gpus[0].ecc_uncorrected_volatile == 2 and [(x.code, x.count) for x in ecc.gpus[0].xids] == [(48, 1)]
    lost = node("xid79")
    assert [g.index for g in lost.gpus] == [0] and "no readings from DCGM" in lost.gpu_error
    # DCGM's last Xid and the kernel log's line for the same device are one entry.
    assert [(d.pci_bus_id, [(x.code, x.count) for x in d.xids]) for d in lost.unlisted] == \
        [("00000000:2A:00.0", [(79, 1)])]
    assert [g.index for g in node("missing").gpus] == [0]
    forced = node("healthy", gpu_source="nvidia-smi")
    assert forced.gpu_source == "nvidia-smi" and forced.gpus[1].power_w is None


@pytest.mark.parametrize("case", ["dcgm-down", "dcgm-garbage"])
def test_a_failing_dcgm_falls_back_to_nvidia_smi_with_one_warning(case, node, caplog):
    caplog.set_level(logging.WARNING, logger="skypurza.agent")
    sampler = sampling.Sampler(Path.cwd())
    first = node(case, sampler)
    assert first.gpu_source == "nvidia-smi" and [g.utilization_pct for g in first.gpus] == [97.0, 95.0]
    assert first.xid_source == "dmesg" and first.gpu_error == ""
    for _ in range(3):
        assert node(case, sampler).gpu_source == "nvidia-smi"
    warnings = [r.getMessage() for r in caplog.records if r.name == "skypurza.agent"]
    assert len(warnings) == 1 and "reading nvidia-smi instead" in warnings[0], warnings
    # A failed DCGM is tried again after DCGM_RETRY_EVERY samples, and read when it answers.
    sampler._dcgm_skip = 0
    assert node("healthy", sampler).gpu_source == "dcgm"


def test_a_hung_dcgmi_is_killed_after_the_timeout(node, caplog, tmp_path, monkeypatch):
    caplog.set_level(logging.WARNING, logger="skypurza.agent")
    pidfile = tmp_path / "dcgmi.pid"
    monkeypatch.setenv("SPZ_FAKE_DCGM_PIDFILE", str(pidfile))
    began = time.monotonic()
    s = node("dcgm-hang", timeout_s=0.5)
    took = time.monotonic() - began
    assert s.gpu_source == "nvidia-smi" and len(s.gpus) == 2
    assert took < 5.0, took  # not the fake's 60 s
    assert any("no answer in 0.5 s" in r.getMessage() for r in caplog.records)
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left sleeping
        os.kill(int(pidfile.read_text()), 0)


def test_forced_dcgm_never_falls_back(node):
    s = node("dcgm-down", gpu_source="dcgm")
    assert s.gpu_source == "dcgm" and s.gpus == [] and s.xid_source == "dmesg"
    assert s.gpu_error.startswith("Error: unable to establish a connection")


# ---------------------------------------------------------------- the GPUs a node announces (NodeReady.gpus)


@pytest.fixture
def only_on_path(tmp_path, monkeypatch):
    """PATH holds the given fake tools and the system's (sh, grep): nothing else GPU-ish."""
    def use(*tools: str, case: str = "healthy") -> None:
        bin_dir = install(tmp_path / "only", dcgm=True)
        for name in ("nvidia-smi", "dcgmi"):
            if name not in tools:
                (bin_dir / name).unlink()
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        monkeypatch.setenv("SPZ_FAKE_GPU_DEFAULT", case)
    return use


def test_detect_gpus_asks_dcgm_and_falls_back_to_nvidia_smi(only_on_path):
    from skypurza.services.agent.gpus import detect_gpus, names_of_discovery

    only_on_path("dcgmi")  # a node with DCGM and no nvidia-smi on PATH still announces its GPUs
    assert detect_gpus() == {"H100": 2} and detect_gpus("dcgm") == {"H100": 2}
    assert detect_gpus("nvidia-smi") == {}  # forced: dcgmi is not asked
    only_on_path("dcgmi", "nvidia-smi", case="xid79")
    assert detect_gpus() == {"H100": 2}  # DCGM lists the GPU that no longer answers; nvidia-smi does not
    assert detect_gpus("nvidia-smi") == {"H100": 1}
    only_on_path("dcgmi", "nvidia-smi", case="dcgm-down")
    assert detect_gpus() == {"H100": 2}  # DCGM down: nvidia-smi answers
    assert detect_gpus("dcgm") == {}  # forced, and it did not answer: no fallback
    only_on_path()
    assert detect_gpus() == {} and detect_gpus("dcgm") == {}  # neither tool: a CPU node
    assert names_of_discovery(_read("dcgm-down", "dcgm_discovery.txt")) == {}
    assert names_of_discovery("1 GPU found.\n| 0 | Name:  |\n") == {"GPU": 1}


def test_detect_gpus_does_not_wait_for_a_hung_dcgmi(only_on_path):
    from skypurza.services.agent.gpus import detect_gpus

    only_on_path("dcgmi", "nvidia-smi", case="dcgm-hang")
    began = time.monotonic()
    assert detect_gpus(timeout_s=0.5) == {"H100": 2}  # dcgmi killed after the timeout, nvidia-smi read
    assert time.monotonic() - began < 5.0


# ---------------------------------------------------------------- real agents, the real health manager


async def _drained(bus, cluster: str) -> set[int]:
    """The ranks the cluster's agents hold drained, folding its log as an agent does."""
    view = ClusterView(cluster, 1)
    for stored in await events(bus, cluster):
        if stored.event is not None and stored.envelope is not None:
            view.apply(stored.event, stored.envelope.id, stored.envelope.time, stored.seq)
    return set(view.drained)


@pytest.mark.timeout(150)
def test_agents_reading_dcgm_are_judged_and_drained(nats_server, spz_home, tmp_path, monkeypatch):
    """Real agent processes (local infra) with the fake dcgmi on PATH, a real bus and the real GPU
    health manager: each bad DCGM fixture ends in GpuUnhealthy and NodeLost (the node drained);
    the healthy node and one whose DCGM is down (read through nvidia-smi) stay healthy."""
    cases = {"d-healthy": "healthy", "d-xid": "xid79", "d-ecc": "ecc", "d-missing": "missing",
             "d-down": "dcgm-down"}
    bin_dir = install(tmp_path / "fakebin", dcgm=True)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SPZ_FAKE_GPU_MAP", ",".join(f"{c}={v}" for c, v in cases.items()))
    monkeypatch.setenv("SKYPURZA_AGENT_SAMPLE_S", "0.3")
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.3")

    async def main():
        bus = await connect_bus(nats_server)
        health = GpuHealthService(HealthSettings())
        stop = asyncio.Event()
        samples: list = []

        async def collect(msg) -> None:
            s = decode_sample(msg.data)
            assert s is not None
            samples.append(s)

        sub = await bus.nc.subscribe(naming.samples_filter("test"), cb=collect)
        task = asyncio.create_task(health.run(bus, stop))
        adapter = LocalAdapter(nats_server.url, "test")
        try:
            for cluster in cases:
                await provision(bus, adapter, cluster, candidate=Candidate(infra="local", accelerators={"H100": 2}))
            expect = {"xid79": [("gpu_missing", None), ("xid", None)],
                      "ecc": [("ecc_uncorrected", 0), ("xid", 0)], "missing": [("gpu_missing", None)]}
            for cluster, case in cases.items():
                if case not in expect:
                    continue
                evs = await wait_events(bus, cluster, lambda evs: sorted(
                    (e.rule, e.gpu_index) for e in evs if e.EVENT_NAME == "gpu_unhealthy") == expect[case]
                    and any(e.EVENT_NAME == "node_lost" for e in evs), timeout=40)
                lost = [e for e in evs if e.EVENT_NAME == "node_lost"]
                assert lost[0].evidence["source"] == "gpu_health"
                assert await _drained(bus, cluster) == {0}  # the agents' own fold: no new job there
                if case == "xid79":
                    xid = next(e for e in evs if e.EVENT_NAME == "gpu_unhealthy" and e.rule == "xid")
                    assert xid.evidence["xid"] == 79 and xid.severity == "fatal"
                    # The agent announced what DCGM lists (2), not nvidia-smi's 1: the source choice.
                    assert [e.gpus for e in evs if e.EVENT_NAME == "node_ready"] == [{"H100": 2}]
            await until(lambda: {s.cluster for s in samples if len(s.gpus) == 2} >= {"d-healthy", "d-down"},
                        timeout=20, what="samples of the healthy nodes")
            last = {s.cluster: s for s in samples}
            assert last["d-healthy"].gpu_source == "dcgm" and last["d-healthy"].xid_source == "dcgm+dmesg"
            assert last["d-down"].gpu_source == "nvidia-smi"  # DCGM down: nvidia-smi read instead
            assert last["d-ecc"].gpu_source == "dcgm" and last["d-ecc"].gpus[0].ecc_corrected_volatile == 17
            for cluster in ("d-healthy", "d-down"):
                evs = await wait_events(bus, cluster, lambda evs: True)
                assert not [e for e in evs if e.EVENT_NAME in ("gpu_unhealthy", "node_lost")], cluster
                assert await _drained(bus, cluster) == set()
            answer = await bus.request("gpuhealth", "nodes", {"cluster": "d-xid"})
            assert answer[0]["sample"]["gpu_source"] == "dcgm"
            # `spz health` shows each node's GPU source and DCGM's corrected ECC count (table and JSON).
            env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
                   "COLUMNS": "1000"}  # one line a node (a narrower table wraps its cells)
            shown = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "skypurza.cli.main", "health"],
                                            env=env, capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0, shown.stderr
            lines = {line.split()[0]: line.split() for line in shown.stdout.splitlines()
                     if line.strip().startswith("d-")}
            assert lines["d-ecc"][4] == "dcgm" and lines["d-down"][4] == "nvidia-smi", shown.stdout
            assert "17" in lines["d-ecc"], shown.stdout  # ECC CORRECTED: GPU 0's 17, GPU 1's 0
            one = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "skypurza.cli.main", "health",
                                                           "d-ecc", "-o", "json"],
                                          env=env, capture_output=True, text=True, timeout=60)
            assert one.returncode == 0, one.stderr
            [node] = json.loads(one.stdout)
            assert (node["gpu_source"], node["ecc_corrected_volatile"]) == ("dcgm", 17)
            assert [g["ecc_corrected_volatile"] for g in node["sample"]["gpus"]] == [17, 0]
            assert {f["rule"] for f in answer[0]["findings"]} == {"xid", "gpu_missing"}
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await health.close()
            await sub.unsubscribe()
            for cluster in cases:
                await terminate(adapter, cluster)
            await bus.close()

    asyncio.run(main())


def test_a_rising_corrected_ecc_count_is_published_as_a_warning_without_a_drain(nats_server):
    """The real manager on a real bus: DCGM's corrected ECC count climbing past the configured rise
    within the window is one GpuUnhealthy warning (once), and no NodeLost: the node is not drained."""
    from skypurza.events.clock import ManualClock
    from skypurza.events.nodesample import GpuSample, NodeSample

    clock = ManualClock()
    cfg = HealthSettings.load({"SKYPURZA_GPUHEALTH_ECC_CORRECTED_RISE": "5",
                               "SKYPURZA_GPUHEALTH_ECC_CORRECTED_WINDOW_S": "600"})

    def wire(count: int) -> bytes:
        g = GpuSample(index=0, name="NVIDIA H100 80GB HBM3", ecc_corrected_volatile=count, ecc_uncorrected_volatile=0)
        return NodeSample(cluster="sbe", rank=0, ts=clock.now().isoformat(), gpus=[g], expected_gpus=1,
                          gpu_source="dcgm").model_dump_json().encode()

    async def main():
        bus = await connect_bus(nats_server)
        health = GpuHealthService(cfg, clock=clock)
        health.bus = bus
        try:
            assert await health.handle(wire(17)) == []
            clock.advance(60)
            assert await health.handle(wire(21)) == []
            clock.advance(60)
            [found] = await health.handle(wire(22))
            assert (found.rule, found.severity, found.evidence["rise"]) == ("ecc_corrected", "warning", 5)
            clock.advance(10)
            assert await health.handle(wire(40)) == []  # reported once
            evs = await wait_events(bus, "sbe", lambda evs: any(e.EVENT_NAME == "gpu_unhealthy" for e in evs))
            assert [(e.rule, e.severity, e.gpu_index) for e in evs if e.EVENT_NAME == "gpu_unhealthy"] == \
                [("ecc_corrected", "warning", 0)]
            assert not [e for e in evs if e.EVENT_NAME == "node_lost"]
            assert await _drained(bus, "sbe") == set()
        finally:
            await bus.close()

    asyncio.run(main())


def test_each_nodes_lasting_conditions_are_its_own(nats_server):
    """The real manager keeps when each lasting condition began per node (one sample reads and
    replaces only its node's, not a scan of the fleet's): a node that got busy again starts its
    idle clock over while its neighbour's keeps running, and only the neighbour is reported;
    a node evicted past `max_nodes` takes its conditions with it."""
    from skypurza.events.clock import ManualClock
    from skypurza.events.nodesample import GpuSample, NodeSample

    clock = ManualClock()
    cfg = HealthSettings.load({"SKYPURZA_GPUHEALTH_IDLE_S": "600", "SKYPURZA_GPUHEALTH_MAX_NODES": "3"})

    def wire(rank: int, util: float, cluster: str = "lasting") -> bytes:
        g = GpuSample(index=0, name="NVIDIA H100 80GB HBM3", utilization_pct=util, ecc_uncorrected_volatile=0)
        return NodeSample(cluster=cluster, rank=rank, ts=clock.now().isoformat(), gpus=[g], expected_gpus=1,
                          busy_gpus=[0]).model_dump_json().encode()

    async def main():
        bus = await connect_bus(nats_server)
        health = GpuHealthService(cfg, clock=clock)
        health.bus = bus
        try:
            for rank in (1, 10):  # "lasting|1|" is a prefix of neither's keys: each its own
                assert await health.handle(wire(rank, 0.0)) == []
            clock.advance(300)
            assert await health.handle(wire(10, 90.0)) == []  # busy again: its idle clock stops
            assert set(health.since) == {("lasting", 1)}
            clock.advance(301)
            [found] = await health.handle(wire(1, 0.0))
            assert (found.rank, found.rule, found.severity) == (1, "gpu_idle", "warning")
            assert await health.handle(wire(10, 0.0)) == []  # idle for 0 s, not 601
            assert set(health.since) == {("lasting", 1), ("lasting", 10)}
            for other in ("o1", "o2"):  # two more nodes: the least recently heard (rank 1) goes
                await health.handle(wire(0, 0.0, other))
            assert ("lasting", 1) not in health.since and ("lasting", 1) not in health.nodes
            assert ("lasting", 10) in health.since
        finally:
            await bus.close()

    asyncio.run(main())
