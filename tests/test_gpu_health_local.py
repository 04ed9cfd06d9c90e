"""The GPU health path end to end on a CPU machine: real agent processes (local infra) with fake
`nvidia-smi`/`dmesg` on their PATH printing recorded outputs, a real bus, the real GPU health
manager, and (second test) the real optimizer, provisioner and recovery services."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from agent_harness import provision, terminate, wait_events
from fake_gpu import install
from managed_fixtures import until, wait_status
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.models import Candidate, NodeLost
from skypurza.events.nodesample import decode_sample
from skypurza.events.service import ServiceRunner
from skypurza.services.observability.gpuhealth.service import GpuHealthService
from skypurza.services.observability.gpuhealth.settings import HealthSettings
from skypurza.services.optimizer.service import OptimizerService
from skypurza.services.provisioner.local import LocalAdapter
from skypurza.services.provisioner.service import ProvisionerService
from skypurza.services.provisioner.settings import ProvisionerSettings
from skypurza.services.recovery.service import RecoveryService
from skypurza.services.recovery.settings import RecoverySettings


def _fake_gpus(tmp_path, monkeypatch, mapping: str) -> None:
    bin_dir = install(tmp_path / "fakebin")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SPZ_FAKE_GPU_MAP", mapping)
    monkeypatch.setenv("SKYPURZA_AGENT_SAMPLE_S", "0.3")
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.3")


@pytest.mark.timeout(120)
def test_samples_arrive_and_each_bad_fixture_is_found(nats_server, spz_home, tmp_path, monkeypatch):
    cases = {"g-healthy": "healthy", "g-xid": "xid79", "g-ecc": "ecc", "g-missing": "missing"}
    _fake_gpus(tmp_path, monkeypatch, ",".join(f"{c}={v}" for c, v in cases.items()))

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
            for cluster, case in cases.items():
                if case == "healthy":
                    continue
                evs = await wait_events(bus, cluster, lambda evs: any(e.EVENT_NAME == "gpu_unhealthy" for e in evs)
                                        and any(e.EVENT_NAME == "node_lost" for e in evs), timeout=40)
                found = sorted((e.rule, e.gpu_index) for e in evs if e.EVENT_NAME == "gpu_unhealthy")
                expect = {"xid79": [("gpu_missing", None), ("xid", None)],
                          "ecc": [("ecc_uncorrected", 0), ("xid", 0)], "missing": [("gpu_missing", None)]}[case]
                await wait_events(bus, cluster, lambda evs: sorted(
                    (e.rule, e.gpu_index) for e in evs if e.EVENT_NAME == "gpu_unhealthy") == expect, timeout=10)
                lost = [e for e in evs if e.EVENT_NAME == "node_lost"]
                assert lost[0].evidence["source"] == "gpu_health", found
            # The healthy cluster sampled many times over and nothing was found there.
            await until(lambda: sum(1 for s in samples if s.cluster == "g-healthy") >= 5, timeout=20,
                        what="samples of the healthy node")
            healthy = [s for s in samples if s.cluster == "g-healthy"][-1]
            assert [g.utilization_pct for g in healthy.gpus] == [97.0, 95.0] and healthy.expected_gpus == 2
            assert healthy.memory_total_mib and healthy.xid_source == "dmesg"
            evs = await wait_events(bus, "g-healthy", lambda evs: True)
            assert not [e for e in evs if e.EVENT_NAME in ("gpu_unhealthy", "node_lost")]
            answer = await bus.request("gpuhealth", "nodes", {"cluster": "g-xid"})
            assert answer[0]["sample"]["unlisted"][0]["xids"][0]["code"] == 79
            assert {f["rule"] for f in answer[0]["findings"]} == {"xid", "gpu_missing"}
            # `spz health` (the platform's CLI plugin) shows the same, as a table and as JSON.
            env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
                   "COLUMNS": "1000"}  # one line a node (a narrower table wraps its cells)
            shown = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "skypurza.cli.main", "health"],
                                            env=env, capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0, shown.stderr
            lines = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip().startswith("g-")}
            assert "healthy" in lines.get("g-healthy", ""), shown.stdout
            assert "SOURCE" in shown.stdout and "ECC CORRECTED" in shown.stdout, shown.stdout
            assert lines["g-healthy"].split()[4] == "nvidia-smi", shown.stdout  # no dcgmi on these nodes
            assert "fatal: xid" in lines.get("g-xid", ""), shown.stdout
            one = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "skypurza.cli.main", "health",
                                                           "g-xid", "-o", "json"],
                                          env=env, capture_output=True, text=True, timeout=60)
            assert one.returncode == 0, one.stderr
            assert [(n["cluster"], n["gpu_source"], n["ecc_corrected_volatile"]) for n in json.loads(one.stdout)] == \
                [("g-xid", "nvidia-smi", None)]  # nvidia-smi's query has no corrected ECC column
            # A restarted manager reads its findings back and does not report them again.
            again = GpuHealthService(HealthSettings())
            again.bus = bus
            await again._read_back()
            assert again.reported == health.reported and len(again.reported) == 5
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await health.close()
            await sub.unsubscribe()
            for cluster in cases:
                await terminate(adapter, cluster)
            await bus.close()

    asyncio.run(main())


RUN = """
case "$PWD" in */clusters/train-1-1/*) echo "on the bad node"; sleep 120;; esac
echo "finished elsewhere"
"""


@pytest.mark.timeout(150)
def test_managed_job_on_an_xid79_node_is_recovered_on_a_new_cluster(nats_server, spz_home, tmp_path, monkeypatch):
    _fake_gpus(tmp_path, monkeypatch, "train-1-1=xid79")
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    from skypurza.services.recovery.submit import submit_managed_job

    async def main():
        bus = await connect_bus(nats_server)
        prov = ProvisionerService(replace(ProvisionerSettings(), reconcile_interval_s=0, ack_wait_s=5.0))
        rec = RecoveryService(RecoverySettings(ec2_poll_s=0, heartbeat_timeout_s=30, reconcile_s=5))
        runners = [ServiceRunner(bus, s) for s in (OptimizerService(enabled=frozenset({"local"})), prov, rec)]
        tasks = [asyncio.create_task(r.run()) for r in runners]
        health = GpuHealthService(HealthSettings())
        stop = asyncio.Event()
        tasks.append(asyncio.create_task(health.run(bus, stop)))
        try:
            await submit_managed_job(bus, name="train", tasks=[{"name": "train", "resources": {"infra": "local"},
                                                                "run": RUN}])
            got = await wait_status(bus, 1, "SUCCEEDED", timeout=90)
            statuses = [e.status for e in got]
            # The finding may come before the job runs (the agent samples from its start): either
            # way the job leaves the bad node and succeeds on a new cluster.
            assert statuses[0] == "STARTING" and statuses[-2:] == ["RUNNING", "SUCCEEDED"], statuses
            recovering = [e for e in got if e.status == "RECOVERING"]
            assert len(recovering) == 1, statuses
            lost = await bus.last_event(naming.event_subject("test", "cluster", "train-1-1", "node_lost"))
            assert isinstance(lost.event, NodeLost) and lost.event.evidence["source"] == "gpu_health"
            assert lost.event.evidence["xid"] == 79
            assert "Xid 79" in recovering[0].reason
            bad = await bus.last_event(naming.event_subject("test", "cluster", "train-1-1", "gpu_unhealthy"))
            assert bad is not None and bad.event.severity == "fatal"
            new = await bus.last_event(naming.event_subject("test", "cluster", "train-1-2", "gpu_unhealthy"))
            assert new is None  # the new cluster's node is healthy
        finally:
            stop.set()
            for r in runners:
                r.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
            await health.close()
            await rec.close()
            await prov.close()
            await bus.close()

    asyncio.run(main())
