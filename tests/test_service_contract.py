"""The declared contract (events/contract.py): subjects come from what a service consumes,
handlers are registered per type, every publish is checked against what it may emit (on a real
nats-server), loops are a declared shape, and docs/events.md is generated from the declarations."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from nats_fixtures import connect_bus

from skypurza.cli import serve as serve_module
from skypurza.cli.contracts import all_contracts
from skypurza.events import deadletters, naming
from skypurza.events.contract import forget_undeclared_emits, undeclared_emits
from skypurza.events.docgen import roles
from skypurza.events.envelope import derive_id
from skypurza.events.models import (
    ClusterTerminated,
    DownRequested,
    PlacementChosen,
    PlacementFailed,
    TaskSubmitted,
    all_event_types,
)
from skypurza.events.service import (
    Emit,
    EmitContext,
    LoopContract,
    ServiceContract,
    ServiceRunner,
    UndeclaredEmit,
    declared_bus,
    handles,
)
from skypurza.events.types import Candidate

ROOT = Path(__file__).resolve().parents[1]


def submitted(i: int) -> TaskSubmitted:
    return TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}", task={"run": "true"})


def placed(ev: TaskSubmitted) -> PlacementChosen:
    return PlacementChosen(task_id=ev.task_id, cluster=ev.cluster, attempt=1, candidate=Candidate(infra="local"))


class Declared:
    """Reacts to TaskSubmitted: returns a PlacementChosen, or (told so) publishes one through its
    context, or returns / publishes a DownRequested it does not declare."""

    contract = ServiceContract(name="declared", consumes=(TaskSubmitted,), emits=(PlacementChosen,))

    def __init__(self, mode: str = "return"):
        self.mode = mode
        self.bus = None

    async def start(self, bus):
        self.bus = bus

    async def close(self):
        pass

    @handles(TaskSubmitted)
    async def on_submitted(self, stored, ctx: EmitContext):
        ev = stored.event
        if self.mode == "return":
            return [placed(ev)]
        if self.mode == "context":
            await ctx.publish(Emit(placed(ev), key="early"))
            return []
        if self.mode == "undeclared-return":
            return [placed(ev), DownRequested(cluster=ev.cluster)]  # neither may be published
        await ctx.publish(DownRequested(cluster=ev.cluster))
        return []


async def run_until(runner: ServiceRunner, cond, timeout: float = 15.0) -> None:
    task = asyncio.create_task(runner.run())
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while not cond():
            if task.done():
                task.result()
            assert asyncio.get_running_loop().time() < deadline, runner.stats
            await asyncio.sleep(0.05)
    finally:
        runner.stop()
        await asyncio.wait_for(task, 5)


async def events(bus, name: str) -> list:
    return [s async for s in bus.replay(filter_subject=naming.event_filter("test", "*", name))]


@pytest.mark.parametrize("mode", ["undeclared-return", "undeclared-context"])
def test_an_undeclared_emit_fails_loudly_publishes_nothing_and_parks_the_cause(nats_server, mode):
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish(submitted(1))
        runner = ServiceRunner(bus, Declared(mode), max_deliver=5)
        await run_until(runner, lambda: runner.stats.parked == 1)
        # Parked at the first delivery: a bug is not retried five times.
        assert runner.stats.failed == 1 and runner.stats.handled == 0
        parked = await deadletters.dead_letters(bus, "declared")
        assert [p["error_type"] for p in parked] == ["UndeclaredEmit"]
        assert "DownRequested" in parked[0]["error"] or "down_requested" in parked[0]["error"]
        assert await events(bus, "down_requested") == []
        assert await events(bus, "placement_chosen") == []  # none of the cause's reactions went out
        await bus.close()

    asyncio.run(main())
    found = undeclared_emits()
    assert len(found) == 1 and "declared emitted down_requested" in found[0]
    forget_undeclared_emits()  # seen: the session-wide check (conftest) must not fail this test


def test_reactions_and_context_publishes_get_derived_ids_and_are_counted(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish(submitted(1))
        await bus.publish(submitted(2))
        returned = ServiceRunner(bus, Declared("return"))
        await run_until(returned, lambda: returned.stats.handled == 2)
        early = ServiceRunner(bus, Declared("context"), consumer_name=naming.consumer("test", "declaredctx"))
        await run_until(early, lambda: early.stats.handled == 2)
        got = await events(bus, "placement_chosen")
        causes = {s.event.task_id: s for s in [s async for s in bus.replay(
            filter_subject=naming.event_filter("test", "task", "task_submitted"))]}
        ids = {s.envelope.id for s in got}
        for task_id, cause in causes.items():
            assert derive_id(cause.envelope.id, "declared", "placement_chosen") in ids  # returned
            assert derive_id(cause.envelope.id, "declared", "early") in ids  # through the context
        assert len(got) == 4
        for runner in (returned, early):
            assert runner.stats.published == 2 and dict(runner.stats.emitted) == {"placement_chosen": 2}
        await bus.close()

    asyncio.run(main())


def test_a_background_loop_publishing_an_undeclared_type_raises(nats_server):
    """What a service publishes outside a handler (detectors, reconciliation) goes through the bus
    it was started with, checked against the same contract."""
    async def main():
        bus = await connect_bus(nats_server)
        svc = Declared()
        runner = ServiceRunner(bus, svc)
        await svc.start(runner.out)
        with pytest.raises(UndeclaredEmit):
            await svc.bus.publish(DownRequested(cluster="c"))
        with pytest.raises(UndeclaredEmit):  # all of a batch is checked before any is sent
            await svc.bus.publish_many([placed(submitted(1)), DownRequested(cluster="c")])
        assert await events(bus, "down_requested") == [] and await events(bus, "placement_chosen") == []
        await svc.bus.publish(placed(submitted(1)))
        assert runner.stats.emitted == {"placement_chosen": 1}
        # A loop service's bus (the ledger's `run`) is checked the same way.
        loop_bus = declared_bus(bus, LoopContract(name="loop", emits=(ClusterTerminated,)))
        with pytest.raises(UndeclaredEmit):
            await loop_bus.publish(DownRequested(cluster="c"))
        # The view shares the connection: the plain bus still publishes anything.
        await bus.publish(DownRequested(cluster="c"))
        assert len(await events(bus, "down_requested")) == 1
        await bus.close()

    asyncio.run(main())
    assert len(undeclared_emits()) == 3
    forget_undeclared_emits()


def test_handlers_must_cover_exactly_what_is_consumed(nats_server):
    class Missing:
        contract = ServiceContract(name="missing", consumes=(TaskSubmitted, PlacementFailed))

        async def start(self, bus):
            pass

        async def close(self):
            pass

        @handles(TaskSubmitted)
        async def on_submitted(self, stored, ctx):
            return []

    class Extra(Missing):
        contract = ServiceContract(name="extra", consumes=())

    async def main():
        bus = await connect_bus(nats_server)
        with pytest.raises(TypeError, match="PlacementFailed"):
            ServiceRunner(bus, Missing())
        with pytest.raises(TypeError, match="TaskSubmitted"):
            ServiceRunner(bus, Extra())
        with pytest.raises(TypeError, match="ServiceContract"):
            ServiceRunner(bus, type("Loop", (), {"contract": LoopContract(name="loop")})())
        await bus.close()

    asyncio.run(main())


def test_subjects_are_derived_from_what_is_consumed(nats_server):
    mjob = [c for c in all_event_types() if c.AGGREGATE == "mjob"]
    every_mjob = ServiceContract(name="x", consumes=(*mjob, PlacementFailed, TaskSubmitted))
    assert every_mjob.subjects("dev") == [naming.aggregate_events_subject("dev", "mjob"),
                                          naming.event_filter("dev", "task", "placement_failed"),
                                          naming.event_filter("dev", "task", "task_submitted")]
    # The services' subjects are what they were written out as before the contracts.
    by_name = {c.name: c for c in all_contracts()}
    assert by_name["optimizer"].subjects("dev") == [naming.event_filter("dev", "task", "task_submitted"),
                                                    naming.event_filter("dev", "task", "capacity_error"),
                                                    naming.aggregate_events_subject("dev", "dispatch"),
                                                    naming.event_filter("dev", "task", "task_admitted"),
                                                    naming.aggregate_events_subject("dev", "team")]  # workspaces
    assert by_name["recovery"].subjects("dev")[:3] == [naming.aggregate_events_subject("dev", "mjob"),
                                                       naming.event_filter("dev", "task", "placement_failed"),
                                                       naming.event_filter("dev", "task", "provision_failed")]

    async def main():
        # The durable consumer on the server filters on exactly those subjects.
        bus = await connect_bus(nats_server)
        from skypurza.services.optimizer.service import OptimizerService

        runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws"})))
        task = asyncio.create_task(runner.run())
        try:
            for _ in range(100):
                if runner._sub is not None:
                    break
                await asyncio.sleep(0.05)
            info = await bus.js.consumer_info(bus.events_stream, runner.durable)
            assert info.config.filter_subjects == by_name["optimizer"].subjects("test")
        finally:
            runner.stop()
            await asyncio.wait_for(task, 10)
            await bus.close()

    asyncio.run(main())


def test_serve_runs_each_service_by_its_declared_shape():
    for name in serve_module.SERVICES:
        svc = serve_module.load_service(name)
        assert isinstance(svc.contract, (ServiceContract, LoopContract)), name
        assert svc.contract.name == name
    assert isinstance(serve_module.load_service("ledger").contract, LoopContract)
    assert isinstance(serve_module.load_service("optimizer").contract, ServiceContract)


def test_the_docs_table_is_the_declarations():
    contracts = all_contracts()
    table = roles(contracts)
    text = (ROOT / "docs" / "events.md").read_text()
    for cls in all_event_types():
        emit, react = table[cls.EVENT_NAME]
        section = text.split(f"### {cls.__name__} — ")[1].split("\n### ")[0]
        assert f"- emitted by: {emit}\n" in section and f"- reacted to by: {react}\n" in section
        emitters = {part.split(" (")[0] for part in re.split(r", (?![^()]*\))", emit)}
        reactors = {part.split(" (")[0] for part in re.split(r"; (?![^()]*\))", react)}
        assert emitters == {c.name for c in contracts if cls in c.emits}, cls.__name__
        assert reactors - {"nobody"} == {c.name for c in contracts if cls in c.consumes or cls in c.reads}, \
            cls.__name__


def test_the_clis_bus_publishes_only_what_the_cli_declares(nats_server, tmp_path, monkeypatch):
    """`spz` is checked like a service: its bus (cli/control.connect_bus) refuses an event type the
    CLI's contract (cli/contracts.CLI) does not declare, before anything is stored."""
    from skypurza.cli.control import connect_bus as cli_bus
    from skypurza.events.contract import UndeclaredEmit
    from skypurza.events.models import DownRequested, UsageRecorded

    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path))
    monkeypatch.setenv("SKYPURZA_NATS_URL", nats_server.url)
    forget_undeclared_emits()

    from datetime import datetime, timezone

    when = datetime(2026, 12, 1, tzinfo=timezone.utc)

    async def main():
        bus = await cli_bus("clitest", "test")
        try:
            await bus.publish(DownRequested(cluster="c"))  # declared: `spz down`
            with pytest.raises(UndeclaredEmit):
                await bus.publish(UsageRecorded(cluster="c", rank=0, instance_id="i", start=when, end=when,
                                                hourly_price_micros=0, cost_micros=0))
            names = [s.envelope.event_name async for s in bus.replay()]
            assert names == ["down_requested"]
        finally:
            await bus.close()

    asyncio.run(main())
    assert any("UsageRecorded" in u or "usage_recorded" in u for u in undeclared_emits())
    forget_undeclared_emits()
