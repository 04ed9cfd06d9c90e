"""A team's Kubernetes namespace (issue 14): its workspace's `kubernetes: {namespace}` places its
pods and Services there instead of the context's namespace.

Against the emulated API server over real HTTP (tests/support/kube_emulator.py), with the real
provisioner service on a real nats-server: two teams, one with a namespace; its pods are in it,
the other's in the context's default; the team then moves to another namespace and `down` still
removes its cluster from the namespace it was made in. Reconciliation finds a team's orphan pod
and Service in the team's namespace and deletes them there. The edges refuse a bad name with the
key named.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from kube_emulator import KubeCluster, write_kubeconfig
from nats_fixtures import connect_bus
from provisioner_fixtures import SETTINGS, running, subject, wait_for

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.k8s_config import KubernetesSettings
from skypurza.events.models import ClusterTerminated, DownRequested, PlacementChosen, TaskSubmitted
from skypurza.events.team_credentials import check_k8s_namespace, with_k8s_namespace
from skypurza.events.types import Candidate
from skypurza.services.api import directory_io
from skypurza.services.provisioner.adapter import LaunchSpec
from skypurza.services.provisioner.backends import Backends
from skypurza.services.provisioner.k8s import KubernetesAdapter
from skypurza.services.provisioner.reconcile import reconcile
from skypurza.services.provisioner.service import ProvisionerService
from skypurza.services.provisioner.settings import ProvisionerSettings


def _spz_env(nats_server, tmp_path: Path) -> dict[str, str]:
    import os

    return {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
            "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1"}


def _spz(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, text=True,
                          capture_output=True, timeout=60)


@pytest.fixture
def ctx(tmp_path: Path):
    cluster = KubeCluster("ctx").start()
    cluster.add_node("n0", cpus=32, memory_gib=128)
    sched = cluster.schedule(lambda pod: None)
    write_kubeconfig(tmp_path / "kubeconfig", {"ctx": cluster})
    yield cluster
    sched.stop()
    rejected = cluster.rejected()
    cluster.stop()
    assert not rejected, rejected


def _adapter(tmp_path: Path) -> KubernetesAdapter:
    settings = KubernetesSettings.load(env={"SKYPURZA_KUBECONFIG": str(tmp_path / "kubeconfig"),  # type: ignore[arg-type]
                                            "SKYPURZA_K8S_CONTEXTS": "ctx",
                                            "SKYPURZA_K8S_PROVISION_TIMEOUT_S": "20"}, config={})
    return KubernetesAdapter(settings, nats_url="nats://bus.example:4222", stage="test", poll_s=0.02)


async def _submit(bus: Bus, task_id: str, cluster: str, team: str) -> None:
    await bus.publish(TaskSubmitted(task_id=task_id, cluster=cluster, num_nodes=1, user="alice", team=team,
                                    task={"name": "train", "run": "echo hi"}, secrets_key=task_id))
    cand = Candidate(infra="kubernetes", region="ctx", instance_type="2CPU--4GB", num_nodes=1)
    await bus.publish(PlacementChosen(task_id=task_id, cluster=cluster, attempt=1, candidate=cand, num_nodes=1))


def _where(ctx: KubeCluster, cluster: str) -> dict[str, set[str]]:
    """Per kind, the namespaces the cluster's objects are in."""
    out: dict[str, set[str]] = {}
    for kind, objs in (("pod", ctx.pods()), ("service", ctx.services())):
        for o in objs:
            if (o["metadata"].get("labels") or {}).get(naming.K8S_LABEL_CLUSTER) == cluster:
                out.setdefault(kind, set()).add(o["metadata"]["namespace"])
    return out


