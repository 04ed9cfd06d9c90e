"""Kubernetes through the whole broker: optimizer and provisioner services on a real bus, the
real `kubernetes` client against emulated API servers (one per kubeconfig context), the test as
scheduler, and a test kubelet that starts each Running pod's command — our real node agent —
as a local process, so the job really runs and its output reaches the logs stream.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from agent_harness import job_end, rank_lines, wait_lines
from kube_emulator import Kubelet, KubeCluster, write_kubeconfig
from nats_fixtures import connect_bus
from provisioner_fixtures import aws_env, events_on, subject, wait_for

from skypurza.cli.serve import serve
from skypurza.events.envelope import utcnow
from skypurza.events.models import ClusterIdle, TaskSubmitted

FULL = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4"}


def spz(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["spz", *args], env=env, capture_output=True, text=True, timeout=120)


def gpu_task(infra: str | None = None) -> dict:
    res: dict = {"accelerators": "L4:1"}
    if infra:
        res["infra"] = infra
    return {"name": "k8s-e2e", "run": 'echo "hello from rank $SKYPILOT_NODE_RANK"', "num_nodes": 2, "resources": res}


@pytest.fixture
def contexts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_server):
    a, b = KubeCluster("full").start(), KubeCluster("roomy").start()
    for c in (a, b):
        c.add_node(f"{c.name}-gpu", cpus=32, memory_gib=128, gpus=4, labels=L4,
                   taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    write_kubeconfig(tmp_path / "kubeconfig", {"full": a, "roomy": b})
    for key, value in {"SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_KUBECONFIG": str(tmp_path / "kubeconfig"),
                       "SKYPURZA_K8S_CONTEXTS": "full,roomy", "SKYPURZA_K8S_PROVISION_TIMEOUT_S": "20",
                       "SKYPURZA_AGENT_NATS_URL": nats_server.url, "SKYPURZA_LIVE_SPOT_PRICES": "0",
                       "SKYPURZA_RECONCILE_INTERVAL_S": "0", "SKYPURZA_CLEANUP_INTERVAL_S": "0"}.items():
        monkeypatch.setenv(key, value)
    sched_a = a.schedule(lambda pod: FULL)
    sched_b = b.schedule(lambda pod: None)
    kubelet = Kubelet(b, tmp_path / "pods", env={"SKYPURZA_AGENT_HEARTBEAT_S": "1", "SKYPURZA_AGENT_SAMPLE_S": "0"})
    yield a, b, kubelet
    kubelet.stop()
    sched_a.stop()
    sched_b.stop()
    rejected = a.rejected() + b.rejected()
    b.stop()
    a.stop()
    assert not rejected, rejected


def test_a_full_context_fails_over_to_the_next_and_the_job_really_runs(contexts, nats_server, monkeypatch) -> None:
    full, roomy, kubelet = contexts
    monkeypatch.setenv("SKYPURZA_ENABLED_INFRAS", "kubernetes")
    submitted = TaskSubmitted(task_id="k8s-1", cluster="trainer", task=gpu_task("k8s"), num_nodes=2, user="alice")

    async def main():
        bus = await connect_bus(nats_server)
        stop, ready = asyncio.Event(), asyncio.Event()
        services = asyncio.create_task(serve(nats_server.url, "test", ["optimizer", "provisioner"], stop, ready))
        try:
            await asyncio.wait_for(ready.wait(), 30)
            await bus.publish(submitted)
            prov = await wait_for(bus, subject("cluster", "trainer", "cluster_provisioned"), timeout=40)
            end = await job_end(bus, "trainer", 1, timeout=60)
            lines = await wait_lines(bus, "trainer", 1, lambda ls: len(rank_lines(ls, 0)) >= 1 and
                                     len(rank_lines(ls, 1)) >= 1, timeout=20)
            errors = [s.event for s in await events_on(bus, subject("task", "k8s-1", "capacity_error"))]
            # The CLI, as a user runs it: logs of job 1, and a job exec'ed on the pods' agents.
            cli_env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test", "COLUMNS": "200"}
            logs = await asyncio.to_thread(spz, cli_env, "logs", "trainer", "1", "--no-follow")
            execd = await asyncio.to_thread(spz, cli_env, "exec", "trainer", "echo via-exec-on-$SKYPILOT_NODE_RANK")
            # Autostop: pods cannot be stopped, so an idle cluster's pods are deleted (as SkyPilot).
            await bus.publish(ClusterIdle(cluster="trainer", idle_since=utcnow(), idle_minutes=1, down=False))
            ended = await wait_for(bus, subject("cluster", "trainer", "cluster_terminated"), timeout=40)
            assert ended.event.reason == "autostop"
        finally:
            stop.set()
            await asyncio.wait_for(services, 20)
            await bus.close()
        return prov.event, end, lines, errors, logs, execd

    prov, end, lines, errors, logs, execd = asyncio.run(main())
    assert logs.returncode == 0 and "hello from rank 0" in logs.stdout, logs.stdout + logs.stderr
    assert execd.returncode == 0 and "via-exec-on-0" in execd.stdout, execd.stdout + execd.stderr
    assert [(e.candidate.infra, e.candidate.region, e.error_class) for e in errors] == [("kubernetes", "full", "capacity")]
    assert "Insufficient nvidia.com/gpu" in errors[0].message
    assert (prov.candidate.infra, prov.candidate.region) == ("kubernetes", "roomy") and len(prov.nodes) == 2
    assert prov.candidate.instance_type.endswith("--L4:1") and prov.hourly_price_micros == 0  # $0, as SkyPilot
    assert end.EVENT_NAME == "job_succeeded", (end, kubelet.log(prov.nodes[0].instance_id))
    assert rank_lines(lines, 0) == ["hello from rank 0"] and rank_lines(lines, 1) == ["hello from rank 1"]
    assert full.pods() == [] and roomy.pods() == [] and roomy.services() == []  # rolled back, then deleted when idle


def test_a_full_context_fails_over_to_aws(contexts, nats_server, fake_aws, monkeypatch) -> None:
    full, roomy, _ = contexts
    for key, value in aws_env(fake_aws, SKYPURZA_ENABLED_INFRAS="kubernetes,aws", SKYPURZA_K8S_CONTEXTS="full").items():
        monkeypatch.setenv(key, value)
    submitted = TaskSubmitted(task_id="k8s-2", cluster="spill", task={**gpu_task(), "num_nodes": 1}, num_nodes=1,
                              user="alice")

    async def main():
        bus = await connect_bus(nats_server)
        stop, ready = asyncio.Event(), asyncio.Event()
        services = asyncio.create_task(serve(nats_server.url, "test", ["optimizer", "provisioner"], stop, ready))
        try:
            await asyncio.wait_for(ready.wait(), 30)
            await bus.publish(submitted)
            prov = await wait_for(bus, subject("cluster", "spill", "cluster_provisioned"), timeout=40)
            chosen = [s.event for s in await events_on(bus, subject("task", "k8s-2", "placement_chosen"))]
        finally:
            stop.set()
            await asyncio.wait_for(services, 20)
            await bus.close()
        return prov.event, chosen

    prov, chosen = asyncio.run(main())
    assert [(c.candidate.infra, c.candidate.region) for c in chosen][0] == ("kubernetes", "full")
    assert prov.candidate.infra == "aws" and prov.candidate.accelerators == {"L4": 1.0}
    assert full.pods() == []
    running = fake_aws.client(prov.candidate.region).describe_instances(Filters=[
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"]
    assert [i["InstanceId"] for r in running for i in r["Instances"]] == [n.instance_id for n in prov.nodes]


@pytest.mark.timeout(150)
def test_an_evicted_pod_of_a_managed_job_is_recovered_on_new_pods(contexts, nats_server, tmp_path, monkeypatch) -> None:
    from dataclasses import replace

    from managed_fixtures import wait_status

    from skypurza.events.service import ServiceRunner
    from skypurza.services.optimizer.service import OptimizerService
    from skypurza.services.provisioner.service import ProvisionerService
    from skypurza.services.provisioner.settings import ProvisionerSettings
    from skypurza.services.recovery.service import RecoveryService
    from skypurza.services.recovery.settings import RecoverySettings
    from skypurza.services.recovery.submit import submit_managed_job

    full, roomy, kubelet = contexts
    marks = tmp_path / "first-run-marks"
    marks.mkdir()
    kubelet.env["SPZ_TEST_MARKS"] = str(marks)
    monkeypatch.setenv("SKYPURZA_K8S_CONTEXTS", "roomy")
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    run = ('if [ -f "$SPZ_TEST_MARKS/first" ]; then echo "second run"; exit 0; fi\n'
           'touch "$SPZ_TEST_MARKS/first"\nsleep 120\n')

    async def main():
        bus = await connect_bus(nats_server)
        prov = ProvisionerService(replace(ProvisionerSettings.load(), reconcile_interval_s=0, ack_wait_s=5.0))
        rec = RecoveryService(RecoverySettings(ec2_poll_s=0, heartbeat_timeout_s=4, reconcile_s=5))
        services = [OptimizerService(enabled=frozenset({"kubernetes"})), prov, rec]
        runners = [ServiceRunner(bus, s) for s in services]
        tasks = [asyncio.create_task(r.run()) for r in runners]
        try:
            task = {"name": "train", "resources": {"infra": "k8s", "accelerators": "L4:1"}, "run": run}
            await submit_managed_job(bus, name="train", tasks=[task])
            await wait_status(bus, 1, "RUNNING", timeout=40)
            for _ in range(200):
                if (marks / "first").exists():
                    break
                await asyncio.sleep(0.1)
            (pod,) = roomy.pods()
            roomy.evict(pod)
            got = await wait_status(bus, 1, "SUCCEEDED", timeout=90)
            logs = [m.data.decode() async for m in bus.replay_raw(stream=bus.logs_stream)]
            return pod, got, logs
        finally:
            for r in runners:
                r.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
            await rec.close()
            await prov.close()
            await bus.close()

    pod, got, logs = asyncio.run(main())
    statuses = [e.status for e in got]
    # The lost context is blocked first (as a preempted zone is); with no other context, the
    # strategy falls back to the task's own constraints and lands on new pods there.
    assert statuses[:3] == ["STARTING", "RUNNING", "RECOVERING"] and statuses[-2:] == ["RUNNING", "SUCCEEDED"]
    assert got[2].reason.startswith("node_lost: train-1-1: node 0") and "heartbeat" in got[2].reason
    assert pod["metadata"]["labels"]["skypurza/cluster"] == "train-1-1"
    assert any("second run" in line for line in logs)


def test_spz_reconcile_finds_and_deletes_a_pod_no_cluster_accounts_for(contexts, nats_server, tmp_path,
                                                                      monkeypatch) -> None:
    import json

    import typer
    from typer.testing import CliRunner

    from skypurza.cli import cmd_provision
    from skypurza.events.k8s_config import KubernetesSettings
    from skypurza.services.provisioner.adapter import LaunchSpec
    from skypurza.services.provisioner.k8s import KubernetesAdapter

    full, roomy, _ = contexts
    monkeypatch.setenv("SKYPURZA_K8S_CONTEXTS", "roomy")

    async def behind_our_back() -> None:
        for stage in ("test", "other"):
            a = KubernetesAdapter(KubernetesSettings.load(), nats_url="nats://x:4222", stage=stage, poll_s=0.02)
            try:
                await a.launch(LaunchSpec(stage=stage, cluster="ghost", launch_token=f"t-{stage}",
                                          instance_type="2CPU--4GB", region="roomy", infra="kubernetes"))
            finally:
                await a.close()
    asyncio.run(behind_our_back())
    for key, value in {"SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
                       "SKYPURZA_RECONCILE_GRACE_S": "0"}.items():
        monkeypatch.setenv(key, value)
    app = typer.Typer()
    app.callback()(lambda: None)
    cmd_provision.register(app)
    result = CliRunner().invoke(app, ["reconcile", "--infra", "kubernetes", "--terminate-orphans", "-o", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["errors"] == {} and "kubernetes" in report["checked"]
    ghost = [o for o in report["orphans"] if o["cluster"] == "ghost"]
    assert len(ghost) == 1 and ghost[0]["terminated"] is True
    left = [(p["metadata"]["labels"]["skypurza/stage"], p["metadata"]["name"]) for p in roomy.pods()]
    assert [stage for stage, _ in left] == ["other"]  # another stage's pod is never touched
    assert [s["metadata"]["labels"]["skypurza/stage"] for s in roomy.services()] == ["other"]
