"""`serve` supervises each service: one that dies is restarted and the others go on."""

from __future__ import annotations

import asyncio

from nats_fixtures import connect_bus

from skypurza.cli import serve as serve_module
from skypurza.events import naming
from skypurza.events.models import PlacementChosen, TaskSubmitted
from skypurza.events.service import LoopContract


class Crashing:
    """A service whose run loop dies twice, then works: counts its starts."""

    contract = LoopContract(name="crashing")
    starts = 0

    async def close(self):
        pass

    async def run(self, bus, stop):
        type(self).starts += 1
        if type(self).starts <= 2:
            raise RuntimeError("broken state file")
        await stop.wait()


def test_a_dying_service_is_restarted_and_does_not_stop_the_others(nats_server, monkeypatch):
    monkeypatch.setitem(serve_module.SERVICES, "crashing", "test_serve:Crashing")
    monkeypatch.setattr(serve_module, "load_service",
                        lambda name: Crashing() if name == "crashing" else _real_load(name))
    Crashing.starts = 0

    async def main():
        stop = asyncio.Event()
        monkeypatch.setenv("SKYPURZA_ENABLED_INFRAS", "aws")
        task = asyncio.create_task(serve_module.serve(nats_server.url, "test", ["crashing", "optimizer"], stop))
        bus = await connect_bus(nats_server)
        await asyncio.sleep(0.5)
        await bus.publish(TaskSubmitted(task_id="t1", cluster="c1", task={"resources": {"accelerators": "T4:1"},
                                                                            "run": "x"}))
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            got = [s async for s in bus.replay(filter_subject=naming.event_filter("test", "task", "placement_chosen"))]
            if got and Crashing.starts >= 3:
                break
            assert asyncio.get_running_loop().time() < deadline, (Crashing.starts, got)
            await asyncio.sleep(0.1)
        assert isinstance(got[0].event, PlacementChosen)
        stop.set()
        await asyncio.wait_for(task, 20)
        await bus.close()

    asyncio.run(main())


_real_load = serve_module.load_service
