"""CloudEvents 1.0 envelope, decoding and upcasting, derived ids.

Every event on the log is an `Envelope` whose `data` is one `Event` model. The envelope type is
`io.skypurza.<event_name>.v<version>`; the registry maps `<event_name>` to its model and its
upcasters. Decoding never crashes on what it does not know: unknown types and newer versions
come back as `Decoded` with `event=None` and a reason, so a consumer can skip (and checkpoint) or
hold them; only a payload that claims a known version and does not validate is poison.

The event base class and the registry live one floor down, in `registry.py`, under the models;
this module re-exports the base, so `envelope` stays the one place callers find `Event` and
`register`. It imports no model: decoding a type imports the one module that defines it
(`modeltable.model_for`), so a command builds only the models it meets (issue 21); a caller that
lists every type imports `events.models` (or `modeltable.load_all()`).
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import SchemaSerializer, SchemaValidator

from .modeltable import model_for
from .registry import (  # noqa: F401  (re-exported: the event base, for callers of `envelope`)
    REGISTRY,
    TYPE_PREFIX,
    UPCASTERS,
    Event,
    Upcaster,
    register,
    split_type,
    upcaster,
)

# Namespace for derived ids (uuid5): fixed forever, or replays would derive different ids.
_ID_NAMESPACE = uuid.UUID("5b1f3c52-7a0e-4d7b-9a57-6b1d2f0c9e11")
_ID_NAMESPACE_BYTES = _ID_NAMESPACE.bytes


def new_id() -> str:
    """A random (version 4) UUID in its usual text form: what `str(uuid.uuid4())` gives, built
    without the UUID object (every event published pays for one)."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_ids(count: int) -> list[str]:
    """`count` ids as `new_id` makes them, their random bytes drawn in one call (a pipelined
    publish makes one per event)."""
    raw = os.urandom(16 * count)
    ids = []
    for at in range(0, 16 * count, 16):
        b = bytearray(raw[at:at + 16])
        b[6] = (b[6] & 0x0F) | 0x40
        b[8] = (b[8] & 0x3F) | 0x80
        h = b.hex()
        ids.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return ids


def derive_id(cause_id: str, handler: str, key: str = "") -> str:
    """The id of an event published by `handler` in reaction to `cause_id`.

    A redelivered cause derives the same id, so JetStream's Nats-Msg-Id de-duplication drops
    the second copy. `key` tells apart several events one handler publishes for one cause.
    """
    # `str(uuid.uuid5(_ID_NAMESPACE, name))`, without the UUID object (every reaction pays it).
    b = bytearray(hashlib.sha1(_ID_NAMESPACE_BYTES + f"{cause_id}|{handler}|{key}".encode(),
                               usedforsecurity=False).digest()[:16])
    b[6] = (b[6] & 0x0F) | 0x50  # version 5
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Envelope(BaseModel):
    """CloudEvents 1.0 (structured JSON form) around one event payload."""

    model_config = ConfigDict(frozen=True, extra="allow")

    specversion: Literal["1.0"] = "1.0"
    id: str
    source: str
    type: str
    time: datetime
    subject: str
    datacontenttype: Literal["application/json"] = "application/json"
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def event_name(self) -> str:
        return split_type(self.type)[0]

    @property
    def version(self) -> int:
        return split_type(self.type)[1]

    @property
    def aggregate(self) -> str:
        return self.subject.split("/", 1)[0]

    @property
    def aggregate_id(self) -> str:
        return self.subject.split("/", 1)[1] if "/" in self.subject else ""

    def to_json(self) -> bytes:
        # The serializer itself, as bytes: `model_dump_json` does its per-call work in Python and
        # decodes the bytes to a str we would encode back (every published event pays this).
        serializer = self.__pydantic_serializer__
        if isinstance(serializer, SchemaSerializer):
            return serializer.to_json(self)
        return self.model_dump_json(exclude_none=False).encode()  # a model not built yet

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "Envelope":  # type: ignore[override]
        # A typed envelope (decoded, or built by the bus) given plain `data` becomes a plain one:
        # its `data` field is the event's model and would not serialise a dict.
        if update and "data" in update and not isinstance(update["data"], Event) and type(self) is not Envelope:
            fields = {**self.__dict__, **(self.__pydantic_extra__ or {}), **update}
            return Envelope.model_validate(fields)
        return super().model_copy(update=update, deep=deep)

    def data_dict(self) -> dict[str, Any]:
        """`data` as a plain JSON-able dict (a decoded envelope may carry the typed event)."""
        data: Any = self.data
        return data if isinstance(data, dict) else data.model_dump(mode="json")


