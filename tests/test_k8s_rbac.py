"""The shipped RBAC manifests (services/provisioner/k8s_rbac.yaml) are valid for the newest
Kubernetes, strict, and grant every call the backend makes: a launch that fails over, one that
comes up (with the cluster's own bus credentials in its Secret) and is redelivered, a listing
for reconciliation, a capacity read and a down, recorded by the emulator."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kubernetes_validate
import yaml
from kube_emulator import KubeCluster, write_kubeconfig

import skypurza.services.provisioner as provisioner
from skypurza.events.k8s_config import KubernetesSettings
from skypurza.events.natscreds import BusCredentials
from skypurza.services.provisioner.adapter import CapacityError, ClusterRef, LaunchSpec
from skypurza.services.provisioner.k8s import KubernetesAdapter

RBAC = Path(provisioner.__file__).parent / "k8s_rbac.yaml"
VERBS = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "UPDATE": "patch", "DELETE": "delete"}


def manifests() -> list[dict]:
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if d]


def test_the_rbac_manifests_are_valid_for_the_newest_kubernetes() -> None:
    docs = manifests()
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"]
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def granted() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    role = next(d for d in manifests() if d["kind"] == "Role")
    cluster = next(d for d in manifests() if d["kind"] == "ClusterRole")

    def pairs(doc: dict) -> set[tuple[str, str]]:
        return {(r, v) for rule in doc["rules"] if rule["apiGroups"] == [""] for r in rule["resources"]
                for v in rule["verbs"]}
    return pairs(role), pairs(cluster)


def test_every_call_the_backend_makes_is_granted(tmp_path: Path) -> None:
    c = KubeCluster("ctx").start()
    try:
        c.add_node("n", gpus=2, labels={"nvidia.com/gpu.product": "NVIDIA-L4"})
        write_kubeconfig(tmp_path / "kc", {"ctx": c})
        settings = KubernetesSettings.load(env={"SKYPURZA_KUBECONFIG": str(tmp_path / "kc"),
                                                "SKYPURZA_K8S_PROVISION_TIMEOUT_S": "5"}, config={})
        refuse = {"on": True}
        sched = c.schedule(lambda pod: "0/1 nodes are available: 1 Insufficient nvidia.com/gpu." if refuse["on"] else None)

        def spec(token: str) -> LaunchSpec:
            return LaunchSpec(stage="test", cluster="r", launch_token=token, instance_type="2CPU--4GB--L4:1",
                              region="ctx", num_nodes=2, infra="kubernetes",
                              bus_credentials=BusCredentials("agent@r", "pw"))

        async def main() -> None:
            a = KubernetesAdapter(settings, nats_url="nats://x:4222", stage="test", poll_s=0.02)
            try:
                try:
                    await a.launch(spec("t1"))
                except CapacityError:
                    pass
                refuse["on"] = False
                await a.launch(spec("t2"))
                await a.launch(spec("t2"))  # redelivered: the pods adopted, the Secret patched
                await a.list_owned("test")
                await a.list_owned_objects("test")
                await a.describe(ClusterRef(stage="test", cluster="r", region="ctx", infra="kubernetes"))
                await a.terminate(ClusterRef(stage="test", cluster="r", region="ctx", infra="kubernetes"))
            finally:
                await a.close()
        try:
            asyncio.run(main())
        finally:
            sched.stop()
        used = {(r.resource.plural, VERBS[r.action.name], r.namespace is not None)
                for r in c.requests() if r.resource is not None and r.action is not None}
    finally:
        c.stop()
    namespaced, cluster_wide = granted()
    assert ("pods", "create", True) in used and ("nodes", "list", False) in used  # the recording works
    assert {("secrets", "create", True), ("secrets", "patch", True), ("secrets", "delete", True)} <= used
    assert {("services", "list", True), ("secrets", "list", True)} <= used  # reconciliation's object listing
    missing = [(res, verb, ns) for res, verb, ns in sorted(used)
               if (res, verb) not in (namespaced if ns else cluster_wide)]
    assert missing == [], f"calls the Role does not grant: {missing}"
