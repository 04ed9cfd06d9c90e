"""The optimizer through the real bus: first placement, failover on capacity errors, restart."""

from __future__ import annotations

import asyncio

from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.models import CapacityError, PlacementChosen, PlacementFailed, TaskSubmitted
from skypurza.events.service import ServiceRunner
from skypurza.services.optimizer.service import OptimizerService

SPOT_V100 = {"resources": {"accelerators": "V100:1", "use_spot": True, "infra": "aws"}, "run": "nvidia-smi"}


async def wait_for(bus, cls, task_id: str, count: int, timeout: float = 15.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = [s.event async for s in bus.replay(filter_subject=naming.aggregate_subjects("test", "task", task_id))
               if isinstance(s.event, cls)]
        if len(got) >= count:
            return got
        assert asyncio.get_running_loop().time() < deadline, f"waited for {count} {cls.__name__}"
        await asyncio.sleep(0.05)


def capacity_error(chosen: PlacementChosen, placement_id: str, code: str = "InsufficientInstanceCapacity",
                   error_class: str = "spot_capacity") -> CapacityError:
    return CapacityError(task_id=chosen.task_id, cluster=chosen.cluster, placement_id=placement_id,
                         attempt=chosen.attempt, candidate=chosen.candidate, error_class=error_class, code=code,
                         message="We currently do not have sufficient capacity")


def test_two_capacity_errors_then_the_third_choice_with_a_restart_in_between(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws"})))
        task = asyncio.create_task(runner.run())
        await bus.publish(TaskSubmitted(task_id="t1", cluster="c1", task=SPOT_V100))
        first = (await wait_for(bus, PlacementChosen, "t1", 1))[0]
        assert first.attempt == 1 and first.candidate.use_spot and first.candidate.zone
        expected = [first.candidate] + first.remaining
        # The plan ranks by price; the first three spot zones are what we should see, in order
        # (same region first: the second choice is in the first choice's region if it has one).
        last_env = (await bus.last_event(naming.event_subject("test", "task", "t1", "placement_chosen"))).envelope
        await bus.publish(capacity_error(first, last_env.id))
        second = (await wait_for(bus, PlacementChosen, "t1", 2))[1]
        assert second.attempt == 2 and second.candidate.zone != first.candidate.zone

        # Kill the optimizer between the errors; a fresh one continues where the log says.
        runner.stop()
        await task
        runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws"})))
        task = asyncio.create_task(runner.run())
        last_env = (await bus.last_event(naming.event_subject("test", "task", "t1", "placement_chosen"))).envelope
        await bus.publish(capacity_error(second, last_env.id))
        chosen = await wait_for(bus, PlacementChosen, "t1", 3)
        third = chosen[2]
        assert third.attempt == 3
        tried = {(c.candidate.region, c.candidate.zone) for c in chosen}
        assert len(tried) == 3, "no attempt may be repeated"
        assert (third.candidate.region, third.candidate.zone) in {(c.region, c.zone) for c in expected}
        # Nothing else was published: exactly three placements, no failure.
        await asyncio.sleep(0.5)
        assert len(await wait_for(bus, PlacementChosen, "t1", 3)) == 3
        runner.stop()
        await task
        await bus.close()

    asyncio.run(main())


def test_quota_error_skips_the_region_and_exhaustion_lists_every_attempt(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws"})))
        task = asyncio.create_task(runner.run())
        narrow = {"resources": {"accelerators": "V100:1", "infra": "aws/us-east-1"}, "run": "true"}
        await bus.publish(TaskSubmitted(task_id="t2", cluster="c2", task=narrow))
        first = (await wait_for(bus, PlacementChosen, "t2", 1))[0]
        assert first.candidate.region == "us-east-1" and not first.candidate.use_spot
        env = (await bus.last_event(naming.event_subject("test", "task", "t2", "placement_chosen"))).envelope
        await bus.publish(capacity_error(first, env.id, code="VcpuLimitExceeded", error_class="quota"))
        failed = (await wait_for(bus, PlacementFailed, "t2", 1))[0]
        assert "VcpuLimitExceeded" in failed.reason and len(failed.attempts) == 1
        runner.stop()
        await task
        await bus.close()

    asyncio.run(main())


def test_infeasible_task_fails_with_an_actionable_reason(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws"})))
        task = asyncio.create_task(runner.run())
        await bus.publish(TaskSubmitted(task_id="t3", cluster="c3",
                                        task={"resources": {"accelerators": "H200:16"}, "run": "x"}))
        failed = (await wait_for(bus, PlacementFailed, "t3", 1))[0]
        assert "H200" in failed.reason and "closest" in failed.reason.lower()
        runner.stop()
        await task
        await bus.close()

    asyncio.run(main())
