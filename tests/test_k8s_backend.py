"""The Kubernetes backend against an emulated API server (tests/support/kube_emulator.py).

The real `kubernetes` client talks HTTP to kmock's emulator; every pod and Service it creates
is validated there with kubernetes-validate (strict, newest schema). The test plays the
scheduler and kubelet: it marks pods Running, or posts FailedScheduling Events, or evicts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube_emulator import KubeCluster, selector_matches, write_kubeconfig

from skypurza.events import naming
from skypurza.events.k8s_capacity import PodSize, context_capacity, gpu_name, parse_instance_type
from skypurza.events.k8s_config import KubernetesSettings
from skypurza.services.provisioner import k8s_errors, k8s_manifest
from skypurza.services.provisioner.adapter import (
    CapacityError,
    ClusterRef,
    FailureKind,
    FatalProvisionError,
    LaunchSpec,
    NodeState,
    find_orphans,
)
from skypurza.services.provisioner.k8s import KubernetesAdapter

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[dict[str, KubeCluster]]:
    clusters = {"gpu-a": KubeCluster("gpu-a").start(), "gpu-b": KubeCluster("gpu-b").start()}
    clusters["gpu-a"].add_node("a-gpu-0", cpus=64, memory_gib=512, gpus=8, labels=H100, taints=GPU_TAINT)
    clusters["gpu-a"].add_node("a-cpu-0", cpus=16, memory_gib=64)
    clusters["gpu-b"].add_node("b-gpu-0", cpus=32, memory_gib=256, gpus=4,
                               labels={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"})
    write_kubeconfig(tmp_path / "kubeconfig", clusters)
    yield clusters
    rejected = [r for c in clusters.values() for r in c.rejected()]
    for c in reversed(list(clusters.values())):
        c.stop()
    assert not rejected, rejected


def adapter(tmp_path: Path, **extra: object) -> KubernetesAdapter:
    settings = KubernetesSettings.load(env={"SKYPURZA_KUBECONFIG": str(tmp_path / "kubeconfig"),
                                            "SKYPURZA_K8S_CONTEXTS": "gpu-a,gpu-b",
                                            "SKYPURZA_K8S_PROVISION_TIMEOUT_S": "5", **extra}, config={})  # type: ignore[arg-type]
    return KubernetesAdapter(settings, nats_url="nats://bus.example:4222", stage="test", poll_s=0.02)


def spec(context: str = "gpu-a", nodes: int = 2, token: str = "tok-1", itype: str = "8CPU--32GB--H100:2") -> LaunchSpec:
    return LaunchSpec(stage="test", cluster="train", launch_token=token, instance_type=itype, region=context,
                      num_nodes=nodes, infra="kubernetes", job_id="1", labels={"start_seq": "7"})


def test_a_gpu_gang_comes_up_as_labelled_pods_with_selector_tolerations_and_the_agent(kube, tmp_path) -> None:
    sched = kube["gpu-a"].schedule(lambda pod: None)
    try:
        nodes = asyncio.run(_launch(adapter(tmp_path), spec()))
    finally:
        sched.stop()
    assert [n.rank for n in nodes] == [0, 1] and all(n.state is NodeState.RUNNING and n.private_ip for n in nodes)
    pods = kube["gpu-a"].pods("default")
    assert [p["metadata"]["name"] for p in pods] == [naming.k8s_pod("test", "train", r) for r in (0, 1)]
    pod = pods[0]
    assert pod["metadata"]["labels"] == {naming.K8S_LABEL_STAGE: "test", naming.K8S_LABEL_CLUSTER: "train",
                                         naming.K8S_LABEL_RANK: "0", naming.K8S_LABEL_LAUNCH_TOKEN: "tok-1",
                                         naming.K8S_LABEL_JOB: "1"}
    c = pod["spec"]["containers"][0]
    assert c["resources"]["requests"] == {"cpu": "8", "memory": "32768Mi", "nvidia.com/gpu": "2"}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                            "values": ["NVIDIA-H100-80GB-HBM3"]}]}]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert c["command"][:3] == ["python3", "-m", "skypurza.services.agent"]
    argv = c["command"][3:]
    assert argv[argv.index("--nats") + 1] == "nats://bus.example:4222" and argv[argv.index("--rank") + 1] == "0"
    assert "start_seq=7" in argv and argv[argv.index("--infra") + 1] == "kubernetes"
    (svc,) = kube["gpu-a"].services("default")
    assert svc["metadata"]["name"] == pod["spec"]["subdomain"] == naming.k8s_service("test", "train")
    assert svc["spec"]["clusterIP"] == "None"


async def _launch(a: KubernetesAdapter, s: LaunchSpec):
    try:
        return await a.launch(s)
    finally:
        await a.close()


def test_one_pod_unschedulable_rolls_the_whole_gang_back_as_a_capacity_error(kube, tmp_path) -> None:
    msg = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector."
    sched = kube["gpu-a"].schedule(lambda pod: msg if pod["metadata"]["name"].endswith("-1") else None)
    try:
        with pytest.raises(CapacityError) as info:
            asyncio.run(_launch(adapter(tmp_path), spec()))
    finally:
        sched.stop()
    assert info.value.kind is FailureKind.CAPACITY and info.value.region == "gpu-a"
    assert "Insufficient nvidia.com/gpu" in info.value.failure.message
    assert kube["gpu-a"].pods() == [] and kube["gpu-a"].services() == []


def test_an_unknown_gpu_label_is_fatal_and_pods_that_never_run_time_out(kube, tmp_path) -> None:
    sched = kube["gpu-a"].schedule(lambda pod: "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.")
    try:
        with pytest.raises(FatalProvisionError) as info:
            asyncio.run(_launch(adapter(tmp_path), spec()))
    finally:
        sched.stop()
    assert info.value.code == "GpuLabelUnknown" and "nvidia.com/gpu.product" in info.value.failure.hint
    assert kube["gpu-a"].pods() == []
    with pytest.raises(CapacityError) as late:  # nobody schedules: the provision timeout
        asyncio.run(_launch(adapter(tmp_path, SKYPURZA_K8S_PROVISION_TIMEOUT_S="1"), spec(nodes=1)))
    assert late.value.code == "LaunchTimeout" and kube["gpu-a"].pods() == []


def test_a_gpu_no_node_of_the_context_has_is_refused_before_any_pod(kube, tmp_path) -> None:
    with pytest.raises(CapacityError) as info:
        asyncio.run(_launch(adapter(tmp_path), spec(itype="8CPU--32GB--A100:1")))
    assert info.value.code == "GpuNotInContext" and kube["gpu-a"].pods() == []


def test_down_deletes_everything_and_reconcile_finds_an_orphan(kube, tmp_path) -> None:
    sched_a = kube["gpu-a"].schedule(lambda pod: None)
    sched_b = kube["gpu-b"].schedule(lambda pod: None)

    async def main():
        a = adapter(tmp_path)
        try:
            nodes = await a.launch(spec(context="gpu-b", nodes=2))
            await a.launch(LaunchSpec(stage="test", cluster="stray", launch_token="t-x", instance_type="2CPU--4GB",
                                      region="gpu-a", infra="kubernetes"))
            owned = await a.list_owned("test")
            orphans, vanished = find_orphans(owned, {"train": [n.instance_id for n in nodes]})
            assert [o.cluster for o in orphans] == ["stray"] and orphans[0].region == "gpu-a" and not vanished
            assert await a.terminate_nodes("test", orphans) == [orphans[0].instance_id]
            gone = await a.terminate(ClusterRef(stage="test", cluster="train", region="gpu-b", infra="kubernetes"))
            assert gone == sorted(n.instance_id for n in nodes)
            assert await a.list_owned("test") == []
        finally:
            await a.close()

    try:
        asyncio.run(main())
    finally:
        sched_a.stop()
        sched_b.stop()
    assert kube["gpu-b"].pods() == [] and kube["gpu-b"].services() == []
    # GKE's label picked the GPU in the second context
    assert kube["gpu-b"].rejected() == []


def test_a_relaunch_with_the_same_token_adopts_the_pods(kube, tmp_path) -> None:
    sched = kube["gpu-a"].schedule(lambda pod: None)

    async def main():
        a = adapter(tmp_path)
        try:
            first = await a.launch(spec(nodes=2))
            again = await a.launch(spec(nodes=2))
            return first, again
        finally:
            await a.close()
    try:
        first, again = asyncio.run(main())
    finally:
        sched.stop()
    assert [n.instance_id for n in first] == [n.instance_id for n in again]
    uids = {p["metadata"]["uid"] for p in kube["gpu-a"].pods()}
    assert len(uids) == 2  # not re-created


def test_an_evicted_pod_is_a_node_no_longer_alive(kube, tmp_path) -> None:
    sched = kube["gpu-a"].schedule(lambda pod: None)

    async def main():
        a = adapter(tmp_path)
        try:
            nodes = await a.launch(spec(nodes=2))
            kube["gpu-a"].evict(kube["gpu-a"].pods()[1])
            owned = await a.list_owned("test")
            return nodes, find_orphans(owned, {"train": [n.instance_id for n in nodes]})
        finally:
            await a.close()
    try:
        nodes, (orphans, vanished) = asyncio.run(main())
    finally:
        sched.stop()
    assert orphans == [] and vanished == {"train": (nodes[1].instance_id,)}


# ---------------------------------------------------------------------- the pure parts


def test_pod_config_merges_as_skypilot_merges_it() -> None:
    plan = k8s_manifest.PodPlan(stage="test", cluster="c", namespace="ns", launch_token="t", num_nodes=1,
                                size=PodSize(2, 4), image="img", nats_url="nats://x:4222", context="ctx",
                                pod_config={"metadata": {"labels": {"team": "ml"}},
                                            "spec": {"containers": [{"env": [{"name": "A", "value": "1"}],
                                                                     "volumeMounts": [{"name": "d", "mountPath": "/d"}]}],
                                                     "volumes": [{"name": "d", "emptyDir": {}}],
                                                     "tolerations": [{"key": "x", "operator": "Exists"}]}})
    pod = k8s_manifest.pod_manifest(plan, 0)
    c = pod["spec"]["containers"][0]
    assert pod["metadata"]["labels"]["team"] == "ml" and pod["metadata"]["labels"][naming.K8S_LABEL_CLUSTER] == "c"
    assert {"name": "A", "value": "1"} in c["env"] and {"name": "PYTHONUNBUFFERED", "value": "1"} in c["env"]
    assert c["volumeMounts"] == [{"name": "d", "mountPath": "/d"}] and c["image"] == "img"
    assert pod["spec"]["tolerations"] == [{"key": "x", "operator": "Exists"}]
    assert c["command"][:3] == ["python3", "-m", "skypurza.services.agent"]
    # our name and labels win over a pod_config that names them
    hostile = k8s_manifest.merge_pod_config(pod, {"metadata": {"name": "evil"}})
    assert hostile["metadata"]["name"] == "evil"  # the merge itself is SkyPilot's ...
    plan2 = k8s_manifest.PodPlan(**{**plan.__dict__, "pod_config": {"metadata": {"name": "evil"}}})
    assert k8s_manifest.pod_manifest(plan2, 0)["metadata"]["name"] == naming.k8s_pod("test", "c", 0)  # ... ours wins


def test_gpu_labels_of_each_provider_name_the_catalog_gpu() -> None:
    assert gpu_name("NVIDIA-H100-80GB-HBM3") == "H100"
    assert gpu_name("NVIDIA-A100-SXM4-80GB") == "A100-80GB"
    assert gpu_name("nvidia-tesla-a100") == "A100"
    assert gpu_name("nvidia-tesla-v100") == "V100"
    assert gpu_name("a10g") == "A10G" and gpu_name("nvidia-l40s") == "L40S" and gpu_name("nvidia-l4") == "L4"
    assert gpu_name("mystery-9000") is None
    assert parse_instance_type("8CPU--32GB--H100:2") == PodSize(8, 32, "H100", 2)
    assert parse_instance_type("0.5CPU--1GB") == PodSize(0.5, 1)
    assert parse_instance_type("m5.large") is None and parse_instance_type("9999999CPU--1GB") is None


def test_capacity_is_allocatable_minus_what_bound_pods_request() -> None:
    nodes = [{"metadata": {"name": "n1", "labels": {"karpenter.k8s.aws/instance-gpu-name": "h100"}},
              "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"}}},
             {"metadata": {"name": "down"}, "status": {"allocatable": {"cpu": "64", "memory": "1Ti"},
                                                       "conditions": [{"type": "Ready", "status": "False"}]}}]
    pods = [{"spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {
        "cpu": "3500m", "memory": "16Gi", "nvidia.com/gpu": "6"}}}]}, "status": {"phase": "Running"}},
            {"spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"cpu": "8", "nvidia.com/gpu": "2"}}}]},
             "status": {"phase": "Succeeded"}}]
    cap = context_capacity("ctx", nodes, pods)
    (n,) = cap.nodes
    assert (n.cpus, n.memory_gib, n.gpus, n.gpu) == (28.5, 112.0, 2, "H100")
    assert cap.gpus() == {"H100": 2}
    assert cap.fits(PodSize(4, 16, "H100", 1), 2) and not cap.fits(PodSize(4, 16, "H100", 2), 2)


def test_scheduling_messages_map_to_failure_kinds() -> None:
    f = k8s_errors.scheduling_failure
    assert f("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.").kind is FailureKind.CAPACITY
    assert f("0/3 nodes are available: 3 Insufficient cpu.").kind is FailureKind.CAPACITY
    assert f("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.").kind is FailureKind.INVALID
    assert f("0/1 nodes are available: 1 node(s) had untolerated taint {x: y}.").kind is FailureKind.UNSUPPORTED
    pod = {"metadata": {"name": "p"}, "status": {"phase": "Pending", "containerStatuses": [
        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}]}}
    assert k8s_errors.gang_failure([pod], []).kind is FailureKind.INVALID  # type: ignore[union-attr]
    assert k8s_errors.api_failure(403, "Forbidden", "pods is forbidden").kind is FailureKind.AUTH
    assert k8s_errors.api_failure(None, "", "refused").kind is FailureKind.TRANSIENT


def test_the_emulator_refuses_an_invalid_manifest_and_filters_by_label(kube) -> None:
    import json
    import urllib.error
    import urllib.request

    url = kube["gpu-a"].url + "/api/v1/namespaces/default/pods"
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": {"containerz": []}}
    req = urllib.request.Request(url, data=json.dumps(bad).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 422 and kube["gpu-a"].pods() == []
    kube["gpu-a"].emulator.rejected.clear()  # type: ignore[union-attr]
    assert selector_matches("a=b,c in (x,y),!d", {"a": "b", "c": "y"})
    assert not selector_matches("a=b,c notin (x,y)", {"a": "b", "c": "y"})


def test_the_tasks_own_pod_config_and_timeout_reach_the_pods(kube, tmp_path) -> None:
    from skypurza.events.models import TaskSubmitted
    from skypurza.services.provisioner import plan
    from skypurza.services.provisioner.adapter import OptionsLaunchSpec

    task = {"run": "x", "resources": {"infra": "k8s/gpu-a", "accelerators": "H100:2"},
            "config": {"kubernetes": {"provision_timeout": 30, "pod_config": {"spec": {
                "containers": [{"volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}}}}
    sub = TaskSubmitted(task_id="t", cluster="train", task=task, num_nodes=1, user="u")
    with_opts = plan.with_backend_options(spec(nodes=1), sub)
    assert isinstance(with_opts, OptionsLaunchSpec) and with_opts.options["provision_timeout"] == 30
    assert plan.with_backend_options(spec(nodes=1), TaskSubmitted(task_id="t", cluster="c", task={"run": "x"},
                                                                  num_nodes=1, user="u")) == spec(nodes=1)
    sched = kube["gpu-a"].schedule(lambda pod: None)
    try:
        asyncio.run(_launch(adapter(tmp_path, SKYPURZA_K8S_IMAGE="registry.example/spz:1"), with_opts))
    finally:
        sched.stop()
    (pod,) = kube["gpu-a"].pods()
    c = pod["spec"]["containers"][0]
    assert c["image"] == "registry.example/spz:1"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert pod["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"  # ours, after the merge


def test_the_agent_settings_reach_the_pod_env_and_pod_config_still_overrides_them(tmp_path, monkeypatch) -> None:
    from kubernetes_validate import latest_version, validate

    from skypurza.events.agentspec import AGENT_SETTING_VARS, agent_settings_env
    from skypurza.services.provisioner.backends import Backends
    from skypurza.services.provisioner.settings import ProvisionerSettings

    # What the provisioner's environment has is what its pods get (as local agents inherit it).
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "2")
    monkeypatch.setenv("SKYPURZA_AGENT_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("SKYPURZA_AGENT_SAMPLE_S", "")  # empty is unset, as the agent reads it
    monkeypatch.setenv("SKYPURZA_AGENT_NATS_URL", "nats://bus.example:4222")  # the provisioner's, not the agent's
    monkeypatch.setenv("SKYPURZA_KUBECONFIG", str(tmp_path / "kubeconfig"))
    made = Backends(ProvisionerSettings.load(), stage="test", nats_url="nats://cp:4222").get("kubernetes")
    assert made.agent_env == {"SKYPURZA_AGENT_HEARTBEAT_S": "2", "SKYPURZA_AGENT_LOG_LEVEL": "DEBUG"}
    assert made.nats_url == "nats://bus.example:4222"
    override = [{"name": "SKYPURZA_AGENT_LOG_LEVEL", "value": "WARNING"},
                {"name": "SKYPURZA_AGENT_HEARTBEAT_S", "valueFrom": {"configMapKeyRef": {"name": "agent", "key": "hb"}}},
                {"name": "EXTRA", "value": "x"}]
    plan = k8s_manifest.PodPlan(stage="test", cluster="c", namespace="ns", launch_token="t", num_nodes=1,
                                size=PodSize(2, 4), image="img", nats_url="nats://x:4222", context="ctx",
                                env=made.agent_env, pod_config={"spec": {"containers": [{"env": override}]}})
    pod = k8s_manifest.pod_manifest(plan, 0)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["SKYPURZA_AGENT_LOG_LEVEL"] == {"name": "SKYPURZA_AGENT_LOG_LEVEL", "value": "WARNING"}
    assert env["SKYPURZA_AGENT_HEARTBEAT_S"] == override[1]  # replaced whole: never value and valueFrom both
    assert env["EXTRA"]["value"] == "x" and env["PYTHONUNBUFFERED"]["value"] == "1" and "SKYPURZA_POD_IP" in env
    assert "SKYPURZA_AGENT_NATS_URL" not in env
    validate(pod, latest_version(), strict=True)
    # Without pod_config the settings are there as given.
    plain = k8s_manifest.pod_manifest(k8s_manifest.PodPlan(**{**plan.__dict__, "pod_config": {}}), 0)
    assert {"name": "SKYPURZA_AGENT_HEARTBEAT_S", "value": "2"} in plain["spec"]["containers"][0]["env"]
    # The list names every setting the agent reads, and nothing it does not.
    import re

    from skypurza.services.agent import settings as agent_settings

    read = set(re.findall(r'"(SKYPURZA_[A-Z_]+)"', Path(agent_settings.__file__).read_text()))
    assert set(AGENT_SETTING_VARS) == read
    assert agent_settings_env({"SKYPURZA_BUCKET_STORE": "dir", "OTHER": "1"}) == {"SKYPURZA_BUCKET_STORE": "dir"}


def test_one_context_away_does_not_stop_reconciling_the_others(tmp_path, nats_server) -> None:
    import socket
    from datetime import timedelta

    from nats_fixtures import connect_bus

    from skypurza.events.envelope import utcnow
    from skypurza.events.models import Candidate, ClusterProvisioned, ClusterTerminated, NodeInfo as EventNode
    from skypurza.services.provisioner.adapter import PartialListing
    from skypurza.services.provisioner.backends import Backends
    from skypurza.services.provisioner.reconcile import reconcile
    from skypurza.services.provisioner.settings import ProvisionerSettings

    class Dead:  # a context whose API server nobody answers
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"

    here = KubeCluster("here").start()
    here.add_node("n0", cpus=32, memory_gib=128)
    sched = here.schedule(lambda pod: None)
    write_kubeconfig(tmp_path / "kubeconfig", {"here": here, "gone": Dead()})  # type: ignore[dict-item]
    settings = KubernetesSettings.load(env={"SKYPURZA_KUBECONFIG": str(tmp_path / "kubeconfig"),
                                            "SKYPURZA_K8S_CONTEXTS": "gone,here"}, config={})

    def made() -> KubernetesAdapter:
        return KubernetesAdapter(settings, nats_url="nats://x:4222", stage="test", poll_s=0.02)

    def provisioned(cluster: str, context: str, pods: list[str]) -> ClusterProvisioned:
        return ClusterProvisioned(cluster=cluster, task_id=f"t-{cluster}", placement_id=f"p-{cluster}",
                                  candidate=Candidate(infra="kubernetes", region=context, num_nodes=len(pods)),
                                  nodes=[EventNode(rank=i, instance_id=p) for i, p in enumerate(pods)],
                                  hourly_price_micros=0, launched_at=utcnow() - timedelta(hours=1))

    async def main():
        bus = await connect_bus(nats_server)
        a = made()
        try:
            near = await a.launch(LaunchSpec(stage="test", cluster="near", launch_token="t-n", instance_type="2CPU--4GB",
                                             region="here", infra="kubernetes"))
            stray = await a.launch(LaunchSpec(stage="test", cluster="stray", launch_token="t-s",
                                              instance_type="2CPU--4GB", region="here", infra="kubernetes"))
            with pytest.raises(PartialListing) as partial:
                await a.list_owned("test")
        finally:
            await a.close()
        # The log: "near" lives here; "far" lives in the context that does not answer.
        await bus.publish(provisioned("near", "here", [n.instance_id for n in near]))
        await bus.publish(provisioned("far", "gone", [naming.k8s_pod("test", "far", 0)]))
        backends = Backends(ProvisionerSettings.load(env={}, config={}), stage="test", overrides={"kubernetes": made()})
        try:
            report = await reconcile(bus, backends, terminate=True, grace_s=0, infras=["kubernetes"])
        finally:
            await backends.close()
        ended = [s async for s in bus.replay(filter_subject=naming.event_subject(
            "test", "cluster", "far", ClusterTerminated.EVENT_NAME))]
        await bus.close()
        return near, stray, partial.value, report, ended

    try:
        near, stray, partial, report, ended = asyncio.run(main())
        left = sorted(p["metadata"]["name"] for p in here.pods())
    finally:
        sched.stop()
        rejected = here.rejected()
        here.stop()
    assert not rejected, rejected
    # The adapter lists the context that answers and names the one that did not.
    assert sorted(n.instance_id for n in partial.nodes) == sorted(n.instance_id for n in near + stray)
    assert list(partial.unreachable) == ["gone"] and "gone" in partial.unreachable["gone"]
    # One pass: the unreachable context reported, the orphan in the other found and deleted, and
    # the cluster of the unreachable context neither vanished nor ended.
    assert list(report.errors) == ["kubernetes/gone"], report.errors
    assert [o.instance_id for o in report.orphans] == [n.instance_id for n in stray]
    assert report.terminated == [n.instance_id for n in stray]
    assert report.vanished == {} and report.ended == [] and ended == []
    assert left == [n.instance_id for n in near]
