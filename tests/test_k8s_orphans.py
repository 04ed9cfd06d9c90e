"""A Kubernetes cluster's Service and Secret are never orphaned: a launch whose provisioner dies
after creating them and before its pods, never retried, leaves both; reconciliation lists the
stage's labelled Services and Secrets beside its pods, reports the ones whose cluster has no pod
and is not up per the log (OrphanFound), and deletes them with `terminate` — a live cluster's
objects, and a user's, untouched.

The decision is pure (`orphan_objects`, unit tests first); the end to end test SIGKILLs a real
provisioner process while the emulated API server refuses pod creation.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import kubernetes
from kube_emulator import KubeCluster, write_kubeconfig
from nats_fixtures import connect_bus
from provisioner_fixtures import events_on, launch, subject, wait_for

from skypurza.events import naming
from skypurza.events.agentusers import AGENT_USERS_ENV, PER_CLUSTER
from skypurza.events.k8s_config import KubernetesSettings, client_for
from skypurza.events.models import OrphanFound
from skypurza.events.types import Candidate
from skypurza.services.provisioner.adapter import OwnedObject
from skypurza.services.provisioner.backends import Backends
from skypurza.services.provisioner.k8s import KubernetesAdapter
from skypurza.services.provisioner.reconcile import object_id, orphan_objects, reconcile
from skypurza.services.provisioner.settings import ProvisionerSettings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
OLD = NOW - timedelta(hours=1)


def obj(kind: str, cluster: str | None, *, stage: str = "test", region: str = "ctx", name: str | None = None,
        created: datetime | None = OLD) -> OwnedObject:
    if name is None:
        name = (naming.k8s_service if kind == "Service" else naming.k8s_secret)(stage, cluster or "x")
    return OwnedObject(kind=kind, name=name, region=region, stage=stage, cluster=cluster, created_at=created)


def decide(objects: list[OwnedObject], **kw: object) -> list[str]:
    args: dict = {"stage": "test", "live": (), "with_nodes": (), "now": NOW, "grace_s": 600.0, **kw}
    return [object_id(o) for o in orphan_objects(objects, **args)]


# ---------------------------------------------------------------- the pure decision


def test_a_clusters_service_and_secret_without_pods_or_a_live_cluster_are_orphans() -> None:
    found = decide([obj("Secret", "gone"), obj("Service", "gone")])
    assert found == [f"secret/{naming.k8s_secret('test', 'gone')}", f"service/{naming.k8s_service('test', 'gone')}"]


def test_what_accounts_for_an_object_keeps_it() -> None:
    both = [obj("Service", "c"), obj("Secret", "c")]
    assert decide(both, live={"c"}) == []  # up per the log (even with every pod gone: vanished, not orphan)
    assert decide(both, with_nodes={("ctx", "c")}) == []  # pods (any phase): they go with their pods
    assert decide(both, busy={"c"}) == []  # this process is launching or tearing it down
    assert decide(both, unlisted={"ctx"}) == []  # its context's pods are unknown
    assert decide([obj("Service", "c", created=NOW - timedelta(seconds=30))]) == []  # its launch may be under way
    # A cluster of the same name with pods in another context accounts for nothing here.
    assert decide(both, with_nodes={("other", "c")}) == [object_id(both[1]), object_id(both[0])]
    assert decide([obj("Service", "c", created=None)]) == [object_id(obj("Service", "c"))]  # no time: old


def test_only_this_stages_objects_named_as_ours_are_ever_orphans() -> None:
    assert decide([obj("Service", "c", stage="prod")]) == []  # another stage's
    assert decide([obj("Service", None, name=naming.k8s_service("test", "x"))]) == []  # no cluster label
    # A user's object that copied our labels is not named as ours: never touched.
    assert decide([obj("Service", "c", name="my-own-service"), obj("Secret", "c", name="my-db-password")]) == []
    assert decide([obj("Secret", "c", name=naming.k8s_service("test", "c"))]) == []  # the wrong kind's name
    assert decide([obj("ConfigMap", "c", name=naming.k8s_service("test", "c"))]) == []  # not a kind of ours


# ---------------------------------------------------------------- end to end


def _provisioner(url: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "skypurza.cli.serve", "--nats", url, "--stage", "test", "--services", "provisioner"],
        env={**os.environ, **env}, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _names(items: list[dict]) -> set[str]:
    return {i["metadata"]["name"] for i in items}


def test_a_launch_killed_before_its_pods_leaves_a_service_and_secret_reconcile_finds_and_removes(
        nats_server, tmp_path: Path) -> None:
    ctx = KubeCluster("ctx").start()
    ctx.add_node("n0", cpus=32, memory_gib=128)
    sched = ctx.schedule(lambda pod: None)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", {"ctx": ctx})
    k8s_env = {"SKYPURZA_KUBECONFIG": str(kubeconfig), "SKYPURZA_K8S_CONTEXTS": "ctx"}
    env = {**k8s_env, "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_ENABLED_INFRAS": "kubernetes",
           "SKYPURZA_AGENT_NATS_URL": nats_server.url, AGENT_USERS_ENV: PER_CLUSTER,  # each cluster's Secret
           "SKYPURZA_RECONCILE_INTERVAL_S": "0", "SKYPURZA_CLEANUP_INTERVAL_S": "0",
           "SKYPURZA_K8S_PROVISION_TIMEOUT_S": "20", "SKYPURZA_PROVISIONER_TRANSIENT_BACKOFF_S": "60"}
    log = tmp_path / "provisioner.log"
    settings = KubernetesSettings.load(env=k8s_env, config={})  # type: ignore[arg-type]
    crashed_objs = {naming.k8s_service("test", "crashed"), naming.k8s_secret("test", "crashed")}
    live_objs = {naming.k8s_service("test", "live"), naming.k8s_secret("test", "live")}

    def cand() -> Candidate:
        return Candidate(infra="kubernetes", region="ctx", instance_type="2CPU--4GB", num_nodes=1)

    async def main():
        bus = await connect_bus(nats_server)
        first = _provisioner(nats_server.url, env, log)
        try:
            await launch(bus, "t-live", "live", cand())
            await wait_for(bus, subject("cluster", "live", "cluster_provisioned"), timeout=60)
            ctx.refuse_pod_creates(100)  # from now on the server cannot store a pod
            await launch(bus, "t-crashed", "crashed", cand())
            deadline = time.monotonic() + 30
            while not (crashed_objs <= _names(ctx.services() + ctx.secrets()) and ctx.pod_creates_refused()):
                assert first.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"no Service and Secret, then a pod creation: {log.read_text()}"
                await asyncio.sleep(0.02)
            first.send_signal(signal.SIGKILL)  # between its Service/Secret and its pods
            first.wait(10)
        finally:
            if first.poll() is None:
                first.kill()
        ctx.refuse_pod_creates(0)
        # A user's Service in the same namespace, one with our labels under a name of its own.
        core = kubernetes.client.CoreV1Api(client_for(settings, "ctx"))
        for name, labels in (("users-web", {}), ("users-copy", naming.k8s_labels("test", "crashed"))):
            core.create_namespaced_service("default", {"metadata": {"name": name, "labels": labels},
                                                       "spec": {"ports": [{"port": 80}]}})
        core.api_client.close()
        left = _names(ctx.services() + ctx.secrets())

        backends = Backends(ProvisionerSettings.load(env={}, config={}), stage="test",
                            overrides={"kubernetes": KubernetesAdapter(settings, stage="test", poll_s=0.02)})
        try:
            seen = await reconcile(bus, backends, grace_s=0, infras=["kubernetes"])
            after_seen = _names(ctx.services() + ctx.secrets())
            done = await reconcile(bus, backends, terminate=True, grace_s=0, infras=["kubernetes"])
            again = await reconcile(bus, backends, terminate=True, grace_s=0, infras=["kubernetes"])
        finally:
            await backends.close()
        found = [s.event for s in await events_on(bus, subject("cluster", "crashed", OrphanFound.EVENT_NAME))]
        provisioned = await events_on(bus, subject("cluster", "crashed", "cluster_provisioned"))
        await bus.close()
        return left, seen, after_seen, done, again, found, provisioned

    try:
        left, seen, after_seen, done, again, found, provisioned = asyncio.run(main())
        pods = _names(ctx.pods())
        remaining = _names(ctx.services() + ctx.secrets())
    finally:
        sched.stop()
        rejected = ctx.rejected()
        ctx.stop()
    assert not rejected, rejected
    # What the crash left: the Service and the Secret, no pod, no ClusterProvisioned.
    assert crashed_objs <= left and provisioned == []
    assert pods == {naming.k8s_pod("test", "live", 0)}
    ids = sorted(f"{k}/{n}" for k, n in (("service", naming.k8s_service("test", "crashed")),
                                        ("secret", naming.k8s_secret("test", "crashed"))))
    # Reported first (nothing deleted), as orphan pods are, and in the report's JSON.
    assert sorted(object_id(o) for o in seen.orphan_objects) == ids and seen.orphans == [] and seen.errors == {}
    assert sorted(o["instance_id"] for o in seen.to_dict()["orphans"]) == ids
    assert {o["instance_type"] for o in seen.to_dict()["orphans"]} == {"Service", "Secret"}
    assert after_seen == left
    # Then deleted with terminate; the live cluster's and the user's objects untouched.
    assert sorted(done.terminated) == ids and all(o["terminated"] for o in done.to_dict()["orphans"])
    assert remaining == live_objs | {"users-web", "users-copy"}
    assert again.orphan_objects == [] and again.terminated == []
    # Audited once per (object, action).
    assert sorted((e.instance_id, e.action) for e in found) == sorted(
        (i, a) for i in ids for a in ("reported", "terminated"))
