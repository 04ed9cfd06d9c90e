"""Several jobs at once on one cluster, as real agent processes on a real bus (the LocalAdapter).

The cluster's capacity is what its ClusterProvisioned says (the candidate's vcpus and
accelerators), so each test states the node it packs onto. Overlap is proven, not timed: the
jobs of a pair each wait for a file the other writes, so they succeed only if they ran at the
same time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from agent_harness import events, job_end, job_lines, of, provision, rank_lines, terminate, wait_lines
from nats_fixtures import connect_bus

from skypurza.events.jobqueue import queue_job
from skypurza.events.models import CancelRequested, Candidate
from skypurza.services.provisioner.adapter import ClusterRef
from skypurza.services.provisioner.local import LocalAdapter

TERMINAL = ("job_succeeded", "job_failed", "job_cancelled")


@pytest.fixture
def fast_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.5")


def rendezvous(me: str, other: str, d: Path, then: str = "") -> str:
    """A run script that writes its own file and waits (bounded) for the other job's."""
    return (f"touch {d}/{me}; for i in $(seq 1 200); do [ -f {d}/{other} ] && break; sleep 0.05; done\n"
            f"[ -f {d}/{other} ] || {{ echo 'never saw {other}'; exit 7; }}\necho met {other}\n{then}")


def seqs(stored, name: str, job_id: int) -> list[int]:
    return [s.seq for s in stored if s.event is not None and s.event.EVENT_NAME == name
            and s.event.job_id == job_id]


def end_seq(stored, job_id: int) -> int:
    return min(s.seq for s in stored if s.event is not None and s.event.EVENT_NAME in TERMINAL
               and s.event.job_id == job_id)


def test_cpu_jobs_share_the_node_and_the_next_starts_when_one_ends(nats_server, tmp_path: Path,
                                                                  fast_agents) -> None:
    d = tmp_path / "meet"
    d.mkdir()

    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "pack", 1, candidate=Candidate(infra="local", vcpus=2, memory_gib=8))
        j1, _ = await queue_job(bus, cluster="pack", task_id="t1",
                                task={"run": rendezvous("one", "two", d), "resources": {"cpus": 1}})
        j2, _ = await queue_job(bus, cluster="pack", task_id="t2",
                                task={"run": rendezvous("two", "one", d, "sleep 2"), "resources": {"cpus": 1}})
        j3, _ = await queue_job(bus, cluster="pack", task_id="t3",
                                task={"run": "echo third", "resources": {"cpus": 1}})
        ends = [await job_end(bus, "pack", j.job_id, timeout=40) for j in (j1, j2, j3)]
        stored = await events(bus, "pack")
        await terminate(adapter, "pack")
        await bus.close()
        return ends, stored

    ends, stored = asyncio.run(main())
    assert [e.EVENT_NAME for e in ends] == ["job_succeeded"] * 3, ends
    # job 3 (1 CPU) did not fit beside jobs 1 and 2 (2 CPUs): it started after job 1 ended,
    # while job 2 (2 s longer) still ran
    start3 = seqs(stored, "job_started", 3)
    assert len(start3) == 1 and end_seq(stored, 1) < start3[0] < end_seq(stored, 2)
    assert all(len(seqs(stored, "job_started", j)) == 1 for j in (1, 2)), "one publisher, once"


def test_fractional_gpu_jobs_share_an_index_and_each_sees_only_its_gpus(nats_server, tmp_path: Path,
                                                                        fast_agents, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")  # what the node's own environment says
    d = tmp_path / "meet"
    d.mkdir()
    show = 'echo "CVD=${CUDA_VISIBLE_DEVICES-unset}"'

    def task(run: str, acc: str) -> dict:
        return {"setup": show.replace("CVD", "SETUP"), "run": show + "\n" + run,
                "resources": {"accelerators": acc}}

    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "gpu", 1,
                        candidate=Candidate(infra="aws", vcpus=4, memory_gib=16, accelerators={"T4": 2}))
        half1, _ = await queue_job(bus, cluster="gpu", task_id="h1", task=task(rendezvous("a", "b", d), "T4:0.5"))
        half2, _ = await queue_job(bus, cluster="gpu", task_id="h2", task=task(rendezvous("b", "a", d), "T4:0.5"))
        whole, _ = await queue_job(bus, cluster="gpu", task_id="w", task=task("true", "T4:1"))
        cpu, _ = await queue_job(bus, cluster="gpu", task_id="c", task=task("true", "T4:2"))
        ends = [await job_end(bus, "gpu", j.job_id, timeout=40) for j in (half1, half2, whole, cpu)]
        lines = {j.job_id: await job_lines(bus, "gpu", j.job_id) for j in (half1, half2, whole, cpu)}
        evs = [s.event for s in await events(bus, "gpu")]
        await terminate(adapter, "gpu")
        await bus.close()
        return ends, lines, evs

    ends, lines, evs = asyncio.run(main())
    assert [e.EVENT_NAME for e in ends] == ["job_succeeded"] * 4, [rank_lines(v, 0) for v in lines.values()]
    cvd = {j: next(x for x in rank_lines(v, 0) if x.startswith("CVD=")) for j, v in lines.items()}
    assert cvd == {1: "CVD=0", 2: "CVD=0", 3: "CVD=1", 4: "CVD=0,1"}, "halves share GPU 0; the whole one gets GPU 1"
    assert all(rank_lines(v, 0, "setup") == ["SETUP=unset"] for v in lines.values()), "setup runs with it unset"
    assert [e.gpu_indices for e in of(evs, "job_started")] == [[0], [0], [1], [0, 1]], "recorded in the log"


