"""Recovery's detectors, each driven on its own on a real nats-server, publishing through the
bus checked against the recovery service's contract (as the runner gives it): heartbeats
(driven by a ManualClock, never by sleeping), instance watching (a real fake-EC2 server), the loss reporter
(once per node, across a restart) and reconciliation (which job gets which look, and one job's
failure does not stop the others)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from aws_fixtures import FakeAws
from managed_fixtures import STAGE, events_of, until
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.clock import ManualClock
from skypurza.events.models import Candidate, ClusterProvisioned, ManagedJobSubmitted, NodeInfo, NodeLost
from skypurza.events.service import declared_bus
from skypurza.services.recovery import machine
from skypurza.services.recovery.ec2watch import Ec2Watch
from skypurza.services.recovery.heartbeats import HeartbeatWatch
from skypurza.services.recovery.instancewatch import InstanceWatch
from skypurza.services.recovery.losses import LossReporter
from skypurza.services.recovery.reconcile import Due, Reconciler, due
from skypurza.services.recovery.service import CONTRACT

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
IMAGE = "ami-dca37ea5"  # one of moto's default AMIs


def provisioned(cluster: str, instance_ids: list[str], *, infra: str = "aws", region: str = "us-east-1"
                ) -> ClusterProvisioned:
    return ClusterProvisioned(
        cluster=cluster, task_id="t", placement_id="p",
        candidate=Candidate(infra=infra, region=region, instance_type="m5.large", use_spot=True,
                            hourly_price_micros=35_000),
        nodes=[NodeInfo(rank=r, instance_id=i) for r, i in enumerate(instance_ids)],
        hourly_price_micros=35_000, launched_at=T0, managed_job_id=1)


def test_heartbeats_a_node_that_beat_then_went_silent_is_lost_once(nats_server, spz_home):
    async def main():
        bus = await connect_bus(nats_server)
        out = declared_bus(bus, CONTRACT)
        clock = ManualClock(T0, monotonic=1000.0)
        watched = [("train-1-1", 0, "i-0"), ("train-1-1", 1, "i-1"), ("train-1-1", 2, "i-2")]

        async def nodes():
            return watched

        watch = HeartbeatWatch(out, LossReporter(out, service="recovery", clock=clock), nodes, timeout_s=5,
                               clock=clock)
        await watch.start()
        for rank in (0, 1):  # rank 2 never beats: a slow boot is never a death
            await bus.nc.publish(naming.heartbeat_subject(STAGE, "train-1-1", rank), b"{}")
        await bus.nc.flush()
        await until(lambda: len(watch.heard()) == 2, what="both beats heard")
        clock.advance(3)
        await bus.nc.publish(naming.heartbeat_subject(STAGE, "train-1-1", 1), b"{}")
        await bus.nc.flush()
        await until(lambda: watch.heard().get(("train-1-1", 1)) == 1003.0, what="rank 1 beat again")
        assert await watch.check() == [], "nobody silent for 5 s yet"
        clock.advance(3)  # rank 0: silent 6 s; rank 1: 3 s
        found = await watch.check()
        assert [(e.cluster, e.rank, e.instance_id) for e in found] == [("train-1-1", 0, "i-0")]
        assert found[0].evidence == {"source": "heartbeat", "silent_s": 6.0, "timeout_s": 5}
        # Both times from the one clock: detected now (T0 + 6 s), last heard at T0.
        assert found[0].detected_at == T0 + timedelta(seconds=6) and found[0].last_heartbeat == T0
        clock.advance(94)
        later = await watch.check()  # rank 1 is silent now too; rank 0 is not reported again
        assert [e.rank for e in later] == [1]
        stored = await events_of(bus, naming.event_subject(STAGE, "cluster", "train-1-1", NodeLost.EVENT_NAME))
        assert sorted(e.rank for e in stored) == [0, 1]
        await watch.close()
        await bus.close()

    asyncio.run(main())


def test_loss_reporter_reports_a_node_once_even_after_a_restart(nats_server, spz_home):
    async def main():
        bus = await connect_bus(nats_server)
        out = declared_bus(bus, CONTRACT)
        first = LossReporter(out, service="recovery", clock=ManualClock(T0))
        ev = await first.report("c-1-1", 0, "i-0", "preempted", {"state_reason_code": "Server.SpotInstanceTermination"})
        assert ev is not None and ev.EVENT_NAME == "spot_preempted"
        assert await first.report("c-1-1", 0, "i-0", "preempted", {}) is None
        restarted = LossReporter(out, service="recovery", clock=ManualClock(T0))  # knows only the log
        assert await restarted.report("c-1-1", 0, "i-0", "preempted", {}) is None
        lost = await restarted.report("c-1-1", 1, "i-1", "node_lost", {"state": "stopped"})
        assert isinstance(lost, NodeLost) and lost.rank == 1
        subject = naming.event_subject(STAGE, "cluster", "c-1-1", "spot_preempted")
        assert len(await events_of(bus, subject)) == 1
        await bus.close()

    asyncio.run(main())


def test_instance_watch_reports_a_preempted_spot_node_from_ec2(nats_server, spz_home, fake_aws: FakeAws):
    async def main():
        ec2 = fake_aws.client("us-east-1")
        ids = [i["InstanceId"] for i in ec2.run_instances(
            ImageId=IMAGE, InstanceType="m5.large", MinCount=2, MaxCount=2,
            InstanceMarketOptions={"MarketType": "spot"})["Instances"]]
        clusters = {"train-1-1": provisioned("train-1-1", ids), "here-2-1": provisioned("here-2-1", ["n0"], infra="local")}

        async def find(cluster: str) -> ClusterProvisioned | None:
            return clusters.get(cluster)

        bus = await connect_bus(nats_server)
        out = declared_bus(bus, CONTRACT)
        watch = InstanceWatch(Ec2Watch(session=fake_aws.session(), endpoint_url=fake_aws.endpoint_url),
                              LossReporter(out, service="recovery"), find, lambda: list(clusters), poll_s=60)
        try:
            assert await watch.targets(["here-2-1", "gone"]) == [], "only AWS nodes are asked about"
            assert await watch.check(list(clusters)) == [], "both nodes run"
            assert fake_aws.preempt(ids[1], region="us-east-1") in ("terminated", "shutting-down")
            found = await watch.check(list(clusters))
            assert [(e.EVENT_NAME, e.cluster, e.rank, e.instance_id) for e in found] == [
                ("spot_preempted", "train-1-1", 1, ids[1])]
            assert found[0].evidence["state_reason_code"] == "Server.SpotInstanceTermination"
            assert await watch.check(list(clusters)) == [], "reported once"
        finally:
            await watch.close()
            await bus.close()

    asyncio.run(main())


def job(job_id: int, status: str, *, ended: datetime | None = None, cancel: bool = False) -> machine.JobState:
    state = machine.new_state(ManagedJobSubmitted(managed_job_id=job_id, name=f"j{job_id}",
                                                  tasks=[{"run": "x"}]), seq=job_id, at=T0)
    state.status = status
    state.ended_at = ended
    state.cancel_requested = cancel
    return state


def test_reconcile_looks_at_every_unfinished_job_and_goes_on_after_a_failure():
    now = T0 + timedelta(hours=1)
    jobs = [job(1, "PENDING"), job(2, "RUNNING"), job(3, "RUNNING", cancel=True),
            job(4, "SUCCEEDED", ended=now - timedelta(seconds=30)), job(5, "FAILED", ended=now - timedelta(hours=1))]
    assert due(jobs, now, recheck_ended_s=600, include_recently_ended=False) == [
        Due(1, "kick"), Due(2, "realize"), Due(3, "kick")]
    # At start, jobs ended a little while ago are seen through too (their teardowns).
    assert due(jobs, now, recheck_ended_s=600, include_recently_ended=True) == [
        Due(1, "kick"), Due(2, "realize"), Due(3, "kick"), Due(4, "realize")]

    looked: list[tuple[str, int]] = []

    async def kick(job_id: int) -> None:
        looked.append(("kick", job_id))
        if job_id == 1:
            raise RuntimeError("the bus is away")

    async def realize(job_id: int) -> None:
        looked.append(("realize", job_id))

    rec = Reconciler(lambda: jobs, kick, realize, period_s=60, recheck_ended_s=600, clock=ManualClock(now))
    assert asyncio.run(rec.once()) == [Due(1, "kick"), Due(2, "realize"), Due(3, "kick")]
    assert looked == [("kick", 1), ("realize", 2), ("kick", 3)]
