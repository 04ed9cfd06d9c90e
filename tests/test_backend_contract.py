"""One contract, every backend: launch, idempotent relaunch, gang rollback, down, reconcile, and
on the backends whose nodes run processes, a job run, its logs read back and a second one exec'ed.

Each backend runs against its real stand-in: `local` spawns real agent processes on a real
nats-server, `aws` talks to moto_server over HTTP (tests/support/fakeaws.py), `kubernetes`
to the emulated API server (tests/support/kube_emulator.py) with the test as its scheduler.

Another backend joins by adding one rig factory to `RIGS`: a function of the pytest request
that returns a `Rig` (its adapter, how a LaunchSpec for it looks, how to make the next gang
fail, and the error that failure must raise), declared with whether its nodes run the real node
agent (`runs_processes`: AWS on moto starts no process, so the job test is not generated for it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from skypurza.services.provisioner.adapter import (
    ALIVE_STATES,
    CapacityError,
    ClusterRef,
    ComputeBackend,
    LaunchSpec,
    NodeState,
    ProvisionError,
    find_orphans,
)

STAGE = "test"


@dataclass
class Rig:
    infra: str
    make: Callable[[], ComputeBackend]  # a fresh adapter (each test's event loop gets its own)
    spec: Callable[[str, int, str], LaunchSpec]  # (cluster, nodes, launch token) -> what to launch
    break_gang: Callable[[], None]  # the next gang launched cannot all come up
    gang_error: type[ProvisionError]  # what that launch raises
    region: str | None = None
    finalizers: list[Callable[[], None]] = field(default_factory=list)
    # Where the nodes' real agents report: makes them run (a kubelet for pods) and returns the
    # nats-server they reach. Only rigs declared `runs_processes` have one.
    agents: Callable[[], Any] | None = None


@dataclass(frozen=True)
class RigKind:
    build: Callable[[pytest.FixtureRequest], Rig]
    runs_processes: bool = True  # its nodes run the real node agent: jobs, logs, exec


# ---------------------------------------------------------------------- the rigs


def local_rig(request: pytest.FixtureRequest) -> Rig:
    from skypurza.services.provisioner.local import LocalAdapter

    nats = request.getfixturevalue("nats_server")
    root: Path = request.getfixturevalue("tmp_path") / "local"
    mp: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")

    def spec(cluster: str, nodes: int, token: str) -> LaunchSpec:
        return LaunchSpec(stage=STAGE, cluster=cluster, launch_token=token, instance_type="local", region="local",
                          num_nodes=nodes, infra="local", labels={"start_seq": "1"})

    # An agent with a setting it cannot use exits at once (exit 2): that node never comes up.
    return Rig("local", lambda: LocalAdapter(nats.url, STAGE, root, ready_timeout_s=30, kill_grace_s=1), spec,
               lambda: mp.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "not-a-number"), ProvisionError, "local",
               agents=lambda: nats)


def aws_rig(request: pytest.FixtureRequest) -> Rig:
    from provisioner_fixtures import REGION, adapter

    aws = request.getfixturevalue("fake_aws")

    def spec(cluster: str, nodes: int, token: str) -> LaunchSpec:
        return LaunchSpec(stage=STAGE, cluster=cluster, launch_token=token, instance_type="m5.large", region=REGION,
                          zone=f"{REGION}a", num_nodes=nodes, infra="aws")

    # EC2 accepts the gang, then node 1 dies at once for capacity (what AWS does).
    return Rig("aws", lambda: adapter(aws), spec, lambda: aws.add_launch_failure(1), CapacityError, REGION)


def kubernetes_rig(request: pytest.FixtureRequest) -> Rig:
    from kube_emulator import Kubelet, KubeCluster, write_kubeconfig

    from skypurza.events.k8s_config import KubernetesSettings
    from skypurza.services.provisioner.k8s import KubernetesAdapter

    tmp: Path = request.getfixturevalue("tmp_path")
    cluster = KubeCluster("ctx").start()
    cluster.add_node("n0", cpus=64, memory_gib=256, gpus=8, labels={"nvidia.com/gpu.product": "NVIDIA-L4"})
    write_kubeconfig(tmp / "kubeconfig", {"ctx": cluster})
    broken = {"on": False}
    sched = cluster.schedule(lambda pod: "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
                             if broken["on"] and pod["metadata"]["name"].endswith("-1") else None)
    settings = KubernetesSettings.load(env={"SKYPURZA_KUBECONFIG": str(tmp / "kubeconfig"),
                                            "SKYPURZA_K8S_PROVISION_TIMEOUT_S": "10"}, config={})

    def spec(name: str, nodes: int, token: str) -> LaunchSpec:
        return LaunchSpec(stage=STAGE, cluster=name, launch_token=token, instance_type="2CPU--8GB--L4:1",
                          region="ctx", num_nodes=nodes, infra="kubernetes")

    def finish() -> None:
        sched.stop()
        rejected = cluster.rejected()
        cluster.stop()
        assert not rejected, rejected  # every manifest sent was valid for the newest Kubernetes

    bus = {"url": "nats://bus:4222"}  # no agent runs unless the test asks (agents below)

    def agents() -> Any:
        # The test kubelet starts each Running pod's command, our real agent, as a local process.
        nats = request.getfixturevalue("nats_server")
        bus["url"] = nats.url
        kubelet = Kubelet(cluster, tmp / "pods", env={"SKYPURZA_AGENT_HEARTBEAT_S": "1", "SKYPURZA_AGENT_SAMPLE_S": "0"})
        rig.finalizers.insert(0, kubelet.stop)
        return nats

    rig = Rig("kubernetes", lambda: KubernetesAdapter(settings, nats_url=bus["url"], stage=STAGE, poll_s=0.02),
              spec, lambda: broken.update(on=True), CapacityError, "ctx", agents=agents)
    rig.finalizers.append(finish)
    return rig


def slurm_rig(request: pytest.FixtureRequest) -> Rig:
    """A real Slurm 22.05 over SSH (tests/support/slurm_rig.py, one per session); a gang that
    cannot come up asks for more GPUs per node than its nodes have (sbatch refuses it)."""
    from slurm_rig import CLUSTER, GPU_PARTITION

    from skypurza.services.provisioner.slurm import SlurmAdapter

    real = request.getfixturevalue("slurm_rig")
    nats = request.getfixturevalue("nats_server")
    tmp: Path = request.getfixturevalue("tmp_path")
    mp: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    mp.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    config = tmp / "slurm-config"
    config.write_text(real.slurm_config())
    broken = {"on": False}

    def spec(cluster: str, nodes: int, token: str) -> LaunchSpec:
        shape = "1cpu-500mb-H100x3" if broken["on"] else "1cpu-500mb"
        return LaunchSpec(stage=STAGE, cluster=cluster, launch_token=token, instance_type=shape, region=CLUSTER,
                          zone=GPU_PARTITION, num_nodes=nodes, infra="slurm", labels={"start_seq": "1"})

    def release() -> None:  # what a test left up would hold the session's nodes for the next one
        import json
        import subprocess

        import time

        records = (tmp / "slurm").glob("slurm/*/cluster.json")
        jobs = [str(json.loads(r.read_text()).get("slurm_job_id")) for r in records]
        if not jobs:
            return
        subprocess.run(["scancel", *jobs], env=real.env, capture_output=True, timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and subprocess.run(
                ["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"], env=real.env, capture_output=True, text=True,
                timeout=10).stdout.strip():
            time.sleep(0.1)

    rig = Rig("slurm", lambda: SlurmAdapter(nats.url, STAGE, tmp / "slurm", config_path=config,
                                            pending_timeout_s=20),
              spec, lambda: broken.update(on=True), CapacityError, CLUSTER, agents=lambda: nats)
    rig.finalizers.append(release)
    return rig


RIGS: dict[str, RigKind] = {
    "local": RigKind(local_rig), "aws": RigKind(aws_rig, runs_processes=False),
    "kubernetes": RigKind(kubernetes_rig), "slurm": RigKind(slurm_rig),
}


def _built(request: pytest.FixtureRequest) -> Iterator[Rig]:
    r = RIGS[request.param].build(request)
    yield r
    for fin in r.finalizers:
        fin()


@pytest.fixture(params=sorted(RIGS))
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    yield from _built(request)


@pytest.fixture(params=sorted(name for name, kind in RIGS.items() if kind.runs_processes))
def process_rig(request: pytest.FixtureRequest) -> Iterator[tuple[Rig, Any]]:
    """A rig whose nodes run the real agent, and the nats-server those agents report to."""
    for r in _built(request):
        assert r.agents is not None, f"{r.infra} is declared to run processes but has no agents hook"
        yield r, r.agents()


def run(rig: Rig, body: Callable[[ComputeBackend], Any]) -> Any:
    async def main() -> Any:
        backend = rig.make()
        try:
            return await body(backend)
        finally:
            await backend.close()
    return asyncio.run(main())


def ref(rig: Rig, cluster: str) -> ClusterRef:
    return ClusterRef(stage=STAGE, cluster=cluster, region=rig.region, infra=rig.infra)


async def alive(backend: ComputeBackend, cluster: str) -> list[str]:
    owned = await backend.list_owned(STAGE)
    return sorted(n.instance_id for n in owned if n.cluster == cluster and n.state in ALIVE_STATES)


# ---------------------------------------------------------------------- the contract


def test_launch_gives_every_node_ranked_and_running(rig: Rig) -> None:
    async def body(b: ComputeBackend):
        nodes = await b.launch(rig.spec("gang", 2, "tok-1"))
        described = await b.describe(ref(rig, "gang"))
        return nodes, described, await alive(b, "gang")

    nodes, described, owned = run(rig, body)
    assert [n.rank for n in nodes] == [0, 1]
    assert all(n.state is NodeState.RUNNING and n.private_ip for n in nodes)
    assert [n.instance_id for n in described] == [n.instance_id for n in nodes]
    assert owned == sorted(n.instance_id for n in nodes)


def test_a_second_launch_with_the_same_token_adopts_the_gang(rig: Rig) -> None:
    async def body(b: ComputeBackend):
        first = await b.launch(rig.spec("again", 2, "tok-same"))
        second = await b.launch(rig.spec("again", 2, "tok-same"))
        return first, second, await alive(b, "again")

    first, second, owned = run(rig, body)
    assert [n.instance_id for n in second] == [n.instance_id for n in first]
    assert len(owned) == 2


def test_a_gang_that_cannot_all_come_up_leaves_nothing(rig: Rig) -> None:
    rig.break_gang()

    async def body(b: ComputeBackend):
        with pytest.raises(ProvisionError) as info:
            await b.launch(rig.spec("broken", 2, "tok-b"))
        return info.value, await alive(b, "broken")

    err, owned = run(rig, body)
    assert isinstance(err, rig.gang_error), err
    assert owned == []


def test_down_terminates_every_node(rig: Rig) -> None:
    async def body(b: ComputeBackend):
        nodes = await b.launch(rig.spec("short", 2, "tok-d"))
        gone = await b.terminate(ref(rig, "short"))
        return nodes, gone, await alive(b, "short")

    nodes, gone, owned = run(rig, body)
    assert sorted(gone) == sorted(n.instance_id for n in nodes) and owned == []


def test_reconcile_finds_an_orphan_and_terminates_only_it(rig: Rig) -> None:
    async def body(b: ComputeBackend):
        kept = await b.launch(rig.spec("known", 1, "tok-k"))
        stray = await b.launch(rig.spec("stray", 1, "tok-s"))
        owned = await b.list_owned(STAGE)
        orphans, vanished = find_orphans(owned, {"known": [n.instance_id for n in kept]})
        done = await b.terminate_nodes(STAGE, orphans)
        return kept, stray, orphans, vanished, done, await alive(b, "known"), await alive(b, "stray")

    kept, stray, orphans, vanished, done, known_left, stray_left = run(rig, body)
    assert [o.instance_id for o in orphans] == [n.instance_id for n in stray] and not vanished
    assert done == [n.instance_id for n in stray]
    assert known_left == [n.instance_id for n in kept] and stray_left == []


def test_a_job_runs_its_logs_are_read_back_and_a_second_job_is_execd(process_rig: tuple[Rig, Any]) -> None:
    from agent_harness import job_end, rank_lines, wait_lines
    from nats_fixtures import connect_bus

    from skypurza.events.envelope import utcnow
    from skypurza.events.jobqueue import queue_job
    from skypurza.events.models import Candidate, ClusterProvisioned, NodeInfo as EventNode

    rig, nats = process_rig

    async def body(b: ComputeBackend):
        bus = await connect_bus(nats)
        try:
            nodes = await b.launch(rig.spec("work", 2, "tok-j"))
            try:
                # What the provisioner publishes after a launch, then a job as `spz launch` queues it.
                await bus.publish(ClusterProvisioned(
                    cluster="work", task_id="t-work", placement_id="p-work",
                    candidate=Candidate(infra=rig.infra, region=rig.region, num_nodes=2),
                    nodes=[EventNode(rank=n.rank or 0, instance_id=n.instance_id, private_ip=n.private_ip)
                           for n in nodes], hourly_price_micros=0, launched_at=utcnow()))
                job, _ = await queue_job(bus, cluster="work", task_id="t-1", user="u", task={
                    "num_nodes": 2, "run": 'echo "hello from rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES"'})
                first = await job_end(bus, "work", job.job_id, timeout=60)
                logs = await wait_lines(bus, "work", job.job_id,
                                        lambda ls: bool(rank_lines(ls, 0)) and bool(rank_lines(ls, 1)))
                # `spz exec`: a second job on the same nodes, its setup not run again.
                execd, _ = await queue_job(bus, cluster="work", task_id="t-2", user="u", run_setup=False, task={
                    "setup": "echo setup-must-not-run", "run": "echo exec-on-$SKYPILOT_NODE_RANK"})
                second = await job_end(bus, "work", execd.job_id, timeout=60)
                exec_logs = await wait_lines(bus, "work", execd.job_id, lambda ls: bool(rank_lines(ls, 0)))
            finally:
                gone = await b.terminate(ref(rig, "work"))
            return nodes, (job, first, logs), (execd, second, exec_logs), gone, await alive(b, "work")
        finally:
            await bus.close()

    nodes, (job, first, logs), (execd, second, exec_logs), gone, left = run(rig, body)
    assert first.EVENT_NAME == "job_succeeded", first
    assert rank_lines(logs, 0) == ["hello from rank 0 of 2"] and rank_lines(logs, 1) == ["hello from rank 1 of 2"]
    assert execd.job_id == job.job_id + 1 and second.EVENT_NAME == "job_succeeded", second
    assert rank_lines(exec_logs, 0) == ["exec-on-0"]
    assert not [x for x in exec_logs if "setup-must-not-run" in x["line"]]
    assert sorted(gone) == sorted(n.instance_id for n in nodes) and left == []
