"""What a service eats and what it may emit, declared: one typed object the runner, `spz api serve`
and `docs/events.md` all read.

A `ServiceContract` is a service handled by `ServiceRunner` (events/service.py): its durable
consumer's subjects are derived from `consumes`, its handlers are registered per event type with
`@handles(...)`, and `delivery` says how messages are handed to them (`InOrder`, `Pipelined`,
`Keyed`). A `LoopContract` is the second shape: a service that reads the log with its own loop,
`run(bus, stop)` (the ledger keeps its position in DuckDB). A plain `Contract` declares an actor
that is not run by `spz api serve` (the CLI, the node agent) so the docs can name who emits what.

Every publish a declared service makes is checked against `emits` (`Contract.check`): an
undeclared type raises `UndeclaredEmit` (always: it is a bug, never a condition to handle) and is
remembered in this process (`undeclared_emits`), so a test fails on it even where the raise was
caught by a loop that logs and goes on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from . import naming
from .models import Event, all_event_types

if TYPE_CHECKING:
    from .bus import Stored


# ---------------------------------------------------------------- delivery options


@dataclass(frozen=True)
class InOrder:
    """One message at a time: its reactions published and acked before the next (the default)."""


@dataclass(frozen=True)
class Pipelined:
    """A fetched batch handled in order, every reaction published without waiting for its ack, then
    the acks awaited and the causes acked, while the next batch is handled (a bounded number of
    causes unsettled at once; a cause is acked only after its reactions are stored). For fast
    handlers that read only their inputs, not their own reactions."""


@dataclass(frozen=True)
class Keyed:
    """Up to `concurrency` messages at once; messages with the same `key(stored)` one after another
    in stream order (a message whose key cannot be read is ordered with the other keyless ones)."""

    concurrency: int
    key: Callable[[Stored], str]


Delivery = InOrder | Pipelined | Keyed


# ---------------------------------------------------------------- contracts


class UndeclaredEmit(Exception):
    """A service published an event type its contract does not declare."""


class Unretryable(Exception):
    """A handler's failure no redelivery can fix (it names something this server lacks, such as a
    team's AWS profile gone from its credentials file): the cause is parked at once with this
    message, so whoever waits on the request (`spz down`) reads why now, not after its timeout."""


_UNDECLARED: list[str] = []  # every UndeclaredEmit raised in this process (read by the tests)


def undeclared_emits() -> list[str]:
    return list(_UNDECLARED)


def forget_undeclared_emits() -> None:
    _UNDECLARED.clear()


Access = str  # "" (none), "read", or "write" (which includes reading)


@dataclass(frozen=True)
class BusAccess:
    """What an actor does on the bus besides consuming and emitting events: the secured bus of a
    deployment grants each user exactly this (events/natsauth.py). `answers`: the query service
    it serves (`naming.query_subject(stage, answers, *)`); `asks`: those it queries; `logs`: the
    job output stream; `secrets`: the secrets KV; `objects`: the uploads object store; `beats`,
    `samples`: core NATS heartbeats and node samples; `public`: the CloudEvents mirror;
    `dead_letters`: reading the dead-letter stream (what services parked); `consumers`: listing
    the event log's consumers (every service's lag: read only, no consumer's messages)."""

    answers: str = ""
    asks: tuple[str, ...] = ()
    logs: Access = ""
    secrets: Access = ""
    objects: Access = ""
    beats: Access = ""
    samples: Access = ""
    public: Access = ""
    dead_letters: Access = ""
    consumers: Access = ""

    def __post_init__(self) -> None:
        for what in ("logs", "secrets", "objects", "beats", "samples", "public", "dead_letters", "consumers"):
            if getattr(self, what) not in ("", "read", "write"):
                raise ValueError(f"BusAccess.{what} is '', 'read' or 'write', not {getattr(self, what)!r}")