def upcast(event_name: str, version: int, data: dict[str, Any]) -> dict[str, Any]:
    cls = model_for(event_name)
    if cls is None:
        raise PoisonEvent(f"unknown event type {event_name!r}")
    while version < cls.VERSION:
        step = UPCASTERS.get((event_name, version))
        if step is None:
            raise PoisonEvent(f"no upcaster for {event_name} v{version} -> v{version + 1}")
        data = step(dict(data))
        version += 1
    return data


class PoisonEvent(Exception):
    """A payload that claims a known type and version but cannot be read: park it, never retry."""


class Decoded(NamedTuple):  # a NamedTuple: built for every consumed event, and cheap to build
    envelope: Envelope | None
    event: Event | None
    # "ok", "unknown" (type not known here), "newer" (known type, newer version than this code)
    status: str
    reason: str = ""


def make_envelope(
    event: Event,
    *,
    source: str,
    id: str | None = None,
    time: datetime | None = None,
) -> Envelope:
    return Envelope(
        id=id or new_id(),
        source=source,
        type=event.type_name(),
        time=time or utcnow(),
        subject=f"{event.AGGREGATE}/{event.aggregate_id()}",
        data=event.model_dump(mode="json"),
    )


# What validation would mark as set on an envelope built from these fields (the two constants
# are defaults): `envelope_of` builds the same instance without validating.
_MADE_FIELDS = frozenset({"id", "source", "type", "time", "subject", "data"})


def envelope_of(
    event: Event,
    *,
    source: str,
    id: str | None = None,
    time: datetime | None = None,
) -> Envelope:
    """The envelope the bus publishes: `data` is the typed event itself, as on a decoded one.

    Same bytes on the wire as `make_envelope` (`to_json` serialises the event once, through the
    typed envelope), without dumping the event to a dict and validating it back: the event was
    validated when it was built, and every other field is ours. Publishing pays this per event
    (issue 21). Anything unexpected (a time that is not a datetime) takes the validating path.
    """
    if not isinstance(event, Event) or not isinstance(source, str) or not (id is None or isinstance(id, str)) \
            or not (time is None or isinstance(time, datetime)):
        return make_envelope(event, source=source, id=id, time=time)
    return _made(_typed_envelope(type(event)), {
        "specversion": "1.0", "id": id or new_id(), "source": source, "type": event.type_name(),
        "time": time or utcnow(), "subject": f"{event.AGGREGATE}/{event.aggregate_id()}",
        "datacontenttype": "application/json", "data": event,
    })


def envelopes_of(events: list[Event], *, source: str) -> list[Envelope]:
    """`envelope_of` for each event, each with a new id and the time it is made: what a pipelined
    publish builds (its ids' random bytes drawn at once; a type's envelope class and name looked
    up once per run of that type, not per event)."""
    if not isinstance(source, str):
        return [make_envelope(e, source=source) for e in events]
    out: list[Envelope] = []
    last: type | None = None
    cls: type[Envelope] = Envelope
    type_name = ""
    for event, id in zip(events, new_ids(len(events))):
        kind = type(event)
        if kind is not last:
            if not isinstance(event, Event):
                out.append(make_envelope(event, source=source, id=id))
                continue
            cls, type_name, last = _typed_envelope(kind), event.type_name(), kind
        out.append(_made(cls, {
            "specversion": "1.0", "id": id, "source": source, "type": type_name,
            "time": utcnow(), "subject": f"{event.AGGREGATE}/{event.aggregate_id()}",
            "datacontenttype": "application/json", "data": event,
        }))
    return out


def _made(cls: type[Envelope], fields: dict[str, Any]) -> Envelope:
    """The typed envelope validation would build from `fields` (checked by the caller)."""
    env = cls.__new__(cls)
    _setattr(env, "__dict__", fields)
    _setattr(env, "__pydantic_fields_set__", set(_MADE_FIELDS))
    _setattr(env, "__pydantic_extra__", {})
    _setattr(env, "__pydantic_private__", None)
    return env


