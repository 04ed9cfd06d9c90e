"""Server-sent events: the frames, and a bound on the streams each caller holds open.

A stream holds a JetStream consumer (or two) while it is open, so each caller may hold at most
`MAX_STREAMS_PER_CALLER` at once (429 beyond, with Retry-After). The slot is taken before the
response starts and given back when it ends however it ends: the last frame sent, an error, or
the client gone (Starlette cancels the body when the client disconnects).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from .problems import Problem

MAX_STREAMS_PER_CALLER = 8
KEEPALIVE_S = 15.0  # a comment frame this often: proxies keep the connection, a gone client is noticed


def frame(event: str, data: Any, id: int | None = None) -> bytes:
    head = f"id: {id}\n" if id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n".encode()


KEEPALIVE = b": keep-alive\n\n"


class StreamSlots:
    """Open streams per caller."""

    def __init__(self, limit: int = MAX_STREAMS_PER_CALLER) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def take(self, caller: str) -> Callable[[], None]:
        n = self.open.get(caller, 0)
        if n >= self.limit:
            raise Problem(429, "too-many-streams", "Too Many Requests",
                          f"{caller} has {n} streams open, the most one caller may hold; close one (or wait for "
                          "one to end) and try again", {"Retry-After": "5"})
        self.open[caller] = n + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                left = self.open.get(caller, 1) - 1
                if left > 0:
                    self.open[caller] = left
                else:
                    self.open.pop(caller, None)

        return release


class SseResponse(StreamingResponse):
    """A `text/event-stream` response that calls `on_close` when it ends, also when its body never
    started (the client left before the first byte)."""

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], None],
                 media_type: str = "text/event-stream", headers: dict[str, str] | None = None) -> None:
        # `media_type`: a plain stream too (a job's log file, routes_history.py), released the same way.
        super().__init__(body, media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()  # the generator's own cleanup (its consumers) runs now
