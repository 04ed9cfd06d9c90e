"""Running a service: one durable pull consumer, ordered handling, derived ids, retries, dead letters.

A service declares itself (events/contract.py): a `ServiceContract` (what it consumes, what it
may emit, its delivery options) and one `@handles(...)` method per consumed type, which takes one
stored event and an `EmitContext` and returns the events to publish in reaction. The runner:
- subscribes to the subjects derived from `consumes` and dispatches each event to its handler
  by type (the handlers must cover `consumes` exactly: checked when the runner is built);
- publishes the reactions with ids derived from (cause id, service name, key) — or the `Emit`'s
  own id and optimistic-concurrency subject — so a redelivered cause republishes the same ids
  and JetStream drops the copies, then acks the cause;
- checks every event the service publishes against `emits` — returned reactions, what a handler
  publishes itself through `ctx` (inside an optimistic-concurrency retry loop, or an event that
  must be in the log before the next step reads it), and what its background loops publish
  through the bus it was started with (`Bus.watched`). An undeclared type raises
  `UndeclaredEmit`: nothing of that cause is published, and the cause is parked at once (a bug
  does not go away on redelivery). Counts per event type are in `stats.emitted`;
- on a handler error, naks with back-off; on the last allowed delivery (an `Unretryable`: the first),
  parks the message on the dead-letter stream with the error and terminates it: the consumer goes on;
- skips (acks) unknown event types with a warning, holds newer versions (nak with a long delay),
  parks poison payloads (and messages it cannot read at all) at once;
- never lets one message stop the consumer: whatever else fails while settling a message (an
  ack, a park while the bus is away) is logged and the message comes back after `ack_wait`.
  Dead letters are written by `events.deadletters.park`, the one place every consumer uses;
- recreates its pull subscription after a reconnect (nats-py loses them on a server restart).

Delivery (`contract.delivery`): `InOrder` (default) handles one message at a time. `Pipelined`
handles a fetched batch in order and publishes the reactions without waiting for each ack; the
acks are awaited (and the causes acked) while the next batch is handled, a bounded number of
causes at a time.
`Keyed(concurrency=N, key=...)` handles up to N messages at once; messages with the same key
still run one after another in stream order (the provisioner keys by cluster, so a DownRequested
waits for that cluster's launch), and each message is acked only after its own reactions are
published. Messages waiting their turn are kept alive with in_progress() from the moment they
are fetched. `contract.ack_wait_s` bounds how long a dead process's messages stay invisible.

The second shape, a `LoopService` (`LoopContract`, `run(bus, stop)`), reads the log itself;
`cli/serve.py` runs it as it is, giving it a bus checked against its contract (`declared_bus`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol

import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api

from . import deadletters, naming
from .bus import Bus, Stored, stored_from_msg
from .bus import fetch as bus_fetch
from .clock import SYSTEM_CLOCK, Clock
from .contract import (  # noqa: F401  (the names a service module needs, in one import)
    Contract,
    Emit,
    Handler,
    InOrder,
    Keyed,
    LoopContract,
    Pipelined,
    Reactions,
    ServiceContract,
    UndeclaredEmit,
    Unretryable,
    handlers_of,
    handles,
)
from .envelope import Envelope, Event
from .pubpipe import Window
from .aiotasks import stop_tasks

log = logging.getLogger("skypurza.service")

BACKOFF_S = [0.5, 1.0, 2.0, 4.0, 8.0]
NEWER_VERSION_DELAY_S = 60.0
MAX_ERRORS = 100
# Pipelined mode: causes whose reactions may be sent and not yet acked by the stream (at least;
# four fetched batches), and how long a stopping runner waits for them to settle.
PIPELINE_MIN_UNSETTLED = 400
SETTLE_DRAIN_S = 10.0


class Service(Protocol):
    """A service run by `ServiceRunner`: its contract, `@handles` methods, and its lifecycle
    (`start` is given the bus it publishes on; `close` ends its background loops)."""

    @property
    def contract(self) -> ServiceContract: ...

    async def start(self, bus: Bus) -> None: ...

    async def close(self) -> None: ...


class LoopService(Protocol):
    """A service that reads the log with its own loop until `stop` is set."""

    @property
    def contract(self) -> LoopContract: ...

    async def run(self, bus: Bus, stop: asyncio.Event) -> None: ...

    async def close(self) -> None: ...


@dataclass
class RunnerStats:
    handled: int = 0
    skipped: int = 0
    failed: int = 0
    parked: int = 0
    published: int = 0  # reactions to handled events (returned or published through the context)
    last_seq: int = 0
    emitted: Counter[str] = field(default_factory=Counter)  # every event the service published, by type
    errors: list[str] = field(default_factory=list)  # the latest MAX_ERRORS, oldest first

    def note_error(self, text: str) -> None:
        self.errors.append(text)
        if len(self.errors) > MAX_ERRORS:  # a long-running consumer must not grow without bound
            del self.errors[:-MAX_ERRORS]


class _Declared:
    """Publish hooks of a service's bus: refuse what its contract does not declare, count the rest."""

    def __init__(self, contract: Contract, stats: RunnerStats | None = None):
        self.contract = contract
        self.stats = stats

    def before(self, env: Envelope) -> None:
        self.contract.check(env.event_name)

    def after(self, env: Envelope, ack: api.PubAck) -> None:
        if self.stats is not None:
            self.stats.emitted[env.event_name] += 1


