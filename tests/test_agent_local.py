"""The node agent as real processes on a real bus: local clusters spawned by the LocalAdapter.

What a user's scripts see (the SkyPilot env contract, checked value by value on 2 nodes), what
the event log says about each job (started, per-node results, the outcome with phase, exit
code and failed rank), cancellation of whole process groups, an agent killed mid-job and
started again, autostop, and the local backend's stop/start/terminate.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import signal
import time
from pathlib import Path

import pytest
from agent_harness import (
    ENV_DUMP,
    events,
    job_end,
    job_lines,
    of,
    parse_env_dump,
    provision,
    rank_lines,
    terminate,
    wait_events,
    wait_lines,
)
from nats_fixtures import connect_bus

from skypurza.events.jobqueue import queue_job
from skypurza.events.models import AutostopSet, CancelRequested, Candidate
from skypurza.services.provisioner.adapter import ClusterRef, NodeState
from skypurza.services.provisioner.local import LocalAdapter

TASK_ID_RE = re.compile(r"^sky-\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}-\d{6}_(?P<cluster>.+)_(?P<job>\d+)$")


@pytest.fixture
def fast_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.5")


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0] == "Z"


def test_two_nodes_see_the_skypilot_env_contract(nats_server, tmp_path: Path, fast_agents) -> None:
    workdir = tmp_path / "proj"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('training')\n")
    cfg = tmp_path / "cfg.txt"
    cfg.write_text("lr=0.1\n")
    task = {
        "name": "contract", "num_nodes": 2, "workdir": str(workdir),
        "file_mounts": {"~/mounted/cfg.txt": str(cfg)},
        "resources": {"accelerators": "T4:2"},
        "envs": {"MY_ENV": "plain value"}, "secrets": {"MY_SECRET": None},
        "setup": ENV_DUMP.replace("ENV ", "SETUPENV "),
        "run": ENV_DUMP + "\npython3 train.py\ncat ~/mounted/cfg.txt\necho token=$MY_SECRET",
    }

    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "duo", 2)
        await bus.put_secrets("t-contract", {"MY_SECRET": "s3cr3t-value-123"})
        job, env = await queue_job(bus, cluster="duo", task_id="t-contract", task=task, user="alice",
                                   secrets_key="t-contract")
        end = await job_end(bus, "duo", job.job_id)
        assert end.EVENT_NAME == "job_succeeded", end
        lines = await job_lines(bus, "duo", job.job_id)
        evs = [s.event for s in await events(bus, "duo")]
        # the workdir and the file mount were copied into each node's own home
        for r in (0, 1):
            home = tmp_path / "state" / "clusters" / "duo" / f"node-{r}"
            assert (home / "sky_workdir" / "train.py").exists()
            assert (home / "mounted" / "cfg.txt").read_text() == "lr=0.1\n"
        await terminate(adapter, "duo")
        await bus.close()
        return job, env, lines, evs

    job, env, lines, evs = asyncio.run(main())
    homes = [tmp_path / "state" / "clusters" / "duo" / f"node-{r}" for r in (0, 1)]
    runs = [parse_env_dump(rank_lines(lines, r)) for r in (0, 1)]
    setups = [parse_env_dump([x.replace("SETUPENV ", "ENV ", 1) for x in rank_lines(lines, r, "setup")])
              for r in (0, 1)]
    task_id = runs[0]["SKYPILOT_TASK_ID"]
    m = TASK_ID_RE.match(task_id)
    assert m and m["cluster"] == "duo" and m["job"] == str(job.job_id), task_id
    # the timestamp is the JobQueued's, so every node (and every restart) derives the same id
    assert task_id.startswith("sky-" + env.time.strftime("%Y-%m-%d-%H-%M-%S-%f"))
    cluster_info = '{"cluster_name": "duo", "cloud": "Local", "region": null, "zone": null}'
    for rank, run in enumerate(runs):
        expected = {
            "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1", "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NUM_GPUS_PER_NODE": "2", "SKYPILOT_TASK_ID": task_id, "SKYPILOT_CLUSTER_INFO": cluster_info,
            "SKYPILOT_USER": "alice", "SKYPILOT_INTERNAL_JOB_ID": str(job.job_id),
        }
        contract = {k: v for k, v in run.items() if k.startswith("SKYPILOT_")}
        assert contract == expected, f"rank {rank}"
        for k, v in expected.items():
            assert run["SKYPURZA_" + k[len("SKYPILOT_"):]] == v
        assert run["MY_ENV"] == "plain value"
        assert run["MY_SECRET_SHA256"] == hashlib.sha256(b"s3cr3t-value-123").hexdigest()
        assert run["PYTHONUNBUFFERED"] == "1"
        assert run["HOME"] == str(homes[rank]) and run["CWD"] == str(homes[rank] / "sky_workdir")
        assert "SKYPILOT_SETUP_NODE_RANK" not in run and "SKYPILOT_MANAGED_JOB_ID" not in run
        out = rank_lines(lines, rank)
        assert "training" in out and "lr=0.1" in out
        # secret values never reach the logs stream
        assert "token=<redacted>" in out and not any("s3cr3t-value-123" in x for x in out)
    for rank, setup in enumerate(setups):
        contract = {k: v for k, v in setup.items() if k.startswith("SKYPILOT_")}
        assert contract == {
            "SKYPILOT_SETUP_NODE_RANK": str(rank), "SKYPILOT_SETUP_NODE_IPS": "127.0.0.1\n127.0.0.1",
            "SKYPILOT_SETUP_NUM_GPUS_PER_NODE": "2", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_TASK_ID": task_id,
            "SKYPILOT_CLUSTER_INFO": cluster_info, "SKYPILOT_USER": "alice",
        }, f"setup on rank {rank}"
    names = [(e.EVENT_NAME, getattr(e, "rank", None), getattr(e, "phase", None)) for e in evs
             if getattr(e, "job_id", None) == job.job_id]
    assert names[0] == ("job_queued", None, None) and names[1][0] == "job_started"
    assert sorted(n for n in names if n[0] == "job_node_finished") == [
        ("job_node_finished", 0, "run"), ("job_node_finished", 0, "setup"),
        ("job_node_finished", 1, "run"), ("job_node_finished", 1, "setup")]
    # run starts only once every node's setup is done
    first_run = min(i for i, n in enumerate(names) if n[2] == "run")
    assert all(i < first_run for i, n in enumerate(names) if n[2] == "setup")
    assert names[-1] == ("job_succeeded", None, None)
    assert sorted(e.rank for e in evs if e.EVENT_NAME == "node_ready") == [0, 1]


def test_a_failing_node_stops_the_others_and_the_queue_goes_on(nats_server, tmp_path: Path, fast_agents) -> None:
    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "fail", 2)
        t0 = time.monotonic()
        bad, _ = await queue_job(bus, cluster="fail", task_id="t1", task={
            "num_nodes": 2, "run": 'if [ "$SKYPILOT_NODE_RANK" = 1 ]; then sleep 0.3; exit 3; fi; sleep 60'})
        end = await job_end(bus, "fail", bad.job_id)
        took = time.monotonic() - t0
        setup_fail, _ = await queue_job(bus, cluster="fail", task_id="t2", task={
            "num_nodes": 2, "setup": 'echo setting up; [ "$SKYPILOT_SETUP_NODE_RANK" = 0 ] || exit 5',
            "run": "echo never"})
        end2 = await job_end(bus, "fail", setup_fail.job_id)
        after, _ = await queue_job(bus, cluster="fail", task_id="t3", task={"num_nodes": 2, "run": "echo ok"},
                                   run_setup=False)
        end3 = await job_end(bus, "fail", after.job_id)
        evs = [s.event for s in await events(bus, "fail")]
        lines2 = await job_lines(bus, "fail", setup_fail.job_id)
        await terminate(adapter, "fail")
        await bus.close()
        return bad, end, took, setup_fail, end2, end3, evs, lines2

    bad, end, took, setup_fail, end2, end3, evs, lines2 = asyncio.run(main())
    assert (end.EVENT_NAME, end.phase, end.exit_code, end.failed_rank) == ("job_failed", "run", 3, 1)
    assert took < 15, "the head's 60 s sleep must have been stopped"
    finished = {e.rank: e.exit_code for e in of(evs, "job_node_finished", bad.job_id) if e.phase == "run"}
    assert finished[1] == 3 and finished[0] == 128 + signal.SIGTERM
    assert (end2.EVENT_NAME, end2.phase, end2.exit_code, end2.failed_rank) == ("job_failed", "setup", 5, 1)
    assert not any(x["stream"] == "run" for x in lines2), "run must not start after a failed setup"
    assert end3.EVENT_NAME == "job_succeeded"


def test_cancel_kills_the_whole_process_group(nats_server, tmp_path: Path, fast_agents) -> None:
    # The script ignores SIGTERM (so does its child, which inherits that): SIGKILL after the grace.
    script = "trap '' TERM\nsleep 300 &\necho child=$!\necho main=$$\nwait"

    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "cx", 1)
        job, _ = await queue_job(bus, cluster="cx", task_id="t1", task={"run": script})
        lines = await wait_lines(bus, "cx", job.job_id, lambda ls: len(rank_lines(ls, 0)) >= 2)
        pids = {k: int(v) for k, v in (x.split("=") for x in rank_lines(lines, 0))}
        t0 = time.monotonic()
        await bus.publish(CancelRequested(cluster="cx", job_id=job.job_id, requested_by="alice"))
        end = await job_end(bus, "cx", job.job_id)
        took = time.monotonic() - t0
        queued_after, _ = await queue_job(bus, cluster="cx", task_id="t2", task={"run": "echo next"})
        end2 = await job_end(bus, "cx", queued_after.job_id)
        # a pending job cancelled before it starts never runs
        blocker, _ = await queue_job(bus, cluster="cx", task_id="t3", task={"run": "sleep 1"})
        pending, _ = await queue_job(bus, cluster="cx", task_id="t4", task={"run": "echo must-not-run"})
        await bus.publish(CancelRequested(cluster="cx", job_id=pending.job_id))
        end4 = await job_end(bus, "cx", pending.job_id)
        await job_end(bus, "cx", blocker.job_id)
        lines4 = await job_lines(bus, "cx", pending.job_id)
        await terminate(adapter, "cx")
        await bus.close()
        return pids, end, took, end2, end4, lines4

    pids, end, took, end2, end4, lines4 = asyncio.run(main())
    assert end.EVENT_NAME == "job_cancelled"
    assert 0.9 <= took < 10, took
    assert _pid_gone(pids["child"]) and _pid_gone(pids["main"])
    assert end2.EVENT_NAME == "job_succeeded"
    assert end4.EVENT_NAME == "job_cancelled" and lines4 == []


def test_what_leftover_processes_print_while_being_stopped_is_published(nats_server, tmp_path: Path,
                                                                           fast_agents) -> None:
    # The script ends; a child it left in its group says goodbye when the agent stops it.
    script = "(trap 'echo bye from the child; exit 0' TERM; echo child up; while :; do sleep 0.1; done) &\n" \
             "sleep 0.5\necho main done"

    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "bye", 1)
        job, _ = await queue_job(bus, cluster="bye", task_id="t1", task={"run": script})
        end = await job_end(bus, "bye", job.job_id)
        lines = await job_lines(bus, "bye", job.job_id)  # complete by the time the job has ended
        await terminate(adapter, "bye")
        await bus.close()
        return end, rank_lines(lines, 0)

    end, lines = asyncio.run(main())
    assert end.EVENT_NAME == "job_succeeded"
    assert lines[:2] == ["child up", "main done"] and lines[-1] == "bye from the child", lines


def _kill_agent(adapter: LocalAdapter, cluster: str, rank: int = 0) -> int:
    pid = adapter.agents(cluster)[rank]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if adapter._children.get(pid) is not None:
            adapter._children[pid].poll()
        if _pid_gone(pid):
            return pid
        time.sleep(0.02)
    raise AssertionError("agent did not die")


def test_a_restarted_agent_adopts_its_running_job(nats_server, tmp_path: Path, fast_agents) -> None:
    script = "for i in $(seq 1 10); do echo line $i; sleep 0.2; done"

    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "adopt", 1)
        job, _ = await queue_job(bus, cluster="adopt", task_id="t1", task={"run": script})
        await wait_lines(bus, "adopt", job.job_id, lambda ls: len(ls) >= 2)
        old = _kill_agent(adapter, "adopt")
        await asyncio.sleep(0.5)  # lines keep coming into the job's file, nobody publishes them
        await adapter.start(ClusterRef(stage="test", cluster="adopt", infra="local"))
        assert adapter.agents("adopt")[0]["pid"] != old
        end = await job_end(bus, "adopt", job.job_id)
        lines = await job_lines(bus, "adopt", job.job_id)
        evs = [s.event for s in await events(bus, "adopt")]
        await terminate(adapter, "adopt")
        await bus.close()
        return job, end, lines, evs

    job, end, lines, evs = asyncio.run(main())
    assert end.EVENT_NAME == "job_succeeded"
    assert rank_lines(lines, 0) == [f"line {i}" for i in range(1, 11)], "every line exactly once, in order"
    assert [e.exit_code for e in of(evs, "job_node_finished", job.job_id) if e.phase == "run"] == [0]
    assert len(of(evs, "job_started", job.job_id)) == 1
    assert len(of(evs, "node_ready")) == 2  # the first agent and the restarted one


def test_after_an_agent_crash_the_log_tells_how_the_job_really_ended(nats_server, tmp_path: Path,
                                                                     fast_agents) -> None:
    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        ref = ClusterRef(stage="test", cluster="crash", infra="local")
        await provision(bus, adapter, "crash", 1)
        # 1. the job ends while its agent is down: its exit status was written to its file
        quick, _ = await queue_job(bus, cluster="crash", task_id="t1", task={"run": "echo started; sleep 1; exit 7"})
        await wait_lines(bus, "crash", quick.job_id, lambda ls: len(ls) >= 1)
        _kill_agent(adapter, "crash")
        await asyncio.sleep(1.5)
        await adapter.start(ref)
        end1 = await job_end(bus, "crash", quick.job_id)
        # 2. the job's processes die with the agent (a machine reboot): failed, never RUNNING forever
        slow, _ = await queue_job(bus, cluster="crash", task_id="t2", task={"run": "echo started; sleep 300"})
        await wait_lines(bus, "crash", slow.job_id, lambda ls: len(ls) >= 1)
        pgid = int(next((tmp_path / "state" / "clusters" / "crash" / "node-0" / ".spz-agent" / "run").glob(
            f"{slow.job_id}-run.pgid")).read_text())
        _kill_agent(adapter, "crash")
        os.killpg(pgid, signal.SIGKILL)
        await adapter.start(ref)
        end2 = await job_end(bus, "crash", slow.job_id)
        lines2 = await job_lines(bus, "crash", slow.job_id)
        await terminate(adapter, "crash")
        await bus.close()
        return end1, end2, lines2

    end1, end2, lines2 = asyncio.run(main())
    assert (end1.EVENT_NAME, end1.phase, end1.exit_code, end1.failed_rank) == ("job_failed", "run", 7, 0)
    assert (end2.EVENT_NAME, end2.phase, end2.exit_code, end2.failed_rank) == ("job_failed", "agent", None, 0)
    assert "exit status is unknown" in end2.reason
    assert any(x["stream"] == "agent" and "exit status is unknown" in x["line"] for x in lines2)


def test_autostop_idle_events_once_per_idle_period(nats_server, tmp_path: Path, fast_agents) -> None:
    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "idle", 2)
        first, _ = await queue_job(bus, cluster="idle", task_id="t1", task={"run": "sleep 1"})
        await asyncio.sleep(0.3)
        # autostop set while a job runs: nothing until the job ended
        await bus.publish(AutostopSet(cluster="idle", idle_minutes=0, down=True))
        await job_end(bus, "idle", first.job_id)
        evs = await wait_events(bus, "idle", lambda evs: len(of(evs, "cluster_idle")) == 1)
        second, _ = await queue_job(bus, cluster="idle", task_id="t2", task={"run": "echo again"})
        await job_end(bus, "idle", second.job_id)
        evs = await wait_events(bus, "idle", lambda evs: len(of(evs, "cluster_idle")) == 2)
        await asyncio.sleep(1.2)  # a tick passes: no third one for the same idle period
        evs = [s.event for s in await events(bus, "idle")]
        await bus.publish(AutostopSet(cluster="idle", idle_minutes=None))
        await terminate(adapter, "idle")
        await bus.close()
        return evs

    evs = asyncio.run(main())
    names = [e.EVENT_NAME for e in evs]
    idles = of(evs, "cluster_idle")
    assert len(idles) == 2 and all(i.down and i.idle_minutes == 0 for i in idles)
    assert names.index("cluster_idle") > names.index("job_succeeded"), "not idle while the job ran"
    assert idles[0].idle_since < idles[1].idle_since


def test_autostop_from_launch_and_down_after_the_job(nats_server, tmp_path: Path, fast_agents) -> None:
    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await provision(bus, adapter, "auto", 1, idle_minutes=0)
        idle = await wait_events(bus, "auto", lambda evs: len(of(evs, "cluster_idle")) == 1)
        # `launch --down` without -i: down right after the job (with -i, once idle that long)
        await bus.publish(AutostopSet(cluster="auto", idle_minutes=None))
        job, _ = await queue_job(bus, cluster="auto", task_id="t1", task={"run": "echo bye"}, down_after=True)
        evs = await wait_events(bus, "auto", lambda evs: len(of(evs, "down_requested")) == 1)
        await terminate(adapter, "auto")
        await bus.close()
        return idle, evs

    idle, evs = asyncio.run(main())
    assert of(idle, "cluster_idle")[0].down is False
    down = of(evs, "down_requested")[0]
    assert down.reason == "job_done"
    names = [e.EVENT_NAME for e in evs]
    assert names.index("down_requested") > names.index("job_succeeded")
    assert len(of(evs, "cluster_idle")) == 1, "autostop was turned off"


def test_managed_job_env_and_a_late_agent(nats_server, tmp_path: Path, fast_agents) -> None:
    """An agent that boots after its cluster's events (a slow EC2 boot) still runs the job, with
    the managed-job variables and the recovery-stable task id from JobQueued."""
    from skypurza.events.envelope import utcnow
    from skypurza.events.models import ClusterProvisioned, NodeInfo
    from skypurza.services.provisioner.adapter import LaunchSpec

    tid = "sky-managed-2026-11-30-10-00-00-000001_train_7-0"

    async def main():
        bus = await connect_bus(nats_server)
        start = await bus.last_seq() + 1
        await bus.publish(ClusterProvisioned(
            cluster="late", task_id="t", placement_id="p", nodes=[NodeInfo(rank=0, instance_id="i-0")],
            candidate=Candidate(infra="local", accelerators={"A10G": 1}),
            hourly_price_micros=1, launched_at=utcnow()))
        job, _ = await queue_job(bus, cluster="late", task_id="t", user="bob", managed_job_id=7,
                                 skypilot_task_id=tid, managed_task_ids=[tid, tid.replace("-0", "-1")],
                                 task={"run": ENV_DUMP, "resources": {"accelerators": ["V100:4", "A10G:1"]}})
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        await adapter.launch(LaunchSpec(stage="test", cluster="late", launch_token="x", instance_type="local",
                                        region="local", infra="local", labels={"start_seq": str(start)}))
        end = await job_end(bus, "late", job.job_id)
        lines = await job_lines(bus, "late", job.job_id)
        await terminate(adapter, "late")
        await bus.close()
        return end, lines

    end, lines = asyncio.run(main())
    assert end.EVENT_NAME == "job_succeeded"
    env = parse_env_dump(rank_lines(lines, 0))
    assert env["SKYPILOT_TASK_ID"] == tid
    assert env["SKYPILOT_MANAGED_JOB_ID"] == "7"
    assert env["SKYPILOT_TASK_IDS"] == f"{tid}\n{tid.replace('-0', '-1')}"
    assert env["SKYPILOT_JOB_RANK"] == "0" and env["SKYPILOT_NUM_JOBS"] == "1"
    assert env["SKYPILOT_NUM_GPUS_PER_NODE"] == "1", "the accelerator the cluster was placed with"
    assert env["SKYPILOT_CLUSTER_INFO"] == ('{"cluster_name": "late", "cloud": "Local", "region": null, '
                                            '"zone": null}')
    assert env["SKYPURZA_MANAGED_JOB_ID"] == "7"


def test_local_backend_launch_stop_start_terminate(nats_server, tmp_path: Path, fast_agents) -> None:
    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        ref = ClusterRef(stage="test", cluster="life", infra="local")
        await provision(bus, adapter, "life", 2, token="tok-1")
        pids = [n["pid"] for n in adapter.agents("life")]
        # the same launch token finds the same gang
        from skypurza.services.provisioner.adapter import LaunchSpec

        again = await adapter.launch(LaunchSpec(stage="test", cluster="life", launch_token="tok-1",
                                                instance_type="local", region="local", num_nodes=2, infra="local"))
        assert [n["pid"] for n in adapter.agents("life")] == pids and len(again) == 2
        assert {n.instance_id for n in await adapter.list_owned("test")} == {n.instance_id for n in again}
        job, _ = await queue_job(bus, cluster="life", task_id="t1", task={"num_nodes": 2, "run": "echo up; sleep 300"})
        await wait_lines(bus, "life", job.job_id, lambda ls: len(ls) >= 2)
        run_dirs = [Path(n["home"]) / ".spz-agent" / "run" for n in adapter.agents("life")]
        pgids = [int(next(d.glob("*.pgid")).read_text()) for d in run_dirs]
        stopped = await adapter.stop(ref)
        assert {n.state for n in stopped} == {NodeState.STOPPED}
        assert all(_pid_gone(p) for p in pids + pgids), "a stopped node runs nothing"
        assert all(Path(n["home"]).is_dir() for n in adapter.agents("life")), "homes are kept"
        started = await adapter.start(ref)
        assert {n.state for n in started} == {NodeState.RUNNING}
        # the job that the stop killed is reported, truthfully, by the restarted agents
        end = await job_end(bus, "life", job.job_id)
        ids = await adapter.terminate(ref)
        assert sorted(ids) == sorted(n.instance_id for n in again)
        assert not (tmp_path / "state" / "clusters" / "life").exists()
        assert await adapter.describe(ref) == [] and await adapter.terminate(ref) == []
        await bus.close()
        return end

    end = asyncio.run(main())
    assert (end.EVENT_NAME, end.phase) == ("job_failed", "agent")