def test_cancel_one_and_restart_the_agent_mid_run_the_others_go_on(nats_server, tmp_path: Path,
                                                                   fast_agents) -> None:
    loop_script = "for i in $(seq 1 25); do echo line $i; sleep 0.2; done"

    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "trio", 1, candidate=Candidate(infra="local", vcpus=3))
        jobs = [(await queue_job(bus, cluster="trio", task_id=f"t{i}", task={"run": loop_script,
                                                                             "resources": {"cpus": 1}}))[0]
                for i in range(3)]
        for j in jobs:
            await wait_lines(bus, "trio", j.job_id, lambda ls: len(ls) >= 2)
        await bus.publish(CancelRequested(cluster="trio", job_id=jobs[0].job_id, requested_by="alice"))
        cancelled = await job_end(bus, "trio", jobs[0].job_id)
        running = [(await events(bus, "trio"))]
        # the agent dies while jobs 2 and 3 run; a new one adopts both
        pid = adapter.agents("trio")[0]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and adapter._children.get(pid) is not None \
                and adapter._children[pid].poll() is None:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
        await adapter.start(ClusterRef(stage="test", cluster="trio", infra="local"))
        ends = [await job_end(bus, "trio", j.job_id, timeout=40) for j in jobs[1:]]
        lines = {j.job_id: rank_lines(await job_lines(bus, "trio", j.job_id), 0) for j in jobs[1:]}
        evs = [s.event for s in await events(bus, "trio")]
        await terminate(adapter, "trio")
        await bus.close()
        return jobs, cancelled, running, ends, lines, evs

    jobs, cancelled, running, ends, lines, evs = asyncio.run(main())
    assert cancelled.EVENT_NAME == "job_cancelled"
    before = [s.event for s in running[0] if s.event is not None]
    assert not any(e.EVENT_NAME in TERMINAL and e.job_id != jobs[0].job_id for e in before), \
        "cancelling job 1 left jobs 2 and 3 running"
    assert [e.EVENT_NAME for e in ends] == ["job_succeeded"] * 2
    for j in jobs[1:]:
        assert lines[j.job_id] == [f"line {i}" for i in range(1, 26)], "every line exactly once, in order"
        assert [e.exit_code for e in of(evs, "job_node_finished", j.job_id) if e.phase == "run"] == [0]
        assert len(of(evs, "job_started", j.job_id)) == 1
    assert len(of(evs, "node_ready")) == 2  # the first agent and the restarted one


def test_two_node_jobs_pack_on_every_node(nats_server, tmp_path: Path, fast_agents) -> None:
    """Two 2-node jobs of 1 CPU on a 2-node, 2-CPU cluster run side by side on both nodes."""
    d = tmp_path / "meet"
    d.mkdir()

    def run(me: str, other: str) -> str:
        return rendezvous(f"{me}-$SKYPILOT_NODE_RANK", f"{other}-$SKYPILOT_NODE_RANK", d)

    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "wide", 2, candidate=Candidate(infra="local", vcpus=2, num_nodes=2))
        a, _ = await queue_job(bus, cluster="wide", task_id="a",
                               task={"num_nodes": 2, "run": run("a", "b"), "resources": {"cpus": 1}})
        b, _ = await queue_job(bus, cluster="wide", task_id="b",
                               task={"num_nodes": 2, "run": run("b", "a"), "resources": {"cpus": 1}})
        ends = [await job_end(bus, "wide", j.job_id, timeout=40) for j in (a, b)]
        evs = [s.event for s in await events(bus, "wide")]
        await terminate(adapter, "wide")
        await bus.close()
        return ends, evs

    ends, evs = asyncio.run(main())
    assert [e.EVENT_NAME for e in ends] == ["job_succeeded"] * 2
    assert sorted((e.job_id, e.rank, e.exit_code) for e in of(evs, "job_node_finished") if e.phase == "run") == [
        (1, 0, 0), (1, 1, 0), (2, 0, 0), (2, 1, 0)]
