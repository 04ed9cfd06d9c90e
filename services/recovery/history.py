"""Reading one aggregate's few events without a consumer.

`Bus.replay` creates an ephemeral consumer per call, which the server keeps until its
inactivity threshold passes; a service that reads one job's history for every fact it handles
would pile up thousands of them (the server refuses new consumers past its limit). A job has a
handful of events, so they are fetched one by one with the stream's "next message on this
subject from this sequence" get instead: no consumer, nothing left behind.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import AsyncIterator

from nats.js.errors import NotFoundError

from skypurza.events.bus import Bus, Stored
from skypurza.events.envelope import PoisonEvent, decode


async def history(bus: Bus, subject: str, start_seq: int = 1) -> AsyncIterator[Stored]:
    """Every event on `subject` (wildcards allowed) from `start_seq` to the end, in order."""
    seq = max(1, start_seq)
    while True:
        try:
            raw = await bus.js.get_msg(bus.events_stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            return
        data = raw.data or b""
        try:
            d = decode(data)
            env, ev, status, reason = d.envelope, d.event, d.status, d.reason
        except PoisonEvent as exc:
            env, ev, status, reason = None, None, "poison", str(exc)
        when = env.time if env is not None else datetime.now(timezone.utc)
        yield Stored(raw.seq or seq, raw.subject or subject, when, env, ev, status, reason, data)
        seq = (raw.seq or seq) + 1
