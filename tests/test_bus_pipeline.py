"""Pipelined appends (events/pubpipe.py) on a real nats-server: every ack read and checked,
anything else counted as not acked, late answers dropped, de-dup by Nats-Msg-Id kept."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg
from nats.js import api
from nats_fixtures import connect_bus

from skypurza.events.models import TaskSubmitted
from skypurza.events.pubpipe import AckInbox, ack_of


def submitted(i: int) -> TaskSubmitted:
    return TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}", task={"run": f"echo {i}"})


def test_a_window_published_twice_is_stored_once_each_with_its_id_header(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        envs = [bus.envelope(submitted(i)) for i in range(30)]
        first = await bus.publish_many(envs, window=7)  # several windows, the last one short
        again = await bus.publish_many(envs, window=7)
        assert [a.seq for a in first] == list(range(1, 31))
        assert [a.seq for a in again] == list(range(1, 31)) and all(a.duplicate for a in again)
        assert not any(a.duplicate for a in first)
        assert (await bus.last_seq()) == 30
        for seq in (1, 17, 30):
            raw = await bus.js.get_msg(bus.events_stream, seq)
            assert raw.headers["Nats-Msg-Id"] == envs[seq - 1].id
            assert raw.data == envs[seq - 1].to_json()
        assert bus._link.acks is not None and bus._link.acks.waiting == 0
        await bus.close()

    asyncio.run(main())


def test_concurrent_windows_and_a_watched_view_share_one_inbox_and_keep_their_acks_apart(nats_server):
    class Count:
        def __init__(self):
            self.acked = 0

        def before(self, env):
            pass

        def after(self, env, ack):
            self.acked += 1

    async def main():
        bus = await connect_bus(nats_server)
        hooks = Count()
        view = bus.watched(hooks)
        a, b = await asyncio.gather(bus.publish_many([submitted(i) for i in range(300)], window=64),
                                    view.publish_many([submitted(i) for i in range(300, 600)], window=50))
        assert len({x.seq for x in a + b}) == 600 and max(x.seq for x in a + b) == 600
        assert hooks.acked == 300
        stored = {s.seq: s.event.task_id async for s in bus.replay()}
        assert [stored[x.seq] for x in a] == [f"t{i}" for i in range(300)]
        assert [stored[x.seq] for x in b] == [f"t{i}" for i in range(300, 600)]
        await bus.close()

    asyncio.run(main())


def test_pipelined_appends_go_on_after_the_server_restarts(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish_many([submitted(i) for i in range(10)])
        nats_server.kill()
        await asyncio.sleep(0.3)
        nats_server.start()
        for _ in range(100):  # until the client has reconnected (its inbox subscribed again)
            if bus.nc.is_connected:
                break
            await asyncio.sleep(0.1)
        acks = await asyncio.wait_for(bus.publish_many([submitted(i) for i in range(10, 20)], ack_wait=2.0), 60)
        assert [a.seq for a in acks] == list(range(11, 21))
        assert [s.event.task_id async for s in bus.replay()] == [f"t{i}" for i in range(20)]
        await bus.close()

    asyncio.run(main())


def test_a_refusal_or_no_stream_is_not_an_ack(nats_server):
    """A stream's error answer (here: the message is over the stream's size limit) and the
    server's 503 status (no stream for the subject) both leave the append un-acked."""
    async def main():
        bus = await connect_bus(nats_server)
        await bus.js.add_stream(api.StreamConfig(name="SMALL", subjects=["small.>"], max_msg_size=64))
        inbox = AckInbox(bus.nc)
        window = await inbox.send([("small.a", b"x" * 200, "id-a"), ("small.b", b"ok", "id-b"),
                                   ("nostream.c", b"ok", "id-c")])
        await inbox.wait(window, 10.0)
        assert window.left == 0 and inbox.waiting == 0
        assert window.acks[0] is None and window.acks[2] is None
        assert window.acks[1] is not None and window.acks[1].stream == "SMALL" and window.acks[1].seq == 1
        await bus.close()

    asyncio.run(main())


def test_a_late_or_forged_answer_changes_nothing_and_stops_no_reader(nats_server):
    """Appends to a subject someone listens on without answering: nothing comes, the wait is
    bounded, what comes after it is dropped; an unreadable reply counts as not acked and the
    next good one is still read."""
    async def main():
        bus = await connect_bus(nats_server)
        got: list = []

        async def keep(msg) -> None:
            got.append(msg)

        sub = await bus.nc.subscribe("quiet.>", cb=keep)
        inbox = AckInbox(bus.nc)
        window = await inbox.send([("quiet.a", b"1", "a"), ("quiet.b", b"2", "b"), ("quiet.c", b"3", "c")])
        for _ in range(100):
            if len(got) == 3:
                break
            await asyncio.sleep(0.02)
        await bus.nc.publish(got[0].reply, b"not json {")
        await bus.nc.publish(got[1].reply, b'{"stream":"S","seq":7}')
        await asyncio.sleep(0.2)
        await inbox.wait(window, 0.3)  # the third is never answered: the wait gives up
        assert window.acks[0] is None and window.acks[1].seq == 7 and window.acks[2] is None
        assert window.left == 1 and inbox.waiting == 0
        await bus.nc.publish(got[2].reply, b'{"stream":"S","seq":8}')  # too late
        await asyncio.sleep(0.2)
        assert window.acks[2] is None
        # The inbox still reads: a new window through it is acked by the real stream.
        acks = await bus.publish_many([submitted(1)])
        assert acks[0].seq == 1
        await sub.unsubscribe()
        await bus.close()

    asyncio.run(main())


def test_ack_of_reads_only_a_streams_ack():
    def msg(data: bytes, headers=None) -> Msg:
        return Msg(_client=None, subject="x", data=data, headers=headers)

    assert ack_of(msg(b'{"stream":"E","seq":3}')) == api.PubAck(stream="E", seq=3)
    assert ack_of(msg(b'{"stream":"E","seq":3,"duplicate":true}')).duplicate is True
    for bad in (b"", b"null", b"[]", b'{"seq":3}', b'{"stream":"E","seq":"3"}', b'{"stream":"E","seq":true}',
                b'{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}}',
                b"\xff\xfe"):
        assert ack_of(msg(bad)) is None, bad
    assert ack_of(msg(b'{"stream":"E","seq":3}', headers={"Status": "503"})) is None


def test_a_window_acked_slowly_but_steadily_is_waited_for_not_given_up(nats_server):
    """Acks that keep coming (a busy server syncing to a slow disk) are waited for past `quiet`
    in all: only a stretch of `quiet` with no ack at all ends the wait."""
    async def main():
        bus = await connect_bus(nats_server)
        seq = 0

        async def slow_stream(msg) -> None:
            nonlocal seq
            await asyncio.sleep(0.15)  # nats-py runs one callback at a time: one ack per 0.15 s
            seq += 1
            await bus.nc.publish(msg.reply, b'{"stream":"SLOW","seq":%d}' % seq)

        sub = await bus.nc.subscribe("slow.>", cb=slow_stream)
        inbox = AckInbox(bus.nc)
        window = await inbox.send([(f"slow.{i}", b"x", f"id-{i}") for i in range(8)])
        began = asyncio.get_running_loop().time()
        await inbox.wait(window, 0.5)
        assert asyncio.get_running_loop().time() - began > 1.0  # longer than `quiet`, all acked
        assert [a.seq for a in window.acks] == list(range(1, 9)) and inbox.waiting == 0
        await sub.unsubscribe()
        await bus.close()

    asyncio.run(main())
