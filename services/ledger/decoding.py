"""Bytes from the log -> a `Record` the projection applies: fast for current versions.

`events.envelope.decode` validates the envelope and then the payload from a Python dict (about
19 µs an event here). For an event of the current version we validate the whole message in one
pass from JSON with an envelope model whose `data` is typed (about 7 µs): the same checks, the
same model. Anything else (older versions to upcast, unknown types, a payload that does not
validate) takes the generic path, so the outcome is always what `decode` would say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from skypurza.events import models as _models  # noqa: F401  (fills the registry)
from skypurza.events.envelope import REGISTRY, Event, PoisonEvent, decode, split_type

_TYPE_RE = re.compile(rb'"type"\s*:\s*"([^"\\]+)"')


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


class _EnvelopeBase(BaseModel):
    model_config = ConfigDict(extra="ignore")

    specversion: Literal["1.0"] = "1.0"
    id: str
    source: str
    type: str
    time: datetime
    subject: str


_TYPED: dict[str, type[BaseModel]] = {}
# type bytes as found in a payload -> (type name, event name, typed envelope model), or None
# when the type is not one of the current versions (those take the generic path).
_FAST: dict[bytes, tuple[str, str, Any] | None] = {}


def _typed(cls: type[Event]) -> type[BaseModel]:
    model = _TYPED.get(cls.EVENT_NAME)
    if model is None:
        model = create_model(f"Envelope_{cls.__name__}", __base__=_EnvelopeBase, data=(cls, ...))
        _TYPED[cls.EVENT_NAME] = model
    return model


def _fast_entry(raw_type: bytes) -> tuple[str, str, Any] | None:
    if raw_type in _FAST:
        return _FAST[raw_type]
    type_name = raw_type.decode()
    name, version = split_type(type_name)
    cls = REGISTRY.get(name)
    entry = (type_name, name, _typed(cls).model_validate_json) if cls is not None and version == cls.VERSION else None
    if len(_FAST) < 1000:
        _FAST[raw_type] = entry
    return entry


def decode_record(payload: bytes, seq: int) -> Record:
    m = _TYPE_RE.search(payload)
    if m is not None:
        entry = _fast_entry(m.group(1))
        if entry is not None:
            type_name, name, validate = entry
            try:
                env: Any = validate(payload)
            except ValidationError:
                env = None
            if env is not None and env.type == type_name:
                return Record(seq, env.id, type_name, name, env.time, env.data, "ok")
    return _generic(payload, seq)


def _generic(payload: bytes, seq: int) -> Record:
    try:
        d = decode(payload)
    except PoisonEvent as exc:
        event_id, type_name = _salvage(payload)
        return Record(seq, event_id, type_name, split_type(type_name)[0], None, None, "poison", str(exc))
    env = d.envelope
    assert env is not None
    return Record(seq, env.id, env.type, env.event_name, env.time, d.event, d.status, d.reason)


def _salvage(payload: bytes) -> tuple[str, str]:
    """Id and type of an unreadable event, where they can be read at all (for the skipped table)."""
    import json

    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return "", ""
    if not isinstance(raw, dict):
        return "", ""
    return str(raw.get("id") or ""), str(raw.get("type") or "")
