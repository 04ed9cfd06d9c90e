"""`spz launch`'s decision (cli/launchplan.py), every branch, on clusters folded from real
events the way `read_cluster` folds the log (clusterlog.fold)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from skypurza.cli.clusterlog import Cluster, fold
from skypurza.cli.launchplan import (
    Autostop,
    QueueOn,
    StartStopped,
    SubmitNew,
    TooFewNodes,
    Wanted,
    plan_launch,
)
from skypurza.events.models import (
    AutostopSet,
    Candidate,
    ClusterProvisioned,
    ClusterStarted,
    ClusterStopped,
    ClusterTerminated,
    JobQueued,
    NodeInfo,
    NodeLost,
)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)


def cluster(*events: Any, nodes: int = 2) -> Cluster:
    provisioned = ClusterProvisioned(
        cluster="c", task_id="t", placement_id="p",
        candidate=Candidate(infra="aws", region="us-east-1", instance_type="m5.large", hourly_price_micros=96_000),
        nodes=[NodeInfo(rank=r, instance_id=f"i-{r}") for r in range(nodes)], hourly_price_micros=96_000,
        launched_at=T0)
    return fold("c", [(e, T0, i + 1) for i, e in enumerate([provisioned, *events])])


def setup_job(job_id: int, setup: str | None, run_setup: bool = True) -> JobQueued:
    task = {"run": "x", **({"setup": setup} if setup is not None else {})}
    return JobQueued(cluster="c", job_id=job_id, task_id=f"t{job_id}", task=task, run_setup=run_setup)


def test_no_cluster_is_a_new_task_with_the_tasks_nodes() -> None:
    assert plan_launch(Cluster(name="c"), Wanted(nodes=3, setup=None)) == SubmitNew("c", 3)


def test_a_terminated_cluster_is_launched_again_as_a_new_task() -> None:
    c = cluster(ClusterTerminated(cluster="c", terminated_at=T0))
    assert c.status == "TERMINATED"
    assert plan_launch(c, Wanted(nodes=1, setup="pip install x")) == SubmitNew("c", 1)


def test_a_stopped_cluster_is_started_first_then_the_job_queued_on_it() -> None:
    c = cluster(setup_job(1, "pip install x"), ClusterStopped(cluster="c", stopped_at=T0))
    wanted = Wanted(nodes=1, setup="pip install x")
    assert plan_launch(c, wanted) == StartStopped("c")
    started = cluster(setup_job(1, "pip install x"), ClusterStopped(cluster="c", stopped_at=T0),
                      ClusterStarted(cluster="c", started_at=T0, nodes=[NodeInfo(rank=0, instance_id="i-0"),
                                                                         NodeInfo(rank=1, instance_id="i-1")]))
    assert started.status == "UP"
    assert plan_launch(started, wanted) == QueueOn("c", run_setup=False, down_after=False, autostop=None)


@pytest.mark.parametrize("lost", [False, True])
def test_an_up_or_init_cluster_takes_the_job(lost: bool) -> None:
    c = cluster(*([NodeLost(cluster="c", rank=1, detected_at=T0)] if lost else []))
    assert c.status == ("INIT" if lost else "UP")
    assert plan_launch(c, Wanted(nodes=2, setup=None)) == QueueOn("c", run_setup=True, down_after=False, autostop=None)


def test_more_nodes_than_the_cluster_has_is_refused_in_words() -> None:
    plan = plan_launch(cluster(nodes=2), Wanted(nodes=4, setup=None))
    assert plan == TooFewNodes("c", needs=4, has=2)
    assert isinstance(plan, TooFewNodes) and plan.message() == "the task needs 4 nodes; cluster c has 2"


def test_setup_runs_again_only_when_it_changed_and_never_with_no_setup() -> None:
    # The last job that ran setup counts; an exec beside it (run_setup False) does not.
    c = cluster(setup_job(1, "pip install x"), setup_job(2, "something else", run_setup=False))
    same, changed = Wanted(nodes=1, setup="  pip install x\n"), Wanted(nodes=1, setup="pip install y")
    assert isinstance(p := plan_launch(c, same), QueueOn) and not p.run_setup
    assert isinstance(p := plan_launch(c, changed), QueueOn) and p.run_setup
    no_setup = Wanted(nodes=1, setup="pip install y", no_setup=True)
    assert isinstance(p := plan_launch(c, no_setup), QueueOn) and not p.run_setup
    assert isinstance(p := plan_launch(cluster(), Wanted(nodes=1, setup=None)), QueueOn) and p.run_setup


def test_autostop_and_down_on_an_existing_cluster() -> None:
    plain = cluster()
    # --down alone: down after this job.
    assert plan_launch(plain, Wanted(nodes=1, setup=None, down=True)) == QueueOn(
        "c", run_setup=True, down_after=True, autostop=None)
    # -i: the interval is set after the job is queued; down only when asked.
    assert plan_launch(plain, Wanted(nodes=1, setup=None, idle_minutes=30)) == QueueOn(
        "c", run_setup=True, down_after=False, autostop=Autostop(30, False))
    assert plan_launch(plain, Wanted(nodes=1, setup=None, idle_minutes=30, down=True)) == QueueOn(
        "c", run_setup=True, down_after=False, autostop=Autostop(30, True))
    # --down alone on a cluster with an autostop interval: down as soon as idle.
    with_autostop = cluster(AutostopSet(cluster="c", idle_minutes=10))
    assert with_autostop.idle_minutes == 10
    assert plan_launch(with_autostop, Wanted(nodes=1, setup=None, down=True)) == QueueOn(
        "c", run_setup=True, down_after=True, autostop=Autostop(0, True))


# ---------------------------------------------------------------- does the task fit the cluster (clusterfit)


def _requests(yaml_text: str):
    from skypurza.events.taskspec import loader

    return tuple(loader.load_tasks(yaml_text, filename="t.yaml").tasks[0].resource_requests())


def gpu_cluster() -> Cluster:
    provisioned = ClusterProvisioned(
        cluster="c", task_id="t", placement_id="p",
        candidate=Candidate(infra="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.12xlarge",
                            accelerators={"A10G": 4}, vcpus=48, memory_gib=192, hourly_price_micros=5_672_000),
        nodes=[NodeInfo(rank=0, instance_id="i-0")], hourly_price_micros=5_672_000, launched_at=T0)
    return fold("c", [(provisioned, T0, 1)])


@pytest.mark.parametrize("resources, fits", [
    ("{}", True),
    ("{accelerators: A10G:4}", True),
    ("{accelerators: A10G:2, cpus: 8+}", True),
    ("{accelerators: a10g:1, memory: 64+}", True),
    ("{infra: aws/us-east-1}", True),
    ("{any_of: [{accelerators: H100:8}, {accelerators: A10G:1}]}", True),  # one alternative fits
    ("{accelerators: H100:8}", False),
    ("{accelerators: A10G:8}", False),
    ("{cpus: 64}", False),
    ("{memory: 256+}", False),
    ("{infra: aws/us-west-2}", False),
    ("{infra: local}", False),
    ("{instance_type: p4d.24xlarge}", False),
    ("{use_spot: true}", False),
])
def test_a_task_is_queued_on_an_existing_cluster_only_when_it_fits(resources: str, fits: bool) -> None:
    wanted = Wanted(nodes=1, setup=None, requests=_requests(f"resources: {resources}\nrun: x\n"))
    plan = plan_launch(gpu_cluster(), wanted)
    assert isinstance(plan, QueueOn) is fits, plan
    if not fits:
        from skypurza.cli.clusterfit import Misfit

        assert isinstance(plan, Misfit)
        assert "cluster c has" in plan.message() and "spz down c" in plan.message()


def test_a_misfit_says_what_was_asked_and_what_the_cluster_has() -> None:
    from skypurza.cli.clusterfit import misfit

    m = misfit(gpu_cluster(), _requests("resources: {accelerators: H100:8}\nrun: x\n"), 1)
    assert m is not None and m.asked == "H100:8 per node" and m.has == "A10G:4 per node"
    m = misfit(gpu_cluster(), _requests("resources: {cpus: 64+}\nrun: x\n"), 1)
    assert m is not None and (m.asked, m.has) == ("64+ CPUs per node", "48 CPUs per node")


# ---------------------------------------------------------------- the API server decides with the same copy


def gpu_provisioned() -> ClusterProvisioned:
    return ClusterProvisioned(
        cluster="c", task_id="t", placement_id="p",
        candidate=Candidate(infra="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.12xlarge",
                            accelerators={"A10G": 4}, vcpus=48, memory_gib=192, hourly_price_micros=5_672_000),
        nodes=[NodeInfo(rank=0, instance_id="i-0")], hourly_price_micros=5_672_000, launched_at=T0)


@pytest.mark.parametrize("resources", ["{}", "{accelerators: A10G:2}", "{accelerators: H100:8}", "{cpus: 64}",
                                       "{infra: aws/us-west-2}", "{use_spot: true}"])
def test_the_servers_shape_of_a_cluster_gets_the_clis_verdict(resources: str) -> None:
    # POST /api/v1/clusters/{name}/jobs reads a ClusterShape of the ClusterProvisioned, the CLI
    # its own fold: events/queueplan.plan_queue says the same of both.
    from skypurza.events.clusterfit import ClusterShape
    from skypurza.events.queueplan import SetUp, plan_queue

    wanted = Wanted(nodes=1, setup="pip install x", requests=_requests(f"resources: {resources}\nrun: x\n"))
    shape = ClusterShape.of_provisioned(gpu_provisioned())
    assert (shape.num_nodes, shape.accelerators, shape.vcpus) == (1, {"A10G": 4}, 48)
    server = plan_queue(shape, SetUp(ran=True, setup="pip install x"), None, wanted)
    cli = plan_launch(fold("c", [(gpu_provisioned(), T0, 1), (setup_job(1, "pip install x"), T0, 2)]), wanted)
    assert server == cli, (server, cli)


def test_exec_never_runs_setup_and_a_changed_setup_runs_again() -> None:
    from skypurza.events.clusterfit import ClusterShape
    from skypurza.events.queueplan import SetUp, plan_queue

    shape = ClusterShape("c", 2)
    ran = SetUp(ran=True, setup="pip install x")
    assert plan_queue(shape, ran, None, Wanted(nodes=1, setup="pip install y", no_setup=True)).run_setup is False
    assert plan_queue(shape, ran, None, Wanted(nodes=1, setup="pip install y")).run_setup is True
    assert plan_queue(shape, ran, None, Wanted(nodes=1, setup="pip install x\n")).run_setup is False
    assert plan_queue(shape, SetUp(ran=False), None, Wanted(nodes=1, setup=None)).run_setup is True
    assert plan_queue(shape, ran, None, Wanted(nodes=3, setup=None)) == TooFewNodes("c", 3, 2)
