"""Parking an event a live projection cannot apply (events/deadletters.py), before its
checkpoint moves past it: a crash in between parks it again, and the copy is de-duplicated."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from skypurza.events import deadletters, naming
from skypurza.events.envelope import split_type

from .pipeline import Failed


def subject_of(stage: str, payload: bytes) -> str:
    """The log subject of a raw event, where its envelope can be read (for its dead letter)."""
    try:
        raw = json.loads(payload)
        aggregate, _, key = str(raw["subject"]).partition("/")
        return naming.event_subject(stage, aggregate, key, split_type(str(raw["type"]))[0])
    except Exception:
        return ""


async def park_failed(bus: Any, service: str, failure: Failed, log: logging.Logger, *, tries: int = 6) -> None:
    """Park `failure` on the dead-letter stream, retrying a bus that is away; the projection's
    `skipped` table records it whatever happens here."""
    subject = subject_of(bus.stage, failure.payload)
    delay = 0.5
    for attempt in range(tries):
        try:
            await deadletters.park(bus, service, seq=failure.seq, subject=subject, raw=failure.payload,
                                   error=failure.error, error_type=failure.error_type)
            return
        except Exception as exc:
            if attempt == tries - 1:
                log.error("could not park seq %d on the dead-letter stream (%s); it is recorded in the "
                          "skipped table", failure.seq, exc)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