def declared_bus(bus: Bus, contract: Contract, stats: RunnerStats | None = None) -> Bus:
    """`bus`, with every publish checked against `contract` (and counted into `stats`)."""
    return bus.watched(_Declared(contract, stats))


class Published(NamedTuple):
    envelope: Envelope
    ack: api.PubAck


class EmitContext:
    """What a handler publishes itself, while it runs: checked against the contract like its
    returned reactions, with the same derived ids, and recorded (`published`) for the runner.

    `publish(...)` takes an Event or an Emit; `bus` is a bus whose every publish is checked and
    recorded the same way, for code that takes a bus (`jobqueue.queue_job`'s retry loop).
    `clock` is the runner's (events/clock.py): it stamps the envelopes built here."""

    def __init__(self, bus: Bus, contract: Contract, cause: Stored | None = None, stats: RunnerStats | None = None,
                 clock: Clock = SYSTEM_CLOCK):
        self._raw = bus
        self.clock = clock
        self._view: Bus | None = None
        self.contract = contract
        self.cause = cause
        self.stats = stats
        self.published: list[Envelope] = []

    @property
    def bus(self) -> Bus:
        if self._view is None:  # made on first use: most handlers only return their reactions
            self._view = self._raw.watched(self)
        return self._view

    def before(self, env: Envelope) -> None:
        self.contract.check(env.event_name)

    def after(self, env: Envelope, ack: api.PubAck) -> None:
        self.published.append(env)
        if self.stats is not None:
            self.stats.published += 1
            self.stats.emitted[env.event_name] += 1

    def envelope(self, item: Event | Emit) -> Envelope:
        """The envelope of a reaction: the Emit's own id, else one derived from the cause, the
        service and the key (the event's name by default)."""
        emit = item if isinstance(item, Emit) else Emit(item)
        now = self.clock.now()
        if emit.id is not None:
            return self._raw.envelope(emit.event, id=emit.id, time=now)
        cause = self.cause.envelope if self.cause is not None else None
        if cause is None:
            return self._raw.envelope(emit.event, time=now)
        return self._raw.envelope(emit.event, cause=cause, handler=self.contract.name,
                                  key=emit.key or emit.event.EVENT_NAME, time=now)

    async def publish(self, item: Event | Emit) -> Published:
        emit = item if isinstance(item, Emit) else Emit(item)
        env = self.envelope(emit)
        ack = await self.bus.publish(env, expected_last_seq=emit.expected_last_seq, occ_subject=emit.occ_subject)
        return Published(env, ack)


