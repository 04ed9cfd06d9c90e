"""The event base class and the type registry: which event names exist, at which version, and
the upcasters from their older versions.

This is the floor under the event models: every `*_events.py` module defines its models on
`Event` and registers them here, and `envelope.py` (which decodes) imports them all and then
reads the registry. Keeping the base apart from decoding is what lets the decoder import the
models at the top instead of late, inside a function (the cycle envelope <-> models that was).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict

TYPE_PREFIX = "io.skypurza."


class Event(BaseModel):
    """Base of every event payload: frozen, tolerant of fields added by newer writers."""

    # defer_build: a model's validator is built the first time it is used, not at import: a
    # command that reads a few event types does not pay for the hundred others (issue 21).
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    EVENT_NAME: ClassVar[str]
    VERSION: ClassVar[int] = 1
    AGGREGATE: ClassVar[str]
    # Field of the payload that identifies the aggregate instance (task id, cluster name ...).
    AGGREGATE_KEY: ClassVar[str]

    def aggregate_id(self) -> str:
        return str(getattr(self, self.AGGREGATE_KEY))

    @classmethod
    def type_name(cls) -> str:
        return f"{TYPE_PREFIX}{cls.EVENT_NAME}.v{cls.VERSION}"


@functools.lru_cache(maxsize=1024)
def split_type(type_name: str) -> tuple[str, int]:
    """`io.skypurza.placement_chosen.v2` -> ("placement_chosen", 2); foreign types -> (type, 0)."""
    if not type_name.startswith(TYPE_PREFIX):
        return type_name, 0
    rest = type_name[len(TYPE_PREFIX):]
    base, _, ver = rest.rpartition(".v")
    if not base or not ver.isdigit():
        return rest, 0
    return base, int(ver)


REGISTRY: dict[str, type[Event]] = {}
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def register(cls: type[Event]) -> type[Event]:
    """Class decorator: make an event type known to decoders."""
    if cls.EVENT_NAME in REGISTRY and REGISTRY[cls.EVENT_NAME] is not cls:
        raise RuntimeError(f"event name {cls.EVENT_NAME!r} registered twice")
    REGISTRY[cls.EVENT_NAME] = cls
    return cls


def upcaster(event_name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register a pure dict -> dict step from `from_version` to `from_version + 1`.

    Upcasters use only the payload and constants (no clock, no I/O), so replay stays deterministic.
    """

    def deco(fn: Upcaster) -> Upcaster:
        UPCASTERS[(event_name, from_version)] = fn
        return fn

    return deco
