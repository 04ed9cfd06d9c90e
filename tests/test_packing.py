"""The agent's job admission (services/agent/packing.py): FIFO, packed by cpus, memory and GPUs,
fractions included, monotonic; demands and capacities from the log's own facts; and the
CUDA_VISIBLE_DEVICES each job gets from its recorded GPU indices."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skypurza.events.models import Candidate, ClusterProvisioned, JobCancelled, JobQueued, JobStarted, NodeInfo
from skypurza.events.payloads import TaskPayload
from skypurza.services.agent import envcontract as ec
from skypurza.services.agent.packing import (
    DEFAULT_CPU_DEMAND,
    Admission,
    Capacity,
    Demand,
    QueuedJob,
    admit,
    capacity_of,
    demand_of,
)
from skypurza.services.agent.view import ClusterView

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def q(job_id: int, cpus: float = DEFAULT_CPU_DEMAND, mem: float = 0.0, acc: str | None = None, count: float = 0.0,
      nodes: int = 1, started: bool = False, gpus: tuple[int, ...] | None = None) -> QueuedJob:
    return QueuedJob(job_id, Demand(cpus, mem, acc, count, nodes), started, gpus)


# ------------------------------------------------------------------------------ fit and FIFO

def test_cpu_jobs_share_a_node_while_they_fit():
    cap = Capacity(num_nodes=1, cpus=2)
    assert admit(cap, [q(1, 1), q(2, 1), q(3, 1)]) == [Admission(1), Admission(2)], "the third waits"
    assert admit(cap, [q(1, 1, started=True), q(2, 1, started=True), q(3, 1)]) == []
    assert admit(cap, [q(2, 1, started=True), q(3, 1)]) == [Admission(3)], "job 1 ended: job 3 fits"


def test_default_demand_is_half_a_cpu_as_skypilot():
    assert demand_of(TaskPayload.model_validate({"run": "x"}), Capacity()).cpus == 0.5
    cap = Capacity(num_nodes=1, cpus=1)
    assert [a.job_id for a in admit(cap, [q(1), q(2), q(3)])] == [1, 2]


def test_strict_fifo_a_later_small_job_does_not_jump_an_earlier_big_one():
    cap = Capacity(num_nodes=1, cpus=4)
    queue = [q(1, 3, started=True), q(2, 2), q(3, 1)]
    assert admit(cap, queue) == [], "job 3 would fit, but job 2 is first"
    assert admit(cap, [q(2, 2), q(3, 1)]) == [Admission(2), Admission(3)]


def test_memory_limits_too():
    cap = Capacity(num_nodes=1, cpus=8, memory_gib=16)
    assert [a.job_id for a in admit(cap, [q(1, 1, 10), q(2, 1, 10)])] == [1]
    assert [a.job_id for a in admit(cap, [q(1, 1, 8), q(2, 1, 8)])] == [1, 2]


def test_unknown_capacity_does_not_limit():
    assert [a.job_id for a in admit(Capacity(num_nodes=1), [q(1, 64), q(2, 64, 512)])] == [1, 2]


def test_multi_node_jobs_use_the_first_ranks_so_the_head_decides():
    cap = Capacity(num_nodes=2, cpus=2)
    # a 2-node job and a 1-node one: the head holds both, so 1 + 1.5 > 2
    assert [a.job_id for a in admit(cap, [q(1, 1, nodes=2), q(2, 1.5)])] == [1]
    assert [a.job_id for a in admit(cap, [q(1, 1, nodes=2), q(2, 1)])] == [1, 2]


def test_a_job_that_could_never_fit_runs_alone_and_does_not_block_for_ever():
    cap = Capacity(num_nodes=1, cpus=2)
    assert admit(cap, [q(1, 1, started=True), q(2, 8), q(3, 1)]) == [], "it waits for the cluster to empty"
    assert admit(cap, [q(2, 8), q(3, 1)]) == [Admission(2)], "then runs alone"
    assert admit(cap, [q(2, 8, started=True), q(3, 1)]) == []


def test_fractions_are_counted_exactly():
    cap = Capacity(num_nodes=1, cpus=0.3)
    assert [a.job_id for a in admit(cap, [q(1, 0.1), q(2, 0.2), q(3, 0.1)])] == [1, 2]


# ------------------------------------------------------------------------------ GPUs

def test_two_half_gpu_jobs_share_one_index_as_ray_does():
    cap = Capacity(num_nodes=1, cpus=8, accelerators={"T4": 1})
    got = admit(cap, [q(1, acc="T4", count=0.5), q(2, acc="T4", count=0.5), q(3, acc="T4", count=0.5)])
    assert got == [Admission(1, (0,)), Admission(2, (0,))], "a third half does not fit"


def test_whole_gpus_get_their_own_indices_the_lowest_free():
    cap = Capacity(num_nodes=1, cpus=32, accelerators={"A100": 4})
    got = admit(cap, [q(1, acc="A100", count=2), q(2, acc="a100", count=1), q(3, acc="A100", count=2)])
    assert got == [Admission(1, (0, 1)), Admission(2, (2,))]
    # job 1 ended: its indices are free again; job 2 keeps index 2 (recorded at its start)
    assert admit(cap, [q(2, acc="A100", count=1, started=True, gpus=(2,)), q(3, acc="A100", count=2)]) == [
        Admission(3, (0, 1))]
    # fractional jobs fill the fullest index they fit on, never one a whole-GPU job holds
    got = admit(cap, [q(2, acc="A100", count=1, started=True, gpus=(0,)), q(4, acc="A100", count=0.25,
                                                                         started=True, gpus=(2,)),
                      q(5, acc="A100", count=0.5), q(6, acc="A100", count=0.5)])
    assert got == [Admission(5, (2,)), Admission(6, (1,))]


def test_a_cpu_job_on_a_gpu_cluster_holds_no_gpu():
    cap = Capacity(num_nodes=1, cpus=8, accelerators={"T4": 1})
    assert admit(cap, [q(1, 1, acc="T4", count=1), q(2, 1)]) == [Admission(1, (0,)), Admission(2, ())]


def test_started_jobs_keep_their_indices_even_over_capacity():
    cap = Capacity(num_nodes=1, cpus=1, accelerators={"T4": 1})
    # an old log ran jobs one at a time, whatever they asked: they stay started, nothing more starts
    assert admit(cap, [q(1, 4, started=True), q(2, 0.5)]) == []


jobs = st.lists(st.tuples(st.sampled_from([0.25, 0.5, 1.0, 2.0]), st.sampled_from([0.0, 0.5, 1.0, 2.0]),
                          st.integers(1, 2)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(jobs, st.lists(st.integers(0, 7), max_size=8))
def test_admission_is_monotonic_and_never_overcommits(specs, ends):
    """Start what is admitted, end some jobs, admit again, and so on: a started job stays
    started, no started job loses its GPUs, and whatever started together fits."""
    cap = Capacity(num_nodes=2, cpus=2, accelerators={"T4": 2})
    queue = {i + 1: q(i + 1, c, 0, "T4" if g else None, g, n) for i, (c, g, n) in enumerate(specs)}
    ended: set[int] = set()
    for step in range(len(ends) + 2):
        live = [queue[j] for j in sorted(queue) if j not in ended]
        admitted = admit(cap, live)
        waiting = [j.job_id for j in live if not j.started]
        assert [a.job_id for a in admitted] == waiting[:len(admitted)], "FIFO: never a started job, never a jump"
        for a in admitted:
            queue[a.job_id] = QueuedJob(a.job_id, queue[a.job_id].demand, True, a.gpu_indices)
        assert admit(cap, [queue[j] for j in sorted(queue) if j not in ended]) == [], "nothing more until one ends"
        running = [queue[j] for j in sorted(queue) if j not in ended and queue[j].started]
        if len(running) > 1:  # (one oversized job may run alone)
            assert sum(j.demand.cpus for j in running) <= 2 + 1e-9
            per_index = [0.0, 0.0]
            for j in running:
                for i in j.gpu_indices or ():
                    per_index[i] += j.demand.accelerator_count if j.demand.accelerator_count < 1 else 1
            assert all(x <= 1 + 1e-9 for x in per_index), per_index
        if step < len(ends):
            order = sorted(j.job_id for j in running)
            if order:
                ended.add(order[ends[step] % len(order)])
    # FIFO: no job started while an earlier one still waits
    waiting = [j for j in sorted(queue) if j not in ended and not queue[j].started]
    if waiting:
        assert all(not queue[j].started for j in sorted(queue) if j > waiting[0])


# ------------------------------------------------------------------------------ from the log's facts

@pytest.mark.parametrize("resources,expected", [
    ({}, Demand()),
    ({"cpus": 1}, Demand(cpus=1)),
    ({"cpus": "2+", "memory": "8+"}, Demand(cpus=2, memory_gib=8)),
    ({"cpus": 2, "memory": "4x"}, Demand(cpus=2, memory_gib=8)),
    ({"accelerators": "T4:0.5"}, Demand(accelerator="T4", accelerator_count=0.5)),
    ({"accelerators": {"A100": 2}, "cpus": 4}, Demand(cpus=4, accelerator="A100", accelerator_count=2)),
    ({"accelerators": ["V100:4", "T4:1"]}, Demand(accelerator="T4", accelerator_count=1)),  # the cluster's
    ({"any_of": [{"accelerators": "L4:2"}, {"accelerators": "T4:2"}], "cpus": 3},
     Demand(cpus=3, accelerator="T4", accelerator_count=2)),
])
def test_demand_of_a_task_is_what_it_declares(resources, expected):
    cap = Capacity(num_nodes=1, accelerators={"T4": 4})
    assert demand_of(TaskPayload.model_validate({"resources": resources}), cap) == expected


def test_capacity_of_the_candidate():
    c = capacity_of(Candidate(infra="aws", vcpus=4, memory_gib=16, accelerators={"T4": 1}), 2)
    assert c == Capacity(num_nodes=2, cpus=4, memory_gib=16, accelerators={"T4": 1})
    # a local cluster placed for T4:0.5 holds one whole GPU of the machine per node
    assert capacity_of(Candidate(infra="local", vcpus=2, accelerators={"T4": 0.5}), 1).accelerators == {"T4": 1}
    # CPUs the log does not know: one job at a time, as before packing
    assert capacity_of(None, 3) == Capacity(num_nodes=3, cpus=0.5)
    unknown = capacity_of(Candidate(infra="local"), 1)
    assert [a.job_id for a in admit(unknown, [q(1), q(2)])] == [1]
    assert [a.job_id for a in admit(unknown, [q(1, 4), q(2)])] == [1], "a bigger job runs alone"


def _queued(job_id: int, resources: dict) -> JobQueued:
    return JobQueued(cluster="c", job_id=job_id, task_id="t", task={"run": "x", "resources": resources},
                     run_setup=False)


def test_every_node_derives_the_same_admission_from_the_log():
    """The view's admissions come from log facts only: two views fed the same events agree,
    and the GPU indices a JobStarted recorded stay the job's after a replay (a restarted agent)."""
    events = [
        ClusterProvisioned(cluster="c", task_id="t", placement_id="p",
                           candidate=Candidate(infra="aws", vcpus=4, accelerators={"T4": 1}),
                           nodes=[NodeInfo(rank=0, instance_id="i0")], hourly_price_micros=0, launched_at=T0),
        _queued(1, {"accelerators": "T4:0.5"}),
        _queued(2, {"accelerators": "T4:0.5"}),
        _queued(3, {"accelerators": "T4:1"}),
    ]
    a, b = ClusterView("c", 1), ClusterView("c", 1)
    for n, ev in enumerate(events, 1):
        a.apply(ev, f"e{n}", T0, n)
        b.apply(ev, f"e{n}", T0, n)
    assert a.admissions() == b.admissions() == [Admission(1, (0,)), Admission(2, (0,))]
    for job_id in (1, 2):
        a.apply(JobStarted(cluster="c", job_id=job_id, started_at=T0, gpu_indices=[0]), f"s{job_id}", T0)
    assert a.admissions() == [], "job 3 needs the whole GPU"
    a.apply(JobCancelled(cluster="c", job_id=1, ended_at=T0), "x1", T0)
    assert a.admissions() == [], "job 2 still holds half of it"
    a.apply(JobCancelled(cluster="c", job_id=2, ended_at=T0), "x2", T0)
    assert a.admissions() == [Admission(3, (0,))]
    assert a.jobs[2].gpu_indices == (0,)