_setattr = object.__setattr__  # a pydantic model's own __setattr__ refuses (frozen) and validates


# Fast path of `decode`: our writers serialise `type` before `data`; for a known type at the
# current version the JSON is parsed straight into an envelope whose `data` is the typed event.
_TYPE_IN_JSON = re.compile(rb'"type":"io\.skypurza\.([a-z0-9_]+)\.v([0-9]+)"')
_TYPED_ENVELOPES: dict[type[Event], type[Envelope]] = {}


def _typed_envelope(cls: type[Event]) -> type[Envelope]:
    model = _TYPED_ENVELOPES.get(cls)
    if model is None:
        model = create_model(f"{cls.__name__}Envelope", __base__=Envelope, data=(cls, ...))  # type: ignore[call-overload]
        _TYPED_ENVELOPES[cls] = model
    return model


# `"type":"io.skypurza.<name>.v<N>"` as matched -> (the type name, the typed envelope's JSON
# validator), for the types known here at their current version: found once per type, not per
# event (the replay of a projection decodes every event of the log; issue 21). Only hits are
# kept, so a type registered later is still found.
_FAST_TYPES: dict[bytes, tuple[str, Callable[[bytes], Any]]] = {}


def _fast_type(m: re.Match[bytes]) -> tuple[str, Callable[[bytes], Any]] | None:
    cls = model_for(m.group(1).decode())
    if cls is None or cls.VERSION != int(m.group(2)):
        return None
    model = _typed_envelope(cls)
    validator = model.__pydantic_validator__
    # The validator itself, without `model_validate_json`'s per-call work in Python; a model not
    # built yet (a mock validator) goes through `model_validate_json`, which builds it.
    validate = validator.validate_json if isinstance(validator, SchemaValidator) else model.model_validate_json
    fast = (cls.type_name(), validate)
    if isinstance(validator, SchemaValidator):
        _FAST_TYPES[m.group(0)] = fast
    return fast


def decode(payload: bytes) -> Decoded:
    """Bytes from the log -> envelope and typed event. Raises PoisonEvent only for bad payloads.

    Every consumed event comes through here, so the common case — one of our own event types at
    its current version — is parsed and validated in one pass into a typed envelope (its `data`
    is then the event model; `Envelope.data_dict()` gives the plain dict either way).
    """
    m = _TYPE_IN_JSON.search(payload, 0, 512)
    if m is not None:
        fast = _FAST_TYPES.get(m.group(0)) or _fast_type(m)
        if fast is not None:
            type_name, validate_json = fast
            try:
                env = validate_json(payload)
            except ValidationError:
                pass  # the general path below says precisely what is wrong
            else:
                if env.type == type_name:
                    return Decoded(env, env.data, "ok")
    try:
        # pydantic-core parses and validates the JSON in one pass (much faster than json.loads).
        env = Envelope.model_validate_json(payload)
    except ValidationError as exc:
        if any(e.get("type") == "json_invalid" for e in exc.errors()):
            raise PoisonEvent(f"not JSON: {_short(exc)}") from exc
        raise PoisonEvent(f"not a CloudEvents envelope: {_short(exc)}") from exc
    return decode_envelope(env)


def decode_envelope(env: Envelope) -> Decoded:
    name, version = split_type(env.type)
    cls = model_for(name)
    if cls is None or version == 0:
        return Decoded(env, None, "unknown", f"unknown event type {env.type!r}")
    if version > cls.VERSION:
        return Decoded(env, None, "newer", f"{env.type} is newer than this code (v{cls.VERSION})")
    raw = env.data_dict()
    data = upcast(name, version, raw) if version < cls.VERSION else raw
    try:
        event = cls.model_validate(data)
    except ValidationError as exc:
        raise PoisonEvent(f"invalid {env.type} payload: {_short(exc)}") from exc
    return Decoded(env, event, "ok")


def _short(exc: ValidationError) -> str:
    errs = exc.errors()
    first = errs[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{loc}: {first.get('msg')}{more}"