@dataclass(frozen=True, kw_only=True)
class Contract:
    """Who consumes what and may emit what. `reads`: events it looks up in the log when it needs
    them, without consuming them (for the docs; no subscription). `consume_notes` / `emit_notes`
    say, for the docs, what it does with an event or when it emits one (keyed by event class).
    `bus`: what else it does on the bus (queries, logs, secrets ...): its permissions derive from it."""

    name: str
    consumes: tuple[type[Event], ...] = ()
    emits: tuple[type[Event], ...] = ()
    reads: tuple[type[Event], ...] = ()
    consume_notes: Mapping[type[Event], str] = field(default_factory=dict)
    emit_notes: Mapping[type[Event], str] = field(default_factory=dict)
    bus: BusAccess = field(default_factory=BusAccess)

    def __post_init__(self) -> None:
        for notes, declared, what in ((self.consume_notes, self.consumes + self.reads, "consumes or reads"),
                                      (self.emit_notes, self.emits, "emits")):
            stray = [c.__name__ for c in notes if c not in declared]
            if stray:
                raise ValueError(f"{self.name}: notes for {', '.join(stray)}, which it does not declare it {what}")
        # Checked on every publish: one set lookup.
        object.__setattr__(self, "_emit_names", frozenset(c.EVENT_NAME for c in self.emits))

    def declares(self, event_name: str) -> bool:
        return event_name in self._emit_names  # type: ignore[attr-defined]

    def check(self, event_name: str) -> None:
        """Raise UndeclaredEmit unless this contract may emit `event_name`."""
        if not self.declares(event_name):
            text = (f"{self.name} emitted {event_name}, which its contract does not declare "
                    f"(emits: {', '.join(c.__name__ for c in self.emits) or 'nothing'})")
            _UNDECLARED.append(text)
            raise UndeclaredEmit(text)

    def subjects(self, stage: str) -> list[str]:
        """The filter subjects of what it consumes: an aggregate's wildcard where every event type
        of that aggregate is consumed, otherwise one filter per type (in the order declared)."""
        known: dict[str, set[str]] = {}
        for cls in all_event_types():
            known.setdefault(cls.AGGREGATE, set()).add(cls.EVENT_NAME)
        out: list[str] = []
        for cls in self.consumes:
            agg = cls.AGGREGATE
            if {c.EVENT_NAME for c in self.consumes if c.AGGREGATE == agg} >= known.get(agg, set()):
                subject = naming.aggregate_events_subject(stage, agg)
            else:
                subject = naming.event_filter(stage, agg, cls.EVENT_NAME)
            if subject not in out:
                out.append(subject)
        return out


@dataclass(frozen=True, kw_only=True)
class ServiceContract(Contract):
    """A service run by `ServiceRunner`: a durable consumer on `subjects(consumes)`, its handlers
    registered per consumed type, each message's reactions published by the runner."""

    delivery: Delivery = InOrder()
    ack_wait_s: float = 30.0  # how long a dead process's messages stay invisible
    max_deliver: int = 5  # deliveries before a failing message is parked


@dataclass(frozen=True, kw_only=True)
class LoopContract(Contract):
    """A service with its own loop, `run(bus, stop)`: it reads the log itself."""


# ---------------------------------------------------------------- handlers


@dataclass(frozen=True)
class Emit:
    """An event to publish in reaction to the one being handled.

    `key` tells apart several events of one kind for one cause (derived ids must differ); `id`
    replaces the derived id (an id derived from an aggregate's state, the same whoever decides).
    `expected_last_seq`: publish only if the last sequence on `occ_subject` (default: the
    event's aggregate) is still this one, else ConcurrencyConflict.
    """

    event: Event
    key: str = ""
    id: str | None = None
    expected_last_seq: int | None = None
    occ_subject: str | None = None


Reactions = Sequence[Event | Emit]
# `async (stored, ctx: events.service.EmitContext) -> Reactions`, bound to its service.
Handler = Callable[..., Awaitable[Reactions]]
F = TypeVar("F", bound=Callable[..., Any])

_HANDLES = "__skypurza_handles__"


def handles(*types: type[Event]) -> Callable[[F], F]:
    """Register a method as the handler of these event types: `async def on_x(self, stored, ctx)`
    returning its reactions."""

    def mark(fn: F) -> F:
        setattr(fn, _HANDLES, tuple(types))
        return fn

    return mark


def handlers_of(service: object, contract: Contract) -> dict[type[Event], Handler]:
    """The service's `@handles` methods by event type, checked against what it consumes: every
    consumed type has exactly one handler and every handler's type is consumed."""
    found: dict[type[Event], Handler] = {}
    for attr in dir(type(service)):
        fn = getattr(type(service), attr, None)
        for cls in getattr(fn, _HANDLES, ()):
            if cls in found:
                raise TypeError(f"{contract.name}: two handlers for {cls.__name__}")
            found[cls] = getattr(service, attr)
    missing = [c.__name__ for c in contract.consumes if c not in found]
    extra = [c.__name__ for c in found if c not in contract.consumes]
    if missing or extra:
        raise TypeError(f"{contract.name}: consumes without a handler: {missing or 'none'}; "
                        f"handlers of types it does not consume: {extra or 'none'}")
    return found
