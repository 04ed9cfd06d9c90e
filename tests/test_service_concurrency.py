"""ServiceRunner's opt-in concurrency: slow handlers of one key do not hold up other keys,
one key stays in stream order, and each message is acked only after its reactions are stored."""

from __future__ import annotations

import asyncio

from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.models import PlacementChosen, TaskSubmitted
from skypurza.events.service import Keyed as KeyedDelivery
from skypurza.events.service import ServiceContract, ServiceRunner, handles
from skypurza.events.types import Candidate


class Keyed:
    """Reacts to TaskSubmitted; cluster "slow" takes `delay` seconds per event."""

    contract = ServiceContract(name="keyed", consumes=(TaskSubmitted,), emits=(PlacementChosen,),
                               delivery=KeyedDelivery(4, lambda stored: stored.event.cluster), ack_wait_s=1.0)

    def __init__(self, delay: float = 0.8):
        self.delay = delay
        self.log: list[tuple[str, str, str]] = []  # (phase, cluster, task_id)

    async def start(self, bus: Bus) -> None:
        pass

    async def close(self) -> None:
        pass

    @handles(TaskSubmitted)
    async def on_submitted(self, stored, ctx):
        ev = stored.event
        self.log.append(("start", ev.cluster, ev.task_id))
        if ev.cluster == "slow":
            await asyncio.sleep(self.delay)
        self.log.append(("end", ev.cluster, ev.task_id))
        return [PlacementChosen(task_id=ev.task_id, cluster=ev.cluster, attempt=1, candidate=Candidate(infra="local"))]


def test_other_keys_overtake_a_slow_one_and_each_key_keeps_its_order(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish_many([
            TaskSubmitted(task_id="s1", cluster="slow", task={}),
            TaskSubmitted(task_id="s2", cluster="slow", task={}),
            *[TaskSubmitted(task_id=f"f{i}", cluster=f"fast{i}", task={}) for i in range(6)],
        ])
        svc = Keyed()
        runner = ServiceRunner(bus, svc)
        assert runner.ack_wait == 1.0  # the service's own ack wait
        task = asyncio.create_task(runner.run())
        try:
            for _ in range(200):
                if runner.stats.handled == 8:
                    break
                await asyncio.sleep(0.05)
        finally:
            runner.stop()
            await asyncio.wait_for(task, 10)
        assert runner.stats.handled == 8
        ends = [t for phase, _, t in svc.log if phase == "end"]
        # Every fast cluster finished before the first slow event did.
        assert ends.index("s1") > max(ends.index(f"f{i}") for i in range(6))
        # The slow cluster's two events never overlapped and kept their order.
        slow = [(phase, t) for phase, c, t in svc.log if c == "slow"]
        assert slow == [("start", "s1"), ("end", "s1"), ("start", "s2"), ("end", "s2")]
        placed = [s async for s in bus.replay(filter_subject=naming.event_filter("test", "task", "placement_chosen"))]
        assert len(placed) == 8
        # Nothing is left unacked: a new runner on the same consumer gets nothing, even after
        # the (1 s) ack wait, although s2 was acked ~1.6 s after it was fetched.
        again = ServiceRunner(bus, Keyed(delay=0))
        task = asyncio.create_task(again.run())
        await asyncio.sleep(1.5)
        again.stop()
        await asyncio.wait_for(task, 10)
        assert again.stats.handled == 0
        await bus.close()

    asyncio.run(main())