# ------------------------------------------------------------------------------ CUDA_VISIBLE_DEVICES

def test_cuda_visible_devices_per_job():
    assert ec.cuda_visible_devices((0,), 1, 0, "aws") == "0"
    assert ec.cuda_visible_devices((2, 3), 4, 1, "aws") == "2,3", "a cloud node's own indices"
    assert ec.cuda_visible_devices((1,), 2, 1, "local") == "3", "local node 1 holds GPUs 2-3 of the machine"
    assert ec.cuda_visible_devices((), 4, 0, "aws") == "", "a job that asked none sees none"
    assert ec.cuda_visible_devices(None, 0, 0, "aws") is None, "no GPUs: left as the node has it"


def _ctx(**kw):
    base = dict(cluster="c", job_id=4, rank=0, cluster_ips=("10.0.0.1",), job_num_nodes=1, task_id="t",
                user="u", infra="aws", gpus_per_node=1, cuda_visible_devices="1")
    base.update(kw)
    return ec.JobContext(**base)


def test_cuda_visible_devices_is_set_for_run_and_not_for_setup():
    assert ec.job_environment(_ctx(), "run")["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in ec.job_environment(_ctx(), "setup")
    assert "CUDA_VISIBLE_DEVICES" in ec.UNSET_IN_SETUP
    assert "CUDA_VISIBLE_DEVICES" not in ec.job_environment(_ctx(cuda_visible_devices=None), "run")


def test_resources_as_spz_queue_shows_them():
    from skypurza.events.jobdemand import describe_task

    def shown(task: dict) -> str:
        return describe_task(TaskPayload.model_validate(task))

    assert shown({"run": "x"}) == "1x[CPU:0.5]"
    assert shown({"resources": {"cpus": "1+"}}) == "1x[CPU:1]"
    assert shown({"num_nodes": 2, "resources": {"accelerators": "T4:0.5"}}) == "2x[T4:0.5, CPU:0.5]"
    assert shown({"resources": {"cpus": 4, "memory": "2x", "accelerators": {"A100": 8}}}) == "1x[A100:8, CPU:4, 8GB]"
    assert shown({"resources": {"cpus": "lots"}}) == "1x[CPU:0.5]", "unreadable: not given, never raises"
