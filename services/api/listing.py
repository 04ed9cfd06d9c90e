"""`GET /api/v1/clusters` now: the status service's answer at the log's position, as each caller may
see it, kept only while the log stays where it was.

The server keeps no state of its own; this is derived state, keyed by what the answer is a
function of: the log's last sequence (the status service is asked to have committed it, and
refuses when it has not: `strict`) and the caller's scope (the whole principal, with `all_users`
and `include_terminated`, so no caller is ever given a view made for another). An event appended
to the log moves its last sequence, so the next request asks again: no read is staler than the
log it was made at. What is kept:

- the status service's rows at the latest position (one answer with terminated clusters, one
  without), each row's JSON encoded once (singleflight.EncodedRows);
- each scope's response body and its ETag (a digest of the body), LRU, bounded in scopes and
  bytes. A client that sends the ETag back (If-None-Match) gets 304 when the body it would get is
  byte for byte the one it has: a browser does so by itself (`Cache-Control: private, no-cache`),
  so the console's polling costs a few hundred bytes while nothing changes.

Concurrent requests of one scope (or one position's rows) share one computation (SingleFlight).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from skypurza.events import status_queries
from skypurza.events.bus import Bus

from .follower import LOG_SEQ_READ
from .identity import Principal, visible
from .singleflight import EncodedRows, SingleFlight

MAX_SCOPES = 1024
MAX_BYTES = 64 * 1024 * 1024  # ~100 all-users answers of 1,000 clusters
HEADERS = {"Cache-Control": "private, no-cache", "Vary": "Authorization"}


@dataclass(frozen=True)
class Listing:
    seq: int  # the log's last sequence it is (at least) as new as
    body: bytes
    etag: str

    def matches(self, if_none_match: str | None) -> bool:
        """RFC 9110 If-None-Match (weak comparison): `*`, or one of its tags is this body's."""
        if not if_none_match:
            return False
        tags = [t.strip() for t in if_none_match[:4096].split(",")]
        return any(t == "*" or t.removeprefix("W/") == self.etag for t in tags)


def etag_of(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'


class ClusterListings:
    def __init__(self, max_scopes: int = MAX_SCOPES, max_bytes: int = MAX_BYTES) -> None:
        self.max_scopes, self.max_bytes = max_scopes, max_bytes
        self._flight = SingleFlight()
        self._rows: dict[bool, tuple[int, EncodedRows]] = {}
        self._bodies: OrderedDict[Hashable, Listing] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return len(self._bodies)

    async def listing(self, bus: Bus, who: Principal, all_users: bool, include_terminated: bool,
                      timeout: float) -> Listing:
        # The log's position, read after this request arrived (its authentication's, or now): an
        # event acknowledged before the request is in the answer.
        seq = LOG_SEQ_READ.get()
        if seq is None:
            seq = await bus.last_seq()
        scope = (who, all_users, include_terminated)
        kept = self._bodies.get(scope)
        if kept is not None and kept.seq >= seq:
            self._bodies.move_to_end(scope)
            return kept
        made: Listing = await self._flight.run(("scope", scope, seq),
                                               lambda: self._build(bus, scope, seq, timeout))
        self._keep(scope, made)
        return made

    async def _build(self, bus: Bus, scope: tuple[Principal, bool, bool], seq: int, timeout: float) -> Listing:
        who, all_users, include_terminated = scope
        rows = await self._rows_at(bus, include_terminated, seq, timeout)
        body = rows.body(visible(who, rows.rows, all_users), {"all_users": all_users})
        return Listing(seq, body, etag_of(body))

    async def _rows_at(self, bus: Bus, include_terminated: bool, seq: int, timeout: float) -> EncodedRows:
        kept = self._rows.get(include_terminated)
        if kept is not None and kept[0] >= seq:
            return kept[1]

        async def ask() -> EncodedRows:
            return EncodedRows(await status_queries.status(bus, all=include_terminated, min_seq=seq, strict=True,
                                                           timeout=timeout))

        rows: EncodedRows = await self._flight.run(("rows", include_terminated, seq), ask)
        now = self._rows.get(include_terminated)
        if now is None or now[0] < seq:
            self._rows[include_terminated] = (seq, rows)
        return rows

    def _keep(self, scope: Hashable, made: Listing) -> None:
        old = self._bodies.get(scope)
        if old is not None and old.seq >= made.seq:
            return
        if len(made.body) > self.max_bytes:
            return
        if old is not None:
            self._size -= len(self._bodies.pop(scope).body)
        while self._bodies and (len(self._bodies) >= self.max_scopes or self._size + len(made.body) > self.max_bytes):
            _, gone = self._bodies.popitem(last=False)
            self._size -= len(gone.body)
        self._bodies[scope] = made
        self._size += len(made.body)


def response(listing: Listing, if_none_match: str | None) -> Any:
    """The listing as a response: 304 with no body when the client holds it already."""
    from fastapi.responses import Response

    headers = {**HEADERS, "ETag": listing.etag}
    if listing.matches(if_none_match):
        return Response(status_code=304, headers=headers)
    return Response(listing.body, media_type="application/json", headers=headers)
