"""Concurrent identical reads share one answer: a request that arrives while the same query is in
flight waits for it instead of asking again.

No state outlives a query: an entry is dropped the moment its answer is in (what is kept after,
per log position, is services/api/listing.py's). Used for `GET /api/v1/clusters`, keyed by what the
status query depends on (the log's sequence it must have caught up with, and whether terminated
clusters are in) and by each caller's scope: fifty clients listing at once cost the status service
one query, not fifty (bench/api.py). Callers must not change the answer.
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


class EncodedRows:
    """A shared answer's rows, each encoded as JSON once: a response joins the bytes of the rows
    its caller may see (FastAPI's encoder would take tens of ms per response for 1,000 rows)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        import json

        self.rows = rows
        self._encoded = {id(r): json.dumps(r, separators=(",", ":"), default=_jsonable).encode() for r in rows}

    @classmethod
    async def of(cls, rows: Awaitable[list[dict[str, Any]]]) -> "EncodedRows":
        return cls(await rows)

    def body(self, shown: list[dict[str, Any]], extra: dict[str, Any]) -> bytes:
        """`{"clusters": shown, **extra}` as JSON; `shown` are rows of this answer."""
        import json

        tail = json.dumps(extra, separators=(",", ":"), default=_jsonable)[1:]  # '"all_users":true}'
        return b'{"clusters":[' + b",".join(self._encoded[id(r)] for r in shown) + b"]" + (
            b"," + tail.encode() if tail != "}" else b"}")

    def response(self, shown: list[dict[str, Any]], extra: dict[str, Any]) -> Any:
        """`body` as a JSON response."""
        from fastapi.responses import Response

        return Response(self.body(shown, extra), media_type="application/json")


def _jsonable(value: Any) -> Any:
    from fastapi.encoders import jsonable_encoder

    return jsonable_encoder(value)