# Pipelined mode: a handled cause, its context, and its reactions sent in windows (not yet acked).
_Sent = tuple[Any, Stored, EmitContext, list[tuple[list[Envelope], Window]]]


def _as_emit(item: Event | Emit) -> Emit:
    return item if isinstance(item, Emit) else Emit(item)


class ServiceRunner:
    def __init__(self, bus: Bus, service: Service, *, batch: int = 100, consumer_name: str | None = None,
                 max_deliver: int | None = None, backoff: list[float] | None = None,
                 deliver_new_only: bool = False, ack_wait: float | None = None, clock: Clock | None = None):
        self.bus = bus
        self.service = service
        # Stamps the envelopes of the reactions; a test passes the ManualClock its service has.
        self.clock = clock or SYSTEM_CLOCK
        self.contract = service.contract
        if not isinstance(self.contract, ServiceContract):
            raise TypeError(f"{self.contract.name}: a ServiceRunner runs a ServiceContract, not "
                            f"{type(self.contract).__name__}")
        self.name = self.contract.name
        self.handlers = handlers_of(service, self.contract)
        self.batch = batch
        self.durable = consumer_name or naming.consumer(bus.stage, self.name)
        self.max_deliver = max_deliver or self.contract.max_deliver
        self.backoff = backoff or BACKOFF_S[: self.max_deliver]
        self.deliver_new_only = deliver_new_only
        self.ack_wait = float(ack_wait or self.contract.ack_wait_s)
        delivery = self.contract.delivery
        self.pipelined = isinstance(delivery, Pipelined)
        self.concurrency = max(1, delivery.concurrency) if isinstance(delivery, Keyed) else 1
        # Concurrent mode: at most this many fetched and unacked messages in this process.
        self.max_in_flight = self.concurrency * 4
        self._in_flight: set[asyncio.Task] = set()
        # Pipelined mode: the batches whose reactions are sent and not yet settled (task, causes).
        self._settling: deque[tuple[asyncio.Task, int]] = deque()
        self.max_unsettled = max(PIPELINE_MIN_UNSETTLED, 4 * batch)
        self._tails: dict[str, asyncio.Task] = {}
        self._slots = asyncio.Semaphore(self.concurrency)
        self.stats = RunnerStats()
        # The bus the service is started with: whatever it publishes (its background loops
        # too) is checked against its contract and counted.
        self.out = declared_bus(bus, self.contract, self.stats)
        self._sub: Any = None
        self._stop = asyncio.Event()
        self._resubscribe = False
        bus.on_reconnect(self._mark_resubscribe)

    async def _mark_resubscribe(self) -> None:
        self._resubscribe = True

    async def _subscribe(self) -> None:
        subjects = self.contract.subjects(self.bus.stage)
        cfg = api.ConsumerConfig(
            durable_name=self.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            max_deliver=self.max_deliver,
            # No server-side BackOff: it would replace AckWait with its first (short) value and
            # redeliver slow handlers (a launch takes minutes). Errors are nak'ed with our back-off;
            # a handler still running is kept alive with in_progress().
            ack_wait=self.ack_wait,
            max_ack_pending=10_000,
            deliver_policy=api.DeliverPolicy.NEW if self.deliver_new_only else api.DeliverPolicy.ALL,
        )
        if len(subjects) > 1:
            cfg.filter_subjects = subjects
        self._sub = await self.bus.js.pull_subscribe(subjects[0], durable=self.durable, stream=self.bus.events_stream,
                                                     config=cfg)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        await self.service.start(self.out)
        await self._subscribe()
        try:
            await self._loop()
        finally:
            # Unfinished handlers are abandoned unacked: their messages come back to whoever
            # consumes next (handlers are idempotent).
            await self._drain_settling()
            await stop_tasks(*self._in_flight)

    async def _loop(self) -> None:
        while not self._stop.is_set():
            if self._resubscribe:
                self._resubscribe = False
                await self._safe_resubscribe()
            batch = self.batch
            if self.concurrency > 1:
                while len(self._in_flight) >= self.max_in_flight and not self._stop.is_set():
                    await asyncio.wait(set(self._in_flight), timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                batch = max(1, min(self.batch, self.max_in_flight - len(self._in_flight)))
            try:
                msgs = await bus_fetch(self._sub, batch=batch, timeout=1.0)
            except (NatsTimeout, asyncio.TimeoutError):  # nats-py also raises a bare one
                continue
            except (nats.errors.ConnectionClosedError, nats.errors.Error, Exception) as exc:
                if self.bus.nc.is_closed:
                    return
                log.warning("%s: fetch failed (%r); resubscribing", self.name, exc)
                await asyncio.sleep(0.5)
                await self._safe_resubscribe()
                continue
            try:
                if self.pipelined:
                    await self._pipeline(msgs)
                else:
                    await self.process(msgs)
            except asyncio.CancelledError:
                raise
            except Exception:  # unacked messages come back after ack_wait; the consumer goes on
                log.exception("%s: processing a batch failed", self.name)

    async def _safe_resubscribe(self) -> None:
        try:
            await self._subscribe()
        except Exception as exc:
            log.debug("%s: resubscribe failed: %s", self.name, exc)

    async def process(self, msgs: list[Any]) -> None:
        if self.pipelined:
            await self._process_pipelined(msgs)
            return
        if self.concurrency > 1:
            for msg in msgs:
                self._dispatch(msg)
            return
        for msg in msgs:
            await self._process_one(msg)

    def _handler(self, event: Event | None) -> Handler | None:
        for cls in type(event).__mro__:
            handler = self.handlers.get(cls)  # type: ignore[call-overload]
            if handler is not None:
                return handler
        return None

    def _dispatch(self, msg: Any) -> None:
        """Keyed mode: start handling `msg` after the previous message with its key."""
        stored = read_stored(msg)
        key = ""
        delivery = self.contract.delivery
        if stored.status == "ok" and isinstance(delivery, Keyed):
            try:
                key = str(delivery.key(stored))
            except Exception:  # no key: order it with the other keyless messages
                key = ""
        previous = self._tails.get(key)
        task = asyncio.create_task(self._after(previous, msg, stored))
        self._tails[key] = task
        self._in_flight.add(task)

        def done(t: asyncio.Task, key: str = key) -> None:
            self._in_flight.discard(t)
            if self._tails.get(key) is t:
                del self._tails[key]

        task.add_done_callback(done)

    async def _after(self, previous: asyncio.Task | None, msg: Any, stored: Stored) -> None:
        keepalive = asyncio.create_task(self._keep_alive(msg))
        try:
            if previous is not None:
                await asyncio.wait([previous])
            async with self._slots:
                await self._process_one(msg, stored)
        finally:
            keepalive.cancel()

    async def _process_one(self, msg: Any, stored: Stored | None = None) -> None:
        """Handle one message; nothing it raises leaves here (one bad message never stops the
        consumer): handler errors are retried and parked, anything else is logged and the
        message left unacked, to come back after `ack_wait`."""
        try:
            await self._process_one_unguarded(msg, stored)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats.note_error(f"{type(exc).__name__}: {exc}")
            log.exception("%s: could not settle a message (left for redelivery)", self.name)

    async def _settle_unhandled(self, msg: Any, stored: Stored) -> Handler | None:
        """The handler of an ok message; otherwise the message is settled here (skipped, held or
        parked) and None is returned."""
        self.stats.last_seq = max(self.stats.last_seq, stored.seq)
        if stored.status == "ok":
            handler = self._handler(stored.event)
            if handler is not None:
                return handler
            log.warning("%s: no handler for %s at seq %d; skipped", self.name, type(stored.event).__name__,
                        stored.seq)
            self.stats.skipped += 1
            await msg.ack()
        elif stored.status == "unknown":
            log.warning("%s: skipping %s at seq %d", self.name, stored.reason, stored.seq)
            self.stats.skipped += 1
            await msg.ack()
        elif stored.status == "newer":
            log.warning("%s: holding %s (upgrade this service)", self.name, stored.reason)
            await msg.nak(delay=NEWER_VERSION_DELAY_S)
        else:
            await self.park(msg, stored, stored.reason)
        return None

    async def _process_one_unguarded(self, msg: Any, stored: Stored | None = None) -> None:
        stored = stored or read_stored(msg)
        handler = await self._settle_unhandled(msg, stored)
        if handler is None:
            return
        keepalive = asyncio.create_task(self._keep_alive(msg))
        try:
            await self.handle(stored, handler)
        except Exception as exc:
            await self._handler_failed(msg, stored, exc)
            return
        finally:
            keepalive.cancel()
        await msg.ack()
        self.stats.handled += 1

    async def handle(self, stored: Stored, handler: Handler | None = None) -> list[Envelope]:
        """Hand one stored event to its handler and publish its reactions, in order; returns
        everything published for it (through the handler's context too). Not acked here."""
        handler = handler or self._handler(stored.event)
        if handler is None:
            return []
        ctx = self._context(stored)
        out = await handler(stored, ctx)
        for emit, env in self._reactions(ctx, out):
            await ctx.bus.publish(env, expected_last_seq=emit.expected_last_seq, occ_subject=emit.occ_subject)
        return ctx.published

    def _context(self, stored: Stored) -> EmitContext:
        return EmitContext(self.bus, self.contract, stored, self.stats, self.clock)

    def _reactions(self, ctx: EmitContext, out: Reactions) -> list[tuple[Emit, Envelope]]:
        """The envelopes of a handler's reactions (the one place they are built), all checked
        against the contract before any is published."""
        pairs = [(emit, ctx.envelope(emit)) for emit in map(_as_emit, out)]
        for _, env in pairs:
            self.contract.check(env.event_name)
        return pairs

    async def _keep_alive(self, msg: Any) -> None:
        while True:
            await asyncio.sleep(self.ack_wait / 3)
            try:
                await msg.in_progress()
            except Exception:
                return

    async def _process_pipelined(self, msgs: list[Any]) -> None:
        """Pipelined mode: handle a batch in order, publish every reaction without waiting for
        each ack, then wait for the acks and ack the causes. A cause is acked only once all its
        reactions are stored, so a crash in between only means a redelivery (same derived ids)."""
        await self._settle_pipelined(await self._send_pipelined(msgs))

    async def _pipeline(self, msgs: list[Any]) -> None:
        """Pipelined mode in the consumer loop: a batch's reactions are sent in order, and their
        acks waited for (then the causes acked) while the next batch is fetched and handled, so
        the consumer does not sit idle through every batch's ack round trip (issue 21). At most
        `max_unsettled` causes wait so; past that the oldest batch's settling is awaited."""
        pending = await self._send_pipelined(msgs)
        if not pending:
            return
        self._settling.append((asyncio.create_task(self._settle_pipelined(pending)), len(pending)))
        while sum(n for _, n in self._settling) > self.max_unsettled:
            task, _ = self._settling.popleft()
            await asyncio.wait([task])  # it settles every message itself: nothing to raise here
        while self._settling and self._settling[0][0].done():
            self._settling.popleft()

    async def _drain_settling(self) -> None:
        """On stop: the batches still settling get their acks (bounded by the ack wait and its
        retries); what is left then is abandoned unacked and comes back to the next consumer."""
        tasks = [t for t, _ in self._settling]
        self._settling.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=SETTLE_DRAIN_S)
            await stop_tasks(*tasks)

    async def _send_pipelined(self, msgs: list[Any]) -> list[_Sent]:
        """Handle a batch in order and send every reaction (not waiting for the acks): the causes
        whose reactions are now to be settled, with their sends. A cause's reactions go on the
        wire as soon as its handler returns, in order (an optimistic-concurrency one, published
        and awaited, after those before it), so the log's order is the handling order."""
        pending: list[_Sent] = []
        for msg in msgs:
            stored = read_stored(msg)
            handler = self._handler(stored.event) if stored.status == "ok" else None
            if handler is None:
                await self._process_one(msg, stored)
                continue
            self.stats.last_seq = max(self.stats.last_seq, stored.seq)
            ctx = self._context(stored)
            windows: list[tuple[list[Envelope], Window]] = []
            try:
                out = await handler(stored, ctx)
                run: list[Envelope] = []
                for emit, env in self._reactions(ctx, out):
                    if emit.expected_last_seq is not None:
                        if run:  # those before it go first
                            windows.append((run, await self.bus.send_many(run)))
                            run = []
                        await ctx.bus.publish(env, expected_last_seq=emit.expected_last_seq,
                                              occ_subject=emit.occ_subject)
                        continue
                    run.append(env)
                if run:
                    windows.append((run, await self.bus.send_many(run)))
            except Exception as exc:
                await self._handler_failed(msg, stored, exc)
                continue
            pending.append((msg, stored, ctx, windows))
        return pending

    async def _settle_pipelined(self, pending: list[_Sent]) -> None:
        """Wait for the acks of the sent reactions, then ack each cause (a cause whose reaction
        could not be stored is nak'ed or parked, as a handler error is)."""
        for msg, stored, ctx, windows in pending:
            try:
                for envs, window in windows:
                    for env, ack in zip(envs, await self.bus.settle_many(envs, window)):
                        ctx.after(env, ack)
            except Exception as exc:
                await self._handler_failed(msg, stored, exc)
                continue
            try:
                await msg.ack()
            except Exception as exc:  # redelivered later: its reactions are de-duplicated
                log.warning("%s: ack of seq %d failed: %s", self.name, stored.seq, exc)
                continue
            self.stats.handled += 1

    async def _handler_failed(self, msg: Any, stored: Stored, exc: Exception) -> None:
        """The one failure path: nak with back-off, or park on the last delivery (at once for an
        UndeclaredEmit: a bug, which a redelivery would only repeat; and for an Unretryable)."""
        try:
            self.stats.failed += 1
            self.stats.note_error(f"seq {stored.seq}: {type(exc).__name__}: {exc}")
            delivered = msg.metadata.num_delivered
            if delivered >= self.max_deliver or isinstance(exc, (UndeclaredEmit, Unretryable)):
                await self.park(msg, stored, exc)
            else:
                log.warning("%s: handler failed on seq %d (delivery %d): %s", self.name, stored.seq,
                            delivered, exc)
                await msg.nak(delay=self.backoff[min(delivered - 1, len(self.backoff) - 1)])
        except Exception as inner:  # parking or nak'ing failed (the bus is away): it comes back
            log.warning("%s: could not park or nak seq %d: %s", self.name, stored.seq, inner)

    async def park(self, msg: Any, stored: Stored, error: BaseException | str) -> None:
        """Dead letter: the original bytes plus why, on the DLQ stream; then terminate it."""
        self.stats.parked += 1
        await deadletters.park(self.bus, self.name, seq=stored.seq, subject=stored.subject,
                               raw=stored.raw, error=error,
                               error_type="PoisonEvent" if stored.status == "poison" else None)
        await msg.term()


def read_stored(msg: Any) -> Stored:
    """`stored_from_msg`, except that a message it cannot read at all (an upcaster that raises,
    a reply subject it cannot parse) is a poison message to park, not an exception."""
    try:
        return stored_from_msg(msg)
    except Exception as exc:
        try:
            seq = int(msg.metadata.sequence.stream)
        except Exception:
            seq = 0
        return Stored(seq, getattr(msg, "subject", "") or "", datetime.now(timezone.utc), None, None, "poison",
                      f"unreadable: {type(exc).__name__}: {exc}", getattr(msg, "data", b"") or b"")


async def dead_letters(bus: Bus, service: str | None = None) -> list[dict[str, Any]]:
    """What has been parked (kept here for callers of the old place; see events.deadletters)."""
    return await deadletters.dead_letters(bus, service)
