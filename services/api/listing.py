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
  so the console's polling costs a few hundred bytes while nothing changes;
- each body gzip-compressed too, once (a JSON listing is ~25x smaller: 1,000 clusters, 0.8 MB,
  are ~30 kB), sent to a client that asks for it (Accept-Encoding: httpx, browsers and curl
  --compressed do), the same bytes to each. Its ETag is the body's, weak (W/), as a compressed
  representation of the same content; If-None-Match compares weakly, so either tag gives a 304.

Concurrent requests of one scope (or one position's rows) share one computation (SingleFlight).
"""

from __future__ import annotations

import asyncio
import gzip
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
HEADERS = {"Cache-Control": "private, no-cache", "Vary": "Authorization, Accept-Encoding"}
GZIP_MIN_BYTES = 1400  # below about one packet compression saves no round trip
GZIP_LEVEL = 1  # ~2 ms for 1 MB, once per position and scope; higher levels save a few % for 3-10x the time
GZIP_OFF_LOOP_BYTES = 1 << 20  # a body this big is compressed on a thread, not holding the event loop


@dataclass(frozen=True)
class Listing:
    seq: int  # the log's last sequence it is (at least) as new as
    body: bytes
    etag: str
    gzipped: bytes | None = None  # the body gzip-compressed, where that is smaller by enough to matter

    @property
    def size(self) -> int:
        return len(self.body) + len(self.gzipped or b"")

    def matches(self, if_none_match: str | None) -> bool:
        """RFC 9110 If-None-Match (weak comparison): `*`, or one of its tags is this body's."""
        if not if_none_match:
            return False
        tags = [t.strip() for t in if_none_match[:4096].split(",")]
        return any(t == "*" or t.removeprefix("W/") == self.etag for t in tags)


def etag_of(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'


def compressed(body: bytes) -> bytes | None:
    """`body` gzip-compressed (no timestamp: the same body, the same bytes), or None where it is
    too small to gain from it or gains under a tenth."""
    if len(body) < GZIP_MIN_BYTES:
        return None
    gz = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
    return gz if len(gz) * 10 < len(body) * 9 else None


async def make_listing(seq: int, body: bytes) -> Listing:
    gz = await asyncio.to_thread(compressed, body) if len(body) >= GZIP_OFF_LOOP_BYTES else compressed(body)
    return Listing(seq, body, etag_of(body), gz)


def accepts_gzip(accept_encoding: str | None) -> bool:
    """RFC 9110 Accept-Encoding: gzip (or x-gzip) with a q above 0, or `*` without gzip named."""
    if not accept_encoding:
        return False
    star = False
    for part in accept_encoding[:1024].split(","):
        name, _, params = part.partition(";")
        q = 1.0
        for p in params.split(";"):
            key, _, value = p.strip().partition("=")
            if key.lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0  # a q that is not a number accepts nothing
        name = name.strip().lower()
        if name in ("gzip", "x-gzip"):
            return q > 0
        if name == "*":
            star = q > 0
    return star


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
        return await make_listing(seq, body)

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
        if made.size > self.max_bytes:
            return
        if old is not None:
            self._size -= self._bodies.pop(scope).size
        while self._bodies and (len(self._bodies) >= self.max_scopes or self._size + made.size > self.max_bytes):
            _, gone = self._bodies.popitem(last=False)
            self._size -= gone.size
        self._bodies[scope] = made
        self._size += made.size


def response(listing: Listing, if_none_match: str | None, accept_encoding: str | None = None) -> Any:
    """The listing as a response, the kept bytes as they are (no encoding, no validation per
    request): gzip-compressed when the client accepts it; 304 with no body when the client holds
    it already."""
    from fastapi.responses import Response

    gz = listing.gzipped if listing.gzipped is not None and accepts_gzip(accept_encoding) else None
    headers = {**HEADERS, "ETag": listing.etag if gz is None else "W/" + listing.etag}
    if listing.matches(if_none_match):
        return Response(status_code=304, headers=headers)
    if gz is not None:
        return Response(gz, media_type="application/json", headers={**headers, "Content-Encoding": "gzip"})
    return Response(listing.body, media_type="application/json", headers=headers)
