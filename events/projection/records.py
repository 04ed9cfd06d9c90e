"""Bytes from the log -> a `Record` the projection applies.

Decoding is `events.envelope.decode` itself (one pass from JSON into a typed envelope for the
current versions), so a projection (the status service's, the ledger's) reads every event
exactly as the services do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from skypurza.events import models as _models  # noqa: F401  (fills the registry)
from skypurza.events.envelope import Event, PoisonEvent, decode, split_type
from skypurza.events.principal import stamped_principal


@dataclass(slots=True)
class Record:
    seq: int
    id: str
    type: str
    name: str  # event name without prefix and version ("usage_recorded")
    time: datetime | None
    event: Event | None
    status: str  # "ok", "unknown", "newer", "poison"
    reason: str = ""
    # (user, team) an API server stamped on the envelope (events/principal.py), None on the
    # embedded bus: the projection attributes work by it, never by what the task claims.
    principal: tuple[str, str] | None = None


# Event name of each envelope type met (a replay splits the same few types millions of times).
_NAMES: dict[str, str] = {}


def decode_record(payload: bytes, seq: int) -> Record:
    """`events.envelope.decode` (single pass from JSON for current versions, upcasting for old
    ones), flattened into what the projection applies; unreadable payloads become poison records."""
    try:
        d = decode(payload)
    except PoisonEvent as exc:
        event_id, type_name = salvage_id_and_type(payload)
        return Record(seq, event_id, type_name, split_type(type_name)[0], None, None, "poison", str(exc))
    env = d.envelope
    assert env is not None
    type_name = env.type
    name = _NAMES.get(type_name)
    if name is None:
        name = split_type(type_name)[0]
        if len(_NAMES) < 10_000:  # types come from the log: keep the cache bounded
            _NAMES[type_name] = name
    return Record(seq, env.id, type_name, name, env.time, d.event, d.status, d.reason,
                  stamped_principal(env) if env.model_extra else None)


def salvage_id_and_type(payload: bytes) -> tuple[str, str]:
    """Id and type of an unreadable event, where they can be read at all (for the skipped table)."""
    import json

    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return "", ""
    if not isinstance(raw, dict):
        return "", ""
    return str(raw.get("id") or ""), str(raw.get("type") or "")
