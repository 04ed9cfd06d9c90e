"""The event log on a real nats-server: de-dup, redelivery, replay, crash safety, dead letters."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timedelta, timezone

import pytest
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.bus import Bus, ConcurrencyConflict, fetch
from skypurza.events.envelope import derive_id
from skypurza.events.models import PlacementChosen, TaskSubmitted
from skypurza.events.service import ServiceContract, ServiceRunner, dead_letters, handles
from skypurza.events.types import Candidate


def submitted(i: int) -> TaskSubmitted:
    return TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}", task={"run": f"echo {i}"})


class Echo:
    """A tiny service: reacts to TaskSubmitted with a PlacementChosen; can be told to crash."""

    contract = ServiceContract(name="echo", consumes=(TaskSubmitted,), emits=(PlacementChosen,))

    def __init__(self, crash_times: int = 0, always_fail: bool = False):
        self.crash_times = crash_times
        self.always_fail = always_fail
        self.calls = 0

    async def start(self, bus: Bus) -> None:
        pass

    async def close(self) -> None:
        pass

    @handles(TaskSubmitted)
    async def on_submitted(self, stored, ctx):
        self.calls += 1
        if self.always_fail or self.calls <= self.crash_times:
            raise RuntimeError("boom")
        ev = stored.event
        return [PlacementChosen(task_id=ev.task_id, cluster=ev.cluster, attempt=1,
                                candidate=Candidate(infra="local"))]


async def run_until(runner: ServiceRunner, cond, timeout: float = 15.0) -> None:
    task = asyncio.create_task(runner.run())
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while not cond():
            if task.done():
                task.result()
            assert asyncio.get_running_loop().time() < deadline, "condition not reached"
            await asyncio.sleep(0.05)
    finally:
        runner.stop()
        await asyncio.wait_for(task, 5)


async def all_events(bus: Bus, subject: str | None = None):
    return [s async for s in bus.replay(filter_subject=subject)]


def test_publish_twice_is_stored_once(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        env = bus.envelope(submitted(1))
        a1 = await bus.publish(env)
        a2 = await bus.publish(env)
        assert a1.seq == a2.seq == 1 and a2.duplicate
        events = await all_events(bus)
        assert [e.envelope.id for e in events] == [env.id]
        assert events[0].event == submitted(1)
        await bus.close()

    asyncio.run(main())


def test_round_trip_consume_ack_and_derived_ids(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        envs = [bus.envelope(submitted(i)) for i in range(5)]
        await bus.publish_many(envs)
        svc = Echo()
        runner = ServiceRunner(bus, svc)
        await run_until(runner, lambda: runner.stats.handled == 5)
        placed = await all_events(bus, naming.event_filter("test", "task", "placement_chosen"))
        assert len(placed) == 5
        assert {p.envelope.id for p in placed} == {derive_id(e.id, "echo", "placement_chosen") for e in envs}
        # A second runner on the same durable consumer sees nothing new: everything was acked.
        runner2 = ServiceRunner(bus, Echo())
        task = asyncio.create_task(runner2.run())
        await asyncio.sleep(1.5)
        runner2.stop()
        await task
        assert runner2.stats.handled == 0
        await bus.close()

    asyncio.run(main())


def test_crash_before_ack_is_redelivered_without_duplicate_output(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        env = bus.envelope(submitted(7))
        await bus.publish(env)
        svc = Echo()
        # First run: the handler publishes its reaction, then the process "dies" before the ack.
        runner = ServiceRunner(bus, svc, ack_wait=1.0)
        await runner._subscribe()
        msgs = await runner._sub.fetch(batch=1, timeout=2)
        stored = __import__("skypurza.events.bus", fromlist=["x"]).stored_from_msg(msgs[0])
        await runner.handle(stored)  # published, never acked
        # Redelivery after the ack wait: a fresh runner handles it again.
        runner2 = ServiceRunner(bus, Echo(), ack_wait=1.0)
        await run_until(runner2, lambda: runner2.stats.handled == 1, timeout=20)
        placed = await all_events(bus, naming.event_filter("test", "task", "placement_chosen"))
        assert len(placed) == 1, "the redelivered cause must not publish a second reaction"
        await bus.close()

    asyncio.run(main())


def test_handler_errors_are_retried_then_parked_and_consumer_goes_on(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish(submitted(1))
        svc = Echo(crash_times=2)
        runner = ServiceRunner(bus, svc, backoff=[0.1, 0.1, 0.1], max_deliver=3)
        await run_until(runner, lambda: runner.stats.handled == 1)
        assert svc.calls == 3

        bad = Echo(always_fail=True)
        bad.contract = dataclasses.replace(Echo.contract, name="bad")
        await bus.publish(submitted(2))
        runner = ServiceRunner(bus, bad, backoff=[0.1, 0.1, 0.1], max_deliver=3)
        await run_until(runner, lambda: runner.stats.parked == 2)  # t1 and t2 for this new consumer
        parked = await dead_letters(bus, "bad")
        assert sorted(p["stream_seq"] for p in parked) == [1, 3]
        assert all("boom" in p["error"] for p in parked)
        await bus.close()

    asyncio.run(main())


def test_invalid_payload_is_parked_not_fatal(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        subject = naming.event_subject("test", "task", "x1", "task_submitted")
        await bus.js.publish(subject, b"{not json", headers={"Nats-Msg-Id": "garbage-1"})
        bad_data = bus.envelope(submitted(2)).model_copy(update={"data": {"cluster": 5}})
        await bus.js.publish(subject, bad_data.to_json(), headers={"Nats-Msg-Id": "garbage-2"})
        await bus.publish(submitted(3))
        svc = Echo()
        runner = ServiceRunner(bus, svc)
        await run_until(runner, lambda: runner.stats.handled == 1 and runner.stats.parked == 2)
        parked = await dead_letters(bus, "echo")
        assert [p["stream_seq"] for p in parked] == [1, 2]
        assert "not JSON" in parked[0]["error"] and "invalid" in parked[1]["error"]
        await bus.close()

    asyncio.run(main())


def test_unknown_types_and_newer_versions_do_not_crash(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        env = bus.envelope(submitted(1))
        unknown = env.model_copy(update={"type": "io.skypurza.something_new.v1", "id": "u1"})
        newer = env.model_copy(update={"type": "io.skypurza.task_submitted.v9", "id": "n1"})
        subject = naming.event_subject("test", "task", "t1", "task_submitted")
        await bus.js.publish(subject, unknown.to_json(), headers={"Nats-Msg-Id": "u1"})
        await bus.js.publish(subject, newer.to_json(), headers={"Nats-Msg-Id": "n1"})
        await bus.publish(submitted(2))
        runner = ServiceRunner(bus, Echo())
        await run_until(runner, lambda: runner.stats.handled == 1 and runner.stats.skipped == 1)
        stored = await all_events(bus)
        assert [s.status for s in stored][:3] == ["unknown", "newer", "ok"]
        await bus.close()

    asyncio.run(main())


def test_replay_from_sequence_and_time_returns_exactly_the_stored_events(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish_many([submitted(i) for i in range(10)])
        await asyncio.sleep(0.05)
        mid = datetime.now(timezone.utc)
        await asyncio.sleep(0.05)
        await bus.publish_many([submitted(i) for i in range(10, 15)])
        all_ = await all_events(bus)
        assert [s.seq for s in all_] == list(range(1, 16))
        assert [s.event.task_id for s in all_] == [f"t{i}" for i in range(15)]
        from_seq = [s async for s in bus.replay(start_seq=12)]
        assert [s.seq for s in from_seq] == [12, 13, 14, 15]
        from_time = [s async for s in bus.replay(start_time=mid)]
        assert [s.event.task_id for s in from_time] == [f"t{i}" for i in range(10, 15)]
        until = [s async for s in bus.replay(start_seq=3, until_seq=5)]
        assert [s.seq for s in until] == [3, 4, 5]
        assert [s async for s in bus.replay(start_time=datetime.now(timezone.utc) + timedelta(hours=1))] == []
        await bus.close()

    asyncio.run(main())


def test_optimistic_concurrency_one_writer_wins(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish(submitted(1))
        last = await bus.last_event(naming.aggregate_subjects("test", "task", "t1"))
        writers = [bus.publish(TaskSubmitted(task_id="t1", cluster=f"w{i}", task={}), expected_last_seq=last.seq)
                   for i in range(20)]
        results = await asyncio.gather(*writers, return_exceptions=True)
        assert sum(1 for r in results if not isinstance(r, Exception)) == 1
        assert all(isinstance(r, ConcurrencyConflict) for r in results if isinstance(r, Exception))
        await bus.close()

    asyncio.run(main())


def test_server_sigkill_loses_no_acked_event_and_client_resumes(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish_many([submitted(i) for i in range(50)])
        nats_server.kill()
        await asyncio.sleep(0.3)
        nats_server.start()
        # The same client reconnects by itself and goes on publishing and reading.
        for _ in range(100):
            try:
                await bus.publish(submitted(50))
                break
            except Exception:
                await asyncio.sleep(0.1)
        stored = await all_events(bus)
        assert [s.event.task_id for s in stored] == [f"t{i}" for i in range(51)]
        # A durable consumer created before the crash resumes after it.
        runner = ServiceRunner(bus, Echo())
        await run_until(runner, lambda: runner.stats.handled == 51, timeout=30)
        await bus.close()

    asyncio.run(main())


def test_a_pipelined_append_the_server_never_answers_is_retried_not_waited_for_ever(nats_server):
    """A server killed after it read an append but before it answered never answers: the
    pipelined ack is waited for a bounded time, then the append is retried with the same id
    (this hung the optimizer for ever in a chaos campaign)."""
    import os
    import signal

    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish(submitted(0))
        env = bus.envelope(submitted(1))
        os.kill(nats_server.process.pid, signal.SIGSTOP)  # reads nothing, answers nothing
        fut = await bus.send(env)
        await asyncio.sleep(0.3)  # the client has written it to the socket
        nats_server.kill()
        nats_server.start()
        ack = await asyncio.wait_for(bus.settle(env, fut, timeout=1.0), 40)
        assert ack.seq >= 2
        stored = [s.envelope.id for s in await all_events(bus)]
        assert stored.count(env.id) == 1 and len(stored) == 2
        await bus.close()

    asyncio.run(main())


def test_a_pipelined_window_the_server_never_answers_is_retried_by_id(nats_server):
    """publish_many waits once per window (not a timer per append): what is still unanswered
    after `ack_wait` is appended again with the same ids, each stored once, in order."""
    import os
    import signal

    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish(submitted(0))
        os.kill(nats_server.process.pid, signal.SIGSTOP)  # reads nothing, answers nothing
        task = asyncio.ensure_future(bus.publish_many([submitted(i) for i in range(1, 21)], ack_wait=1.0))
        await asyncio.sleep(0.3)  # the client has written the window to the socket
        nats_server.kill()
        nats_server.start()
        acks = await asyncio.wait_for(task, 40)
        assert len(acks) == 20 and [a.seq for a in acks] == sorted(a.seq for a in acks)
        stored = await all_events(bus)
        assert [s.event.task_id for s in stored] == [f"t{i}" for i in range(21)]
        await bus.close()

    asyncio.run(main())


def test_what_the_bus_publishes_is_stored_byte_for_byte_as_the_validated_envelope(nats_server):
    """The bus builds its envelopes without re-validating the event (envelope_of); the stored
    bytes are those of the validated envelope (make_envelope) with the same id and time."""
    from skypurza.events.envelope import make_envelope

    async def main():
        bus = await connect_bus(nats_server)
        t = datetime(2026, 10, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
        evs = [submitted(i) for i in range(3)]
        envs = [bus.envelope(e, id=f"id-{i}", time=t) for i, e in enumerate(evs)]
        await bus.publish_many(envs[:2])
        await bus.publish(envs[2])
        stored = await all_events(bus)
        assert [s.raw for s in stored] == [make_envelope(e, source=bus.source, id=f"id-{i}", time=t).to_json()
                                           for i, e in enumerate(evs)]
        await bus.close()

    asyncio.run(main())


def test_a_replay_is_not_cut_short_by_a_server_that_pauses(nats_server):
    """A fetch that times out while the server still holds messages for the replay is not the
    end of the log (a server busy or just restarted delivers late)."""
    import os
    import signal
    import threading

    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish_many([submitted(i) for i in range(600)])
        seen = 0
        async for _ in bus.replay(batch=100):
            seen += 1
            if seen == 100:  # mid-replay: the server stops answering for 2.5 s
                os.kill(nats_server.process.pid, signal.SIGSTOP)
                threading.Timer(2.5, os.kill, (nats_server.process.pid, signal.SIGCONT)).start()
        assert seen == 600
        await bus.close()

    asyncio.run(main())


def test_a_replay_goes_on_across_a_server_restart(nats_server):
    """The replay's consumer lives in the server's memory: a restart mid-replay loses it, and the
    replay goes on from the next message on a new one (each message once, none missing)."""

    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish_many([submitted(i) for i in range(600)])
        seen: list[str] = []
        async for s in bus.replay(batch=100):
            seen.append(s.event.task_id)
            if len(seen) == 150:
                nats_server.kill()
                nats_server.start()
        assert seen == [f"t{i}" for i in range(600)]
        await bus.close()

    asyncio.run(main())


def test_a_reader_whose_cancellation_nats_py_swallowed_still_stops():
    """Python 3.11's wait_for (inside nats-py's fetch) returns its result instead of raising when
    the wait it guards ends in the same turn as the cancel; a reader looping on fetch then never
    stopped (seen: a follower kept a test's teardown waiting until the 300 s timeout). The
    subscription here does exactly that, every time: `fetch` raises the lost cancellation."""

    class SwallowingSubscription:
        fetched = 0

        async def fetch(self, batch: int, timeout: float) -> list:
            self.fetched += 1
            try:
                await asyncio.sleep(timeout)
            except asyncio.CancelledError:
                return []  # what wait_for does when the inner wait finished as it was cancelled
            return []

    async def main() -> None:
        sub = SwallowingSubscription()

        async def reader() -> None:
            while True:
                await fetch(sub, batch=10, timeout=0.05)

        task = asyncio.create_task(reader())
        await asyncio.sleep(0.2)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        assert done, "a cancelled reader went on fetching"
        assert task.cancelled()
        before = sub.fetched
        await asyncio.sleep(0.2)
        assert sub.fetched == before

    asyncio.run(main())


def test_stream_settings(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        info = await bus.js.stream_info(naming.events_stream("test"))
        cfg = info.config
        assert cfg.deny_delete and cfg.deny_purge
        assert not cfg.max_age
        assert cfg.duplicate_window >= 60
        assert str(getattr(cfg.storage, "value", cfg.storage)) == "file"
        logs = await bus.js.stream_info(naming.logs_stream("test"))
        assert logs.config.max_age and logs.config.max_bytes
        with pytest.raises(Exception):
            await bus.js.purge_stream(naming.events_stream("test"))
        await bus.close()

    asyncio.run(main())


def test_replays_leave_no_consumer_behind(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish_many([submitted(i) for i in range(3)])
        for _ in range(30):
            assert len([s async for s in bus.replay()]) == 3
        info = await bus.js.stream_info(naming.events_stream("test"))
        assert info.state.consumer_count == 0
        await bus.close()

    asyncio.run(main())


def test_an_append_that_finds_no_stream_gives_up_with_that_failure(nats_server, monkeypatch):
    """A stream that stays leaderless (here: deleted) is retried for the election window, then the
    append fails with the server's answer — not 'No active exception to reraise'."""
    import nats.errors
    import nats.js.errors

    import skypurza.events.bus as bus_module

    monkeypatch.setattr(bus_module, "ELECTION_WAIT_S", 0.5)

    async def go():
        bus = await connect_bus(nats_server, stage="nostream")
        try:
            await bus.js.delete_stream(bus.events_stream)
            began = asyncio.get_running_loop().time()
            with pytest.raises((nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError,
                                nats.js.errors.ServiceUnavailableError)):
                await bus.publish(submitted(1), retries=2)
            assert asyncio.get_running_loop().time() - began >= 0.5, "retried for the election window"
        finally:
            await bus.close()

    asyncio.run(go())