def test_a_teams_pods_go_in_its_namespace_and_down_finds_them_there(nats_server, ctx: KubeCluster,
                                                                    tmp_path: Path) -> None:
    async def main() -> None:
        bus = await connect_bus(nats_server)
        await directory_io.add_team(bus, "ml", [], {}, with_k8s_namespace(None, "ml-jobs"))
        await directory_io.add_team(bus, "plain", [], {})
        svc = ProvisionerService(replace(SETTINGS), backends={"kubernetes": _adapter(tmp_path)})
        async with running(bus, svc):
            await _submit(bus, "t-ml", "c-ml", "ml")
            await _submit(bus, "t-plain", "c-plain", "plain")
            for c in ("c-ml", "c-plain"):
                await wait_for(bus, subject("cluster", c, "cluster_provisioned"), timeout=60)
            assert _where(ctx, "c-ml") == {"pod": {"ml-jobs"}, "service": {"ml-jobs"}}
            assert _where(ctx, "c-plain") == {"pod": {"default"}, "service": {"default"}}

            # The team moves to another namespace: its running cluster is still torn down where it
            # was made, and the other team's cluster is untouched.
            await directory_io.update_team(bus, "ml", k8s_namespace="ml-next")
            await bus.publish(DownRequested(cluster="c-ml"))
            ended = await wait_for(bus, subject("cluster", "c-ml", "cluster_terminated"), timeout=60)
            assert isinstance(ended.event, ClusterTerminated)
            assert ended.event.instance_ids == [naming.k8s_pod("test", "c-ml", 0)]
            assert _where(ctx, "c-ml") == {}
            assert _where(ctx, "c-plain") == {"pod": {"default"}, "service": {"default"}}
            # A new launch of the team goes in its new namespace.
            await _submit(bus, "t-ml2", "c-ml2", "ml")
            await wait_for(bus, subject("cluster", "c-ml2", "cluster_provisioned"), timeout=60)
            assert _where(ctx, "c-ml2") == {"pod": {"ml-next"}, "service": {"ml-next"}}
        await bus.close()

    asyncio.run(main())
    assert not any(r for r in ctx.requests() if getattr(r, "namespace", None) not in (None, "default", "ml-jobs",
                                                                                      "ml-next"))


def test_reconcile_finds_and_deletes_a_teams_orphans_in_its_namespace(nats_server, ctx: KubeCluster,
                                                                      tmp_path: Path) -> None:
    async def main() -> tuple[list[str], list[str]]:
        bus = await connect_bus(nats_server)
        await directory_io.add_team(bus, "ml", [], {}, with_k8s_namespace(None, "ml-jobs"))
        default = _adapter(tmp_path)
        # A launch the log never heard of (its provisioner died): pods and Service in the team's namespace.
        stray = default.in_namespace("ml-jobs")
        await stray.launch(LaunchSpec(stage="test", cluster="stray", launch_token="t-x", instance_type="2CPU--4GB",
                                      region="ctx", infra="kubernetes"))
        await stray.close()
        assert _where(ctx, "stray") == {"pod": {"ml-jobs"}, "service": {"ml-jobs"}}
        backends = Backends(ProvisionerSettings.load(env={}, config={}), stage="test",
                            overrides={"kubernetes": default})
        try:
            seen = await reconcile(bus, backends, grace_s=0, infras=["kubernetes"])
            done = await reconcile(bus, backends, terminate=True, grace_s=0, infras=["kubernetes"])
        finally:
            await backends.close()
        await bus.close()
        assert seen.errors == {} and done.errors == {}
        return [o.instance_id for o in seen.orphans], sorted(done.terminated)

    seen, terminated = asyncio.run(main())
    pod = naming.k8s_pod("test", "stray", 0)
    assert seen == [pod] and terminated == [pod]
    assert _where(ctx, "stray") == {}


@pytest.mark.parametrize("bad", ["", "ML", "-ml", "ml-", "a_b", "a.b", "x" * 64, "ml\n", "ä"])
def test_bad_namespaces_are_refused_with_the_key(bad: str) -> None:
    with pytest.raises(ValueError, match=r"credentials\.kubernetes\.namespace.*RFC 1123"):
        check_k8s_namespace(bad)
    assert check_k8s_namespace("x" * 63) == "x" * 63


