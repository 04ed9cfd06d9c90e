"""Concurrent identical reads share one answer: a request that arrives while the same query is in
flight waits for it instead of asking again.

No state outlives a query (the server keeps none): an entry is dropped the moment its answer is
in. Used for `GET /api/v1/clusters`, keyed by what the status query depends on (the log's sequence
it must have caught up with, and whether terminated clusters are in): fifty clients listing at once
cost the status service one query, not fifty (bench/api.py). Callers must not change the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any


class SingleFlight:
    def __init__(self) -> None:
        self._inflight: dict[Hashable, asyncio.Future[Any]] = {}

    async def run(self, key: Hashable, query: Callable[[], Awaitable[Any]]) -> Any:
        fut = self._inflight.get(key)
        if fut is None:
            fut = asyncio.ensure_future(query())
            self._inflight[key] = fut

            def done(f: asyncio.Future[Any], key: Hashable = key) -> None:
                if self._inflight.get(key) is f:
                    del self._inflight[key]
                if not f.cancelled():
                    f.exception()  # retrieved: every waiter may have gone

            fut.add_done_callback(done)
        # One waiter leaving (a client gone) does not cancel the query the others wait for.
        return await asyncio.shield(fut)

    def __len__(self) -> int:
        return len(self._inflight)
