"""The recovery service through the real bus, with the other services played by publishing
their events (tests/support/managed_fixtures.py): launches, preemption, teardown order,
two services at once, a kill mid-recovery, heartbeats, cancel, and 200 jobs at once."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from managed_fixtures import (
    FAST,
    STAGE,
    Stand,
    events_of,
    recovery,
    statuses,
    until,
    wait_status,
)
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.models import ClusterTerminated, ManagedJobStatusChanged, SpotPreempted, TaskSubmitted
from skypurza.services.recovery import machine
from skypurza.services.recovery.service import RecoveryService
from skypurza.services.recovery.settings import RecoverySettings
from skypurza.services.recovery.submit import read_jobs, request_cancel, submit_managed_job

TASK = {"name": "train", "run": "python train.py", "resources": {"infra": "aws", "use_spot": True}}


def preempt(cluster: str) -> SpotPreempted:
    return SpotPreempted(cluster=cluster, rank=0, instance_id=f"i-{cluster}", detected_at=datetime.now(timezone.utc),
                         evidence={"state_reason_code": "Server.SpotInstanceTermination"})


async def launches(bus, job_id: int) -> list[TaskSubmitted]:
    out = []
    for n in range(1, 10):
        subject = naming.event_subject(STAGE, "task", machine.launch_task_id(job_id, n), "task_submitted")
        out += await events_of(bus, subject)
    return out


def test_preemption_tears_down_first_then_relaunches_with_the_region_blocked(nats_server, spz_home):
    async def main():
        bus = await connect_bus(nats_server)
        stand = await Stand(bus, script={"train-1-1": "hold", "train-1-2": "hold"}).start()
        async with recovery(bus):
            job = await submit_managed_job(bus, name="train", tasks=[TASK], user="alice")
            assert job.managed_job_id == 1 and job.skypilot_task_ids[0].endswith("_train_1-0")
            await wait_status(bus, 1, "RUNNING")
            first = stand.submitted[0]
            assert (first.kind, first.cluster, first.managed_job_id, first.task_index) == ("managed", "train-1-1", 1, 0)
            assert first.skypilot_task_id == job.skypilot_task_ids[0] and first.initial_blocks == [] and not first.down

            # Preempted: the old cluster must be gone before the new one is asked for.
            stand.script["train-1-1"] = "hold"
            stand.provisioned.discard("train-1-1")  # the stand will not answer this teardown by itself
            await bus.publish(preempt("train-1-1"))
            await wait_status(bus, 1, "RECOVERING")
            await until(lambda: "train-1-1" in stand.downs, what="teardown of the preempted cluster")
            await asyncio.sleep(0.5)
            assert len(stand.submitted) == 1, "relaunched before the preempted cluster was gone"
            await bus.publish(ClusterTerminated(cluster="train-1-1", terminated_at=datetime.now(timezone.utc)))
            await until(lambda: len(stand.submitted) == 2, what="the relaunch")
            second = stand.submitted[1]
            assert second.cluster == "train-1-2" and second.skypilot_task_id == first.skypilot_task_id
            assert [(b.scope, b.region) for b in second.initial_blocks] == [("region", "us-east-1")]
            await wait_status(bus, 1, "RUNNING", count=2)
            await stand.finish("train-1-2", "succeed")
            got = await wait_status(bus, 1, "SUCCEEDED")
            assert [e.status for e in got] == ["STARTING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
            assert got[-1].recoveries == 1 and got[2].reason == ("preempted: train-1-1: node 0 (i-train-1-1): "
                                                                "Server.SpotInstanceTermination")
            await until(lambda: "train-1-2" in stand.downs, what="teardown at the end")
            # A late, duplicate loss of the old cluster changes nothing.
            await bus.publish(preempt("train-1-1"))
            await asyncio.sleep(0.3)
            assert [e.status for e in await statuses(bus, 1)][-1] == "SUCCEEDED"
        await stand.stop()
        await bus.close()

    asyncio.run(main())


def test_two_recovery_services_recover_a_job_once(nats_server, spz_home):
    async def main():
        bus = await connect_bus(nats_server)
        stand = await Stand(bus, script={"train-1-1": "hold", "train-1-2": "hold"}).start()
        # Two services, each with its own consumer: both see every event and both try to act.
        async with recovery(bus, consumer="recovery-a"), recovery(bus, consumer="recovery-b"):
            await submit_managed_job(bus, name="train", tasks=[TASK])
            await wait_status(bus, 1, "RUNNING")
            await bus.publish(preempt("train-1-1"))
            await wait_status(bus, 1, "RUNNING", count=2)
            await stand.finish("train-1-2", "succeed")
            await wait_status(bus, 1, "SUCCEEDED")
            await asyncio.sleep(0.5)
        got = [e.status for e in await statuses(bus, 1)]
        assert got == ["STARTING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
        assert [t.cluster for t in await launches(bus, 1)] == ["train-1-1", "train-1-2"]
        assert [t.cluster for t in stand.submitted] == ["train-1-1", "train-1-2"]
        downs = await events_of(bus, naming.event_filter(STAGE, "cluster", "down_requested"))
        assert sorted(d.cluster for d in downs) == ["train-1-1", "train-1-2"]
        await stand.stop()
        await bus.close()

    asyncio.run(main())


def test_conflicting_decisions_from_the_same_state_one_wins_the_other_decides_again(nats_server, spz_home):
    """Two services decide different things from one state version (a preemption and a cancel):
    optimistic concurrency lets one transition in; the other reloads and decides again."""
    async def main():
        bus = await connect_bus(nats_server)
        stand = await Stand(bus, default="hold").start()
        async with recovery(bus):
            for _ in range(4):
                await submit_managed_job(bus, name="race", tasks=[TASK])
            for j in range(1, 5):
                await wait_status(bus, j, "RUNNING")
        a, b = RecoveryService(FAST, bucket_store="dir"), RecoveryService(FAST, bucket_store="dir")
        a._bus = b._bus = bus
        for j in range(1, 5):
            first, second = (a, b) if j % 2 else (b, a)
            await asyncio.gather(first._act(bus, j, machine.LostF(f"race-{j}-1", "preempted")),
                                 second._act(bus, j, machine.Cancel()))
            got = [e.status for e in await statuses(bus, j)][2:]
            # Each transition follows from the one before: never RECOVERING after CANCELLING. (A
            # cancel of a recovery whose new cluster was never asked for ends at once.)
            assert got in (["RECOVERING", "CANCELLING", "CANCELLED"], ["CANCELLING"]), got
        await stand.stop()
        await bus.close()

    asyncio.run(main())


def test_killed_mid_recovery_a_new_service_completes_it_once(nats_server, spz_home):
    async def main():
        bus = await connect_bus(nats_server)
        stand = await Stand(bus, script={"train-1-1": "hold", "train-1-2": "hold"}).start()
        async with recovery(bus):
            await submit_managed_job(bus, name="train", tasks=[TASK])
            await wait_status(bus, 1, "RUNNING")
            stand.provisioned.discard("train-1-1")
            await bus.publish(preempt("train-1-1"))
            await until(lambda: "train-1-1" in stand.downs, what="teardown")
        # The service is gone, in RECOVERING, waiting for the old cluster. It terminates meanwhile.
        await bus.publish(ClusterTerminated(cluster="train-1-1", terminated_at=datetime.now(timezone.utc)))
        await asyncio.sleep(0.3)
        assert len(stand.submitted) == 1
        async with recovery(bus):  # a fresh process: state from the log, the same durable consumer
            await wait_status(bus, 1, "RUNNING", count=2)
            await stand.finish("train-1-2", "succeed")
            await wait_status(bus, 1, "SUCCEEDED")
        assert [t.cluster for t in stand.submitted] == ["train-1-1", "train-1-2"]
        assert [e.status for e in await statuses(bus, 1)].count("RECOVERING") == 1

        # A crash right after a transition, before its effects: the log holds RECOVERING and
        # nothing else. A new service sees it through at start.
        await submit_managed_job(bus, name="eval", tasks=[{"name": "eval", "run": "x"}])
        stand.script["eval-2-1"] = "hold"
        async with recovery(bus):
            await wait_status(bus, 2, "RUNNING")
        last = await bus.last_event(naming.aggregate_subjects(STAGE, "mjob", "2"))
        await bus.publish(ManagedJobStatusChanged(managed_job_id=2, status="RECOVERING", kind="preempted", cluster="eval-2-2",
                                                  recoveries=1, reason="preempted: by hand"),
                          expected_last_seq=last.seq)
        async with recovery(bus):
            await until(lambda: "eval-2-1" in stand.downs and len(stand.submitted) == 4, what="effects after restart")
            await wait_status(bus, 2, "SUCCEEDED")
        assert [t.cluster for t in stand.submitted] == ["train-1-1", "train-1-2", "eval-2-1", "eval-2-2"]
        await stand.stop()
        await bus.close()

    asyncio.run(main())


def test_restarts_pipeline_no_resource_and_cancel(nats_server, spz_home):
    async def main():
        bus = await connect_bus(nats_server)
        stand = await Stand(bus, script={"flaky-1-1": "fail:1", "flaky-1-2": "fail:3",
                                         "pipe-2-1": "succeed", "pipe-2-2": "succeed",
                                         "none-3-1": "noplace", "long-4-1": "hold", "setup-5-1": "setup:2"}).start()
        async with recovery(bus):
            flaky = {"name": "flaky", "run": "x", "resources": {"job_recovery": {"max_restarts_on_errors": 1,
                                                                                  "recover_on_exit_codes": 3}}}
            await submit_managed_job(bus, name="flaky", tasks=[flaky])
            await submit_managed_job(bus, name="pipe", tasks=[{"name": "prep", "run": "a"}, {"name": "go", "run": "b"}])
            await submit_managed_job(bus, name="none", tasks=[{"run": "x"}])
            await submit_managed_job(bus, name="long", tasks=[{"run": "sleep 1000"}])
            await submit_managed_job(bus, name="setup", tasks=[{"setup": "exit 2", "run": "x"}])
            flaky_events = await wait_status(bus, 1, "SUCCEEDED")
            assert [(e.status, e.restarts_on_errors) for e in flaky_events if e.status == "RECOVERING"] == [
                ("RECOVERING", 1), ("RECOVERING", 1)]  # counted restart, then an uncounted exit code
            pipe = await wait_status(bus, 2, "SUCCEEDED")
            assert [(e.status, e.task_index, e.cluster) for e in pipe if e.status == "STARTING"] == [
                ("STARTING", 0, "pipe-2-1"), ("STARTING", 1, "pipe-2-2")]
            pipe_tasks = [t for t in stand.submitted if t.managed_job_id == 2]
            assert [t.task.name for t in pipe_tasks] == ["prep", "go"]
            assert pipe_tasks[0].skypilot_task_id.endswith("_pipe_prep_2-0")
            assert pipe_tasks[1].skypilot_task_id.endswith("_pipe_go_2-1")
            none = await wait_status(bus, 3, "FAILED_NO_RESOURCE")
            assert "1) x" in none[-1].reason
            failed = await wait_status(bus, 5, "FAILED_SETUP")
            assert "setup exited with 2" in failed[-1].reason
            await wait_status(bus, 4, "RUNNING")
            assert await request_cancel(bus, 4, "alice")
            await wait_status(bus, 4, "CANCELLED")
            assert [e.status for e in await statuses(bus, 4)] == ["STARTING", "RUNNING", "CANCELLING", "CANCELLED"]
            assert not await request_cancel(bus, 4)  # ended already
            jobs = await read_jobs(bus)
            assert {j: s.status for j, s in jobs.items()} == {
                1: "SUCCEEDED", 2: "SUCCEEDED", 3: "FAILED_NO_RESOURCE", 4: "CANCELLED", 5: "FAILED_SETUP"}
            await until(lambda: {"flaky-1-3", "pipe-2-2", "long-4-1", "setup-5-1"} <= set(stand.downs),
                        what="every cluster torn down")
        await stand.stop()
        await bus.close()

    asyncio.run(main())


def test_silent_heartbeats_are_a_lost_node(nats_server, spz_home):
    async def main():
        bus = await connect_bus(nats_server)
        stand = await Stand(bus, script={"train-1-1": "hold", "train-1-2": "succeed"}).start()
        svc = RecoveryService(RecoverySettings(ec2_poll_s=0, heartbeat_timeout_s=0.6, reconcile_s=5),
                              bucket_store="dir")
        async with recovery(bus, svc):
            await submit_managed_job(bus, name="train", tasks=[TASK])
            await wait_status(bus, 1, "RUNNING")
            subject = naming.heartbeat_subject(STAGE, "train-1-1", 0)
            for _ in range(4):  # alive for a while ...
                await bus.nc.publish(subject, b"{}")
                await asyncio.sleep(0.2)
            assert [e.status for e in await statuses(bus, 1)] == ["STARTING", "RUNNING"]
            # ... then silent.
            got = await wait_status(bus, 1, "SUCCEEDED", timeout=10)
            lost = await events_of(bus, naming.event_subject(STAGE, "cluster", "train-1-1", "node_lost"))
            assert len(lost) == 1 and lost[0].evidence["source"] == "heartbeat" and lost[0].rank == 0
            assert [e.status for e in got] == ["STARTING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
            assert got[2].reason.startswith("node_lost:")
        await stand.stop()
        await bus.close()

    asyncio.run(main())


def test_200_managed_jobs_at_once_none_lost_none_duplicated(nats_server, spz_home):
    """Transitions driven directly (the stand plays the clusters): 200 real local clusters
    would be 200 agent processes, too heavy for a 2-core test machine."""
    n = 200

    async def main():
        bus = await connect_bus(nats_server)
        # Every tenth job is preempted on its first cluster; every seventh fails once and restarts.
        script: dict[str, str] = {}
        for j in range(1, n + 1):
            if j % 7 == 0:
                script[f"bulk-{j}-1"] = "fail:1"
        stand = await Stand(bus, script=script).start()
        orig_launch = stand._launch

        async def launch_then_preempt(stored, ts):
            await orig_launch(stored, ts)
            if ts.managed_job_id % 10 == 0 and ts.cluster.endswith("-1"):
                await bus.publish(preempt(ts.cluster))

        stand._launch = launch_then_preempt  # type: ignore[method-assign]
        for j in range(1, n + 1):
            if j % 10 == 0:
                stand.script[f"bulk-{j}-1"] = "hold"
        task = {"name": "bulk", "run": "true", "resources": {"job_recovery": {"max_restarts_on_errors": 1}}}
        # Two recovery services share one durable consumer (scale-out): each gets part of the events.
        async with recovery(bus), recovery(bus):
            t0 = asyncio.get_running_loop().time()
            jobs = await asyncio.gather(*(submit_managed_job(bus, name="bulk", tasks=[task]) for _ in range(n)))
            accepted = asyncio.get_running_loop().time() - t0
            assert sorted(j.managed_job_id for j in jobs) == list(range(1, n + 1))

            async def all_final():
                states = await read_jobs(bus)
                return len(states) == n and all(s.terminal for s in states.values())

            await until(all_final, timeout=90, what="every job final")
        states = await read_jobs(bus)
        assert {s.status for s in states.values()} == {"SUCCEEDED"}
        every = await events_of(bus, naming.event_filter(STAGE, "mjob", "managed_job_status_changed"))
        ends = [e for e in every if e.status == "SUCCEEDED"]
        assert sorted(e.managed_job_id for e in ends) == list(range(1, n + 1)), "a job ended twice or never"
        for j in range(1, n + 1):
            s = states[j]
            preempted, failed = j % 10 == 0, j % 7 == 0 and j % 10 != 0  # 70, 140: held, then preempted
            assert len(s.clusters) == 1 + preempted + failed, (j, s.clusters)
            assert s.recoveries == preempted and s.restarts_on_errors == failed
        submitted = await events_of(bus, naming.event_filter(STAGE, "task", "task_submitted"))
        assert len(submitted) == len({t.task_id for t in submitted}) == sum(len(s.clusters) for s in states.values())
        print(f"\n200 managed jobs accepted in {accepted:.2f} s")
        await stand.stop()
        await bus.close()

    asyncio.run(main())
