"""The log's last sequence for every request, one stream-info round trip for all who ask at once.

Every authenticated request reads the log's position (services/api/follower.py: is the identity
directory current? and GET /api/v1/clusters answers at it). Asked by each request alone, that is
one JetStream stream info per request, which costs the NATS server more CPU than the API server
spends answering a cached listing (bench/api.py: ~0.2 ms each). Here, requests that arrive
together share one read, and never one that was sent before they arrived: a read in flight may
have left before an event acknowledged just before the request, so a caller that finds one in
flight waits for the next, which leaves once the one in flight is answered and carries every
caller that came meanwhile. So every caller gets a position read after it asked (never staler
than a read of its own would be), at most two round trips later, and fifty callers at once cost
two reads, not fifty.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class SharedReads:
    """`read()` shared by the callers waiting when it is sent; callers arriving after wait for the next."""

    def __init__(self, read: Callable[[], Awaitable[int]]) -> None:
        self._read = read
        self._next: asyncio.Future[int] | None = None  # the read the callers now arriving will share
        self._pump: asyncio.Task[None] | None = None
        self.reads = 0  # how many reads were sent (the tests count them)

    async def get(self) -> int:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            self._next.add_done_callback(_retrieved)
        fut = self._next
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._run(), name="log-position")
        # A caller that leaves (its client gone) does not cancel the read the others wait for.
        return await asyncio.shield(fut)

    async def _run(self) -> None:
        while self._next is not None:
            fut, self._next = self._next, None  # who comes from now on waits for the next read
            self.reads += 1
            try:
                seq = await self._read()
            except asyncio.CancelledError:
                fut.cancel()
                raise
            except Exception as exc:  # each waiter answers its request with it (a 503)
                fut.set_exception(exc)
            else:
                fut.set_result(seq)

    async def close(self) -> None:
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            try:
                await self._pump
            except asyncio.CancelledError:
                pass
        if self._next is not None and not self._next.done():
            self._next.cancel()


def _retrieved(f: asyncio.Future[int]) -> None:
    if not f.cancelled():
        f.exception()  # retrieved: every waiter may have gone
