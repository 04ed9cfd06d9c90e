"""The status service's answers, kept as the bytes sent while the projection stays where it was.

An answer is a function of the committed tables, and the tables change only when a batch is
committed, which moves the projection's position (`Projector.written_seq`). So the JSON of a
query's answer, computed once, is the answer to every identical query until the position moves:
fifty clients polling `spz status` (or the API server's replicas) cost one DuckDB read and one
serialisation per position, not one each. Whatever moves the position empties the cache, so no
answer outlives the state it was read from; identical queries asked while one is being computed
wait for it (one read, not fifty).

The position is read before the query runs: a commit landing while it runs can only make the
answer newer than the position it is kept under, never older (a caller with `min_seq` has waited
for the position first). Bounded in entries and bytes; a query's parameters are kept as a digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

MAX_ENTRIES = 256
MAX_BYTES = 64 * 1024 * 1024
# What only says when to answer, not what: the same answer serves every caller of that position.
NOT_PART_OF_THE_ANSWER = frozenset({"min_seq", "wait_s", "strict"})


def answer_key(query: str, params: dict[str, Any]) -> bytes:
    """The query and its parameters (less when to answer), canonical, as a digest."""
    what = {k: v for k, v in params.items() if k not in NOT_PART_OF_THE_ANSWER}
    canon = json.dumps([query, what], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(canon.encode(), digest_size=16).digest()


def encode(result: Any) -> bytes:
    """The answer as the bus would send it (events/bus.py `serve_queries`)."""
    return json.dumps(result, default=str).encode()


class AnswerCache:
    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.position = -1
        self._answers: dict[bytes, bytes] = {}
        self._size = 0
        self._inflight: dict[tuple[bytes, int], asyncio.Future[bytes]] = {}
        self.hits = 0
        self.computed = 0

    def __len__(self) -> int:
        return len(self._answers)

    async def get(self, key: bytes, position: int, compute: Callable[[], Awaitable[bytes]]) -> bytes:
        """The answer for `key` at `position`: kept, being computed, or computed now."""
        if position > self.position:  # the projection moved: every kept answer is of the past
            self._answers.clear()
            self._size, self.position = 0, position
        if position == self.position and (kept := self._answers.get(key)) is not None:
            self.hits += 1
            return kept
        fut = self._inflight.get((key, position))
        if fut is None:
            fut = asyncio.ensure_future(self._compute(key, position, compute))
            self._inflight[(key, position)] = fut
            fut.add_done_callback(lambda f, k=(key, position): self._landed(k, f))
        # A caller gone (its request timed out) does not cancel the answer the others wait for.
        return await asyncio.shield(fut)

    async def _compute(self, key: bytes, position: int, compute: Callable[[], Awaitable[bytes]]) -> bytes:
        data = await compute()
        self.computed += 1
        if position == self.position:  # (moved on meanwhile: it would never be asked for again)
            self._keep(key, data)
        return data

    def _landed(self, k: tuple[bytes, int], fut: asyncio.Future[bytes]) -> None:
        if self._inflight.get(k) is fut:
            del self._inflight[k]
        if not fut.cancelled():
            fut.exception()  # retrieved: every waiter may have gone

    def _keep(self, key: bytes, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        self._size -= len(self._answers.pop(key, b""))
        while self._answers and (len(self._answers) >= self.max_entries or self._size + len(data) > self.max_bytes):
            oldest = next(iter(self._answers))
            self._size -= len(self._answers.pop(oldest))
        self._answers[key] = data
        self._size += len(data)
