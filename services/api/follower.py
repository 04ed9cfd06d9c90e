"""The API server's directory, kept current by following the identity subjects of the log.

The server keeps no state of its own: at start it reads the `team` and `user` histories from the
first event and then follows them. Before it trusts the directory with a request it asks the
stream for the newest identity event (one direct get per aggregate) and waits, at most
`FRESH_WAIT_S`, until it has seen that one: a token revoked or a user removed is refused from
the moment the event is in the log, not a follow's latency later. When the log's last sequence
has not moved since the directory was last found current, nothing can have been revoked: the
one question (the stream's last sequence) answers it, not two direct gets (bench/api.py); requests
arriving together share that question (logposition.py), each still answered at a position read
after it arrived.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar

from skypurza.events import naming
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.bus import Bus, stored_from_msg

from .identity import Directory
from .logposition import SharedReads

log = logging.getLogger("skypurza.api")

FRESH_WAIT_S = 3.0
# The log's last sequence as this request's authentication read it (a request is a task of its
# own, so no other request sees it): a read that must be as new as the log at the request's start
# (GET /api/v1/clusters, listing.py) need not ask again.
LOG_SEQ_READ: ContextVar[int | None] = ContextVar("log_seq_read", default=None)


class DirectoryStale(Exception):
    """The directory did not catch up with the log in time (the bus is slow or away)."""


class DirectoryFollower:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.directory = Directory()
        self._seen: dict[str, int] = {}  # aggregate -> newest sequence read (applied or not)
        self._verified_seq = 0  # the log's last sequence when the directory was last found current
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self.log_seq = SharedReads(bus.last_seq)

    def start(self) -> None:
        team, user = naming.identity_filters(self.bus.stage)
        self._tasks = [asyncio.create_task(self._follow("team", team), name="follow-team"),
                       asyncio.create_task(self._follow("user", user), name="follow-user")]

    async def close(self) -> None:
        await stop_tasks(*self._tasks)
        await self.log_seq.close()

    async def _follow(self, aggregate: str, subject: str) -> None:
        while True:  # a follower that failed starts again after what it saw: never a silent stop
            try:
                async for msg in self.bus.follow(filter_subject=subject, start_seq=self._seen.get(aggregate, 0) + 1):
                    await self._take(aggregate, msg)
                return  # the follow ends only when the connection was closed (the server stops)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("following %s failed (%s: %s); again in a second", subject, type(exc).__name__, exc)
                await asyncio.sleep(1.0)

    async def _take(self, aggregate: str, msg: object) -> None:
        stored = stored_from_msg(msg)
        if stored.event is not None:
            try:
                self.directory.apply(stored.event, stored.seq)
            except Exception as exc:  # one bad event never stops the server
                log.warning("identity event %s (seq %d) not applied: %s", stored.subject, stored.seq, exc)
        elif stored.status != "ok":
            log.warning("identity event %s (seq %d) skipped: %s", stored.subject, stored.seq, stored.reason)
        async with self._changed:
            self._seen[aggregate] = max(stored.seq, self._seen.get(aggregate, 0))
            self._changed.notify_all()

    async def current(self, wait_s: float = FRESH_WAIT_S) -> Directory:
        """The directory, once it holds every identity event in the log now."""
        log_seq = await self.log_seq.get()
        LOG_SEQ_READ.set(log_seq)
        if log_seq <= self._verified_seq:  # nothing appended since it was found current: it still is
            return self.directory
        wanted: dict[str, int] = {}
        for aggregate, subject in zip(("team", "user"), naming.identity_filters(self.bus.stage)):
            last = await self.bus.last_event(subject)
            wanted[aggregate] = last.seq if last is not None else 0

        def caught_up() -> bool:
            return all(self._seen.get(a, 0) >= s for a, s in wanted.items())

        if not caught_up():
            try:
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait_for(caught_up), wait_s)
            except asyncio.TimeoutError:
                raise DirectoryStale(f"the identity directory did not catch up with the log in {wait_s:.0f} s")
        # Every identity event up to log_seq is in: the newest of each was asked for after it was read.
        self._verified_seq = max(self._verified_seq, log_seq)
        return self.directory
