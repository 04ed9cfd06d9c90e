"""Pipelined appends on the core NATS client: one reply inbox per connection, one wait per window.

nats-py's `js.publish_async` pays, for every append, a semaphore acquire, an `asyncio.Future`
with a done callback (scheduled on the loop when the ack lands), a random token and a bytearray
inbox. A window of the bus's appends needs none of that per append: one wildcard subscription
per connection receives every ack, each append's reply subject is `<inbox>.<n>` (a counter,
never reused on the connection), and a window has one future, set when its last ack arrives.
This is what `js.publish_async` does underneath (a core publish with a reply subject), less
its per-append bookkeeping (issue 21, bench/bus.py).

Every ack is still read and checked: a reply that is not a stream's ack (an error, a status
such as 503 "no responders", anything unreadable) counts as not acked, as does one that never
comes, and the bus appends those again with the same `Nats-Msg-Id` (`Bus._append`), so the
caller only ever gets an ack the stream gave. The message on the wire is the one
`js.publish_async` sends: the same subject, payload and `Nats-Msg-Id` header.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Sequence

from nats.js import api


@dataclass(eq=False)
class Window:
    """The appends of one window: `acks[i]` is the i-th append's ack, None until (unless) the
    stream acked it; `done` is set when every append got an answer (ack or not)."""

    first: int  # the counter of its first append: its tokens are first .. first + len(acks) - 1
    acks: list[api.PubAck | None]
    left: int
    done: asyncio.Future[None]


def ack_of(msg: Any) -> api.PubAck | None:
    """The stream's ack in a reply, or None when the reply is anything else. Never raises: a
    reply is the server's (or anyone's) bytes, and one odd reply must not stop the reader."""
    if msg.headers:  # a status reply (503: no stream answered); an ack carries no headers
        return None
    try:
        resp = json.loads(msg.data)
    except (ValueError, TypeError):
        return None
    if not isinstance(resp, dict) or "error" in resp:
        return None
    seq, stream = resp.get("seq"), resp.get("stream")
    if type(seq) is not int or not isinstance(stream, str):
        return None
    duplicate, domain = resp.get("duplicate"), resp.get("domain")
    return api.PubAck(stream=stream, seq=seq, domain=domain if isinstance(domain, str) else None,
                      duplicate=duplicate if isinstance(duplicate, bool) else None)


class AckInbox:
    """The one reply subscription of a connection's pipelined appends (subscribed on first use;
    nats-py subscribes it again after a reconnect)."""

    def __init__(self, nc: Any):
        self._nc = nc
        self._base = ""  # "<inbox>." once subscribed
        self._base_len = 0
        self._starting: asyncio.Lock | None = None
        self._waiting: dict[str, tuple[Window, int]] = {}
        self._next = 0

    @property
    def waiting(self) -> int:
        """Appends sent whose answer has not come (and whose window still waits for it)."""
        return len(self._waiting)

    async def _start(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if not self._base:
                base = self._nc.new_inbox() + "."
                await self._nc.subscribe(base + "*", cb=self._on_reply)
                self._base, self._base_len = base, len(base)

    async def send(self, appends: Sequence[tuple[str, bytes, str]]) -> Window:
        """Publish the appends, each (subject, payload, msg id), without waiting for their acks."""
        if not self._base:
            await self._start()
        loop = asyncio.get_running_loop()
        count = len(appends)
        first = self._next
        self._next += count
        window = Window(first, [None] * count, count, loop.create_future())
        if count == 0:
            window.done.set_result(None)
            return window
        publish, base, waiting = self._nc.publish, self._base, self._waiting
        token = first
        try:
            for i, (subject, payload, msg_id) in enumerate(appends):
                key = str(token)
                waiting[key] = (window, i)
                token += 1
                await publish(subject, payload, reply=base + key, headers={"Nats-Msg-Id": msg_id})
        except BaseException:
            self.forget(window)
            raise
        return window

    async def wait(self, window: Window, quiet: float) -> None:
        """Wait until every append of `window` is answered, for as long as answers keep coming:
        it gives up on the rest once `quiet` seconds pass without one (a server killed between
        storing and answering never answers). A busy server that syncs every write to a slow
        disk acks a big window over several seconds; giving up on it then would append the rest
        again one by one, slower still. A late ack is dropped: its append is retried by id (and
        de-duplicated)."""
        while not window.done.done():
            left = window.left
            await asyncio.wait((window.done,), timeout=quiet)
            if window.left == left:
                break
        if window.left:
            self.forget(window)

    def forget(self, window: Window) -> None:
        pop = self._waiting.pop
        for token in range(window.first, window.first + len(window.acks)):
            pop(str(token), None)
        if not window.done.done():
            window.done.cancel()

    async def _on_reply(self, msg: Any) -> None:
        entry = self._waiting.pop(msg.subject[self._base_len:], None)
        if entry is None:  # late (its window gave up on it) or not ours
            return
        window, i = entry
        window.acks[i] = ack_of(msg)
        window.left -= 1
        if window.left == 0 and not window.done.done():
            window.done.set_result(None)