def test_spz_teams_k8s_namespace_and_slurm_account_on_the_bus_and_over_http(nats_server, tmp_path: Path) -> None:
    import os

    from api_harness import Api, cli_token, problem

    env = _spz_env(nats_server, tmp_path)
    bad = _spz(env, "teams", "add", "ml", "--k8s-namespace", "ML_Jobs")
    assert bad.returncode == 2 and "credentials.kubernetes.namespace" in bad.stderr and "Traceback" not in bad.stderr
    bad = _spz(env, "teams", "add", "ml", "--slurm-account", "ML;x")
    assert bad.returncode == 2 and "credentials.slurm.account" in bad.stderr and "Traceback" not in bad.stderr
    assert _spz(env, "teams", "add", "ml", "--k8s-namespace", "ml-jobs", "--aws-profile", "ml-prod",
                "--slurm-account", "ml-gpu").returncode == 0
    rows = {r["team"]: r for r in json.loads(_spz(env, "teams", "list", "-o", "json").stdout)}
    assert rows["ml"]["credentials"] == {"aws": {"profile": "ml-prod"}, "kubernetes": {"namespace": "ml-jobs"},
                                         "slurm": {"account": "ml-gpu"}}
    assert "k8s:ml-jobs" in _spz(env, "teams", "list").stdout and "slurm:ml-gpu" in _spz(env, "teams", "list").stdout
    assert _spz(env, "teams", "update", "ml", "--slurm-account", "").returncode == 0
    # An update of one keeps the other; '' goes back to the context's own namespace.
    assert _spz(env, "teams", "update", "ml", "--aws-profile", "").returncode == 0
    rows = {r["team"]: r for r in json.loads(_spz(env, "teams", "list", "-o", "json").stdout)}
    assert rows["ml"]["credentials"] == {"kubernetes": {"namespace": "ml-jobs"}}
    assert _spz(env, "teams", "update", "ml", "--k8s-namespace", "").returncode == 0
    rows = {r["team"]: r for r in json.loads(_spz(env, "teams", "list", "-o", "json").stdout)}
    assert rows["ml"]["credentials"] == {}

    assert _spz(env, "teams", "add", "admins").returncode == 0
    root = cli_token(env, "root", "admin", team="admins")
    api = Api(nats_server, tmp_path, env={**os.environ, "SKYPURZA_NO_PLUGINS": "1"})
    try:
        made = api.http.post("/api/v1/teams", headers=api.as_(root),
                             json={"name": "cv", "credentials": {"kubernetes": {"namespace": "cv"}}})
        assert made.status_code == 201 and made.json()["credentials"] == {"kubernetes": {"namespace": "cv"}}, made.text
        for bad_ns in ({"namespace": "CV"}, {"namespace": ""}, {"namespace": "x" * 64}, {"namespace": "a", "x": 1}):
            body = problem(api.http.post("/api/v1/teams", headers=api.as_(root),
                                         json={"name": "cv2", "credentials": {"kubernetes": bad_ns}}), 422)
            assert "kubernetes" in json.dumps(body), body
        body = problem(api.http.post("/api/v1/teams", headers=api.as_(root),
                                     json={"name": "cv2", "credentials": {"slurm": {"account": "a b"}}}), 422)
        assert "slurm" in json.dumps(body), body
        # PATCH: a key left out is kept, one given as null goes back to the default.
        assert api.http.patch("/api/v1/teams/cv", headers=api.as_(root),
                              json={"credentials": {"aws": {"profile": "cv-prod"}}}).status_code == 200
        listed = {t["name"]: t for t in api.http.get("/api/v1/teams", headers=api.as_(root)).json()["teams"]}
        assert listed["cv"]["credentials"] == {"aws": {"profile": "cv-prod"}, "kubernetes": {"namespace": "cv"}}
        assert api.http.patch("/api/v1/teams/cv", headers=api.as_(root),
                              json={"credentials": {"kubernetes": None}}).status_code == 200
        listed = {t["name"]: t for t in api.http.get("/api/v1/teams", headers=api.as_(root)).json()["teams"]}
        assert listed["cv"]["credentials"] == {"aws": {"profile": "cv-prod"}}
        via = {**env, "SKYPURZA_API_SERVER": api.url, "SKYPURZA_API_TOKEN": root}
        assert _spz(via, "teams", "update", "cv", "--k8s-namespace", "cv-2", "--slurm-account", "cv").returncode == 0
        rows = {r["team"]: r for r in json.loads(_spz(via, "teams", "list", "-o", "json").stdout)}
        assert rows["cv"]["credentials"] == {"aws": {"profile": "cv-prod"}, "kubernetes": {"namespace": "cv-2"},
                                             "slurm": {"account": "cv"}}
    finally:
        out = api.close()
    assert "Traceback" not in out
