"""Dead letters: an event a service could not apply, parked with why, so the service goes on.

Every consumer parks the same way — `ServiceRunner` (handler errors, unreadable payloads), the
ledger's projection, the recovery service's rebuild and the node agent — by calling `park`:
the original bytes go, unchanged, to `<prefix>.dlq.<service>` on the dead-letter stream
(`naming.dead_letter_stream`), with headers saying which service parked it, the error's
type and message, and where the event sits in the log. `dead_letters` reads them back for
`spz events dlq`, operators and tests.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

from . import naming

log = logging.getLogger("skypurza.deadletters")

ERROR_CHARS = 1000  # a header is one line: long messages (tracebacks, pydantic) are cut here

H_ERROR = "Skypurza-Error"
H_ERROR_TYPE = "Skypurza-Error-Type"
H_SERVICE = "Skypurza-Service"
H_SEQ = "Skypurza-Stream-Seq"
H_SUBJECT = "Skypurza-Subject"
H_PARKED_AT = "Skypurza-Parked-At"


def describe(error: BaseException | str) -> tuple[str, str]:
    """(error type, "Type: message") of an exception; a plain string is its own message."""
    if isinstance(error, BaseException):
        kind = type(error).__name__
        text = str(error)
        return kind, f"{kind}: {text}" if text else kind
    return "", error


def _one_line(text: str) -> str:
    # NATS headers are CRLF-delimited: a newline inside a value would break the message.
    return " | ".join(part.strip() for part in str(text).splitlines() if part.strip())[:ERROR_CHARS]


def headers(service: str, seq: int, subject: str, error: BaseException | str,
            error_type: str | None = None) -> dict[str, str]:
    kind, text = describe(error)
    return {
        H_ERROR: _one_line(text),
        H_ERROR_TYPE: _one_line(error_type or kind or "error"),
        H_SERVICE: _one_line(service),
        H_SEQ: str(int(seq)),
        H_SUBJECT: _one_line(subject),
        H_PARKED_AT: datetime.now(timezone.utc).isoformat(),
        # One dead letter per (service, event): a re-parked copy (redelivery, restart) is dropped.
        "Nats-Msg-Id": f"dlq-{service}-{int(seq)}",
    }


async def park(bus: Any, service: str, *, seq: int, subject: str, raw: bytes, error: BaseException | str,
               error_type: str | None = None) -> None:
    """Put one event (its original bytes) on the dead-letter stream with why it was parked."""
    h = headers(service, seq, subject, error, error_type)
    log.error("%s: parked seq %d (%s): %s", service, seq, subject or "?", h[H_ERROR])
    await bus.js.publish(naming.dead_letter_subject(bus.stage, service), raw, headers=h)


def _event_of(payload: bytes) -> tuple[str | None, str | None]:
    """Type and id of a parked event, where its bytes are readable JSON at all."""
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(raw, dict):
        return None, None
    t, i = raw.get("type"), raw.get("id")
    return (str(t) if t is not None else None), (str(i) if i is not None else None)


async def dead_letters(bus: Any, service: str | None = None) -> list[dict[str, Any]]:
    """What has been parked, oldest first (for `spz events dlq`, operators and tests)."""
    subject = naming.dead_letter_subject(bus.stage, service) if service else f"{naming.subject_prefix(bus.stage)}.dlq.>"
    out = []
    async for msg in bus.replay_raw(filter_subject=subject, stream=bus.dlq_stream):
        h = msg.headers or {}
        event_type, event_id = _event_of(msg.data)
        try:
            seq = int(h.get(H_SEQ, "0"))
        except ValueError:
            seq = 0
        out.append({"service": h.get(H_SERVICE), "error": h.get(H_ERROR), "error_type": h.get(H_ERROR_TYPE),
                    "stream_seq": seq, "subject": h.get(H_SUBJECT), "parked_at": h.get(H_PARKED_AT),
                    "event_type": event_type, "event_id": event_id,
                    "payload": msg.data.decode(errors="replace")})
    return out
