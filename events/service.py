"""Running a service: one durable pull consumer, ordered handling, derived ids, retries, dead letters.

A service is an object with a `name`, the subject filters it consumes, and an async `handle`
that takes one stored event and returns the events to publish in reaction. The runner:
- fetches in batches and handles messages one at a time, in stream order;
- publishes the reactions with ids derived from (cause id, service name, key), so a redelivered
  cause republishes the same ids and JetStream drops the copies, then acks the cause;
- on a handler error, naks with back-off; on the last allowed delivery, parks the message on the
  dead-letter stream with the error and terminates it: the consumer goes on;
- skips (acks) unknown event types with a warning, holds newer versions (nak with a long delay),
  parks poison payloads (and messages it cannot read at all) at once;
- never lets one message stop the consumer: whatever else fails while settling a message (an
  ack, a park while the bus is away) is logged and the message comes back after `ack_wait`.
  Dead letters are written by `events.deadletters.park`, the one place every consumer uses;
- recreates its pull subscription after a reconnect (nats-py loses them on a server restart).

Concurrency (opt-in): a service whose handler can be slow (a launch takes minutes) sets
`concurrency = N` and defines `ordering_key(stored) -> str`. The runner then handles up to N
messages at once; messages with the same key still run one after another in stream order
(the provisioner keys by cluster, so a DownRequested waits for that cluster's launch), and each
message is acked only after its own reactions are published. Messages waiting their turn are
kept alive with in_progress() from the moment they are fetched. A service may also set
`ack_wait` (seconds) to shorten how long a dead process's messages stay invisible.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, Sequence

import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api

from . import deadletters, naming
from .bus import Bus, Stored, stored_from_msg
from .envelope import Event

log = logging.getLogger("skypurza.service")

MAX_DELIVER = 5
BACKOFF_S = [0.5, 1.0, 2.0, 4.0, 8.0]
NEWER_VERSION_DELAY_S = 60.0
MAX_ERRORS = 100


@dataclass(frozen=True)
class Emit:
    """An event to publish in reaction to the one being handled.

    `key` tells apart several events of one kind for one cause (derived ids must differ).
    `expected_last_seq`: publish only if the aggregate's last sequence is still this one.
    """

    event: Event
    key: str = ""
    expected_last_seq: int | None = None


class Service(Protocol):
    name: str

    def subjects(self, stage: str) -> list[str]: ...

    async def start(self, bus: Bus) -> None: ...

    async def handle(self, stored: Stored) -> Sequence[Event | Emit]: ...


@dataclass
class RunnerStats:
    handled: int = 0
    skipped: int = 0
    failed: int = 0
    parked: int = 0
    published: int = 0
    last_seq: int = 0
    errors: list[str] = field(default_factory=list)  # the latest MAX_ERRORS, oldest first

    def note_error(self, text: str) -> None:
        self.errors.append(text)
        if len(self.errors) > MAX_ERRORS:  # a long-running consumer must not grow without bound
            del self.errors[:-MAX_ERRORS]


class ServiceRunner:
    def __init__(self, bus: Bus, service: Service, *, batch: int = 100, consumer_name: str | None = None,
                 max_deliver: int = MAX_DELIVER, backoff: list[float] | None = None,
                 deliver_new_only: bool = False, ack_wait: float = 30.0):
        self.bus = bus
        self.service = service
        self.batch = batch
        self.durable = consumer_name or naming.consumer(bus.stage, service.name)
        self.max_deliver = max_deliver
        self.backoff = backoff or BACKOFF_S[: max_deliver]
        self.deliver_new_only = deliver_new_only
        self.ack_wait = float(getattr(service, "ack_wait", None) or ack_wait)
        self.concurrency = max(1, int(getattr(service, "concurrency", 1) or 1))
        # Concurrent mode: at most this many fetched and unacked messages in this process.
        self.max_in_flight = self.concurrency * 4
        self._in_flight: set[asyncio.Task] = set()
        self._tails: dict[str, asyncio.Task] = {}
        self._slots = asyncio.Semaphore(self.concurrency)
        self.stats = RunnerStats()
        self._sub: Any = None
        self._stop = asyncio.Event()
        self._resubscribe = False
        bus.on_reconnect(self._mark_resubscribe)

    async def _mark_resubscribe(self) -> None:
        self._resubscribe = True

    async def _subscribe(self) -> None:
        subjects = self.service.subjects(self.bus.stage)
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
        if len(subjects) == 1:
            first = subjects[0]
        else:
            cfg.filter_subjects = subjects
            first = subjects[0]
        self._sub = await self.bus.js.pull_subscribe(first, durable=self.durable, stream=self.bus.events_stream,
                                                     config=cfg)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        await self.service.start(self.bus)
        await self._subscribe()
        try:
            await self._loop()
        finally:
            # Unfinished handlers are abandoned unacked: their messages come back to whoever
            # consumes next (handlers are idempotent).
            for task in list(self._in_flight):
                task.cancel()
            if self._in_flight:
                await asyncio.gather(*self._in_flight, return_exceptions=True)

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
                msgs = await self._sub.fetch(batch=batch, timeout=1.0)
            except (NatsTimeout, asyncio.TimeoutError):  # nats-py also raises a bare one
                continue
            except (nats.errors.ConnectionClosedError, nats.errors.Error, Exception) as exc:
                if self.bus.nc.is_closed:
                    return
                log.warning("%s: fetch failed (%r); resubscribing", self.service.name, exc)
                await asyncio.sleep(0.5)
                await self._safe_resubscribe()
                continue
            try:
                await self.process(msgs)
            except asyncio.CancelledError:
                raise
            except Exception:  # unacked messages come back after ack_wait; the consumer goes on
                log.exception("%s: processing a batch failed", self.service.name)

    async def _safe_resubscribe(self) -> None:
        try:
            await self._subscribe()
        except Exception as exc:
            log.debug("%s: resubscribe failed: %s", self.service.name, exc)

    async def process(self, msgs: list[Any]) -> None:
        if getattr(self.service, "pipelined", False):
            await self._process_pipelined(msgs)
            return
        if self.concurrency > 1:
            for msg in msgs:
                self._dispatch(msg)
            return
        for msg in msgs:
            await self._process_one(msg)

    def _dispatch(self, msg: Any) -> None:
        """Concurrent mode: start handling `msg` after the previous message with its key."""
        stored = read_stored(msg)
        key = ""
        if stored.status == "ok":
            try:
                key = str(self.service.ordering_key(stored))  # type: ignore[attr-defined]
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
            log.exception("%s: could not settle a message (left for redelivery)", self.service.name)

    async def _process_one_unguarded(self, msg: Any, stored: Stored | None = None) -> None:
        stored = stored or read_stored(msg)
        self.stats.last_seq = max(self.stats.last_seq, stored.seq)
        if stored.status == "unknown":
            log.warning("%s: skipping %s at seq %d", self.service.name, stored.reason, stored.seq)
            self.stats.skipped += 1
            await msg.ack()
            return
        if stored.status == "newer":
            log.warning("%s: holding %s (upgrade this service)", self.service.name, stored.reason)
            await msg.nak(delay=NEWER_VERSION_DELAY_S)
            return
        if stored.status == "poison":
            await self.park(msg, stored, stored.reason)
            return
        keepalive = asyncio.create_task(self._keep_alive(msg))
        try:
            out = await self.service.handle(stored)
            await self.emit(stored, out)
        except Exception as exc:
            self.stats.failed += 1
            self.stats.note_error(f"seq {stored.seq}: {type(exc).__name__}: {exc}")
            delivered = msg.metadata.num_delivered
            if delivered >= self.max_deliver:
                await self.park(msg, stored, exc)
            else:
                log.warning("%s: handler failed on seq %d (delivery %d): %s", self.service.name,
                            stored.seq, delivered, exc)
                await msg.nak(delay=self.backoff[min(delivered - 1, len(self.backoff) - 1)])
            return
        finally:
            keepalive.cancel()
        await msg.ack()
        self.stats.handled += 1

    async def _keep_alive(self, msg: Any) -> None:
        while True:
            await asyncio.sleep(self.ack_wait / 3)
            try:
                await msg.in_progress()
            except Exception:
                return

    async def _process_pipelined(self, msgs: list[Any]) -> None:
        """Pipelined mode (a service with `pipelined = True`, whose handlers are fast and read only
        their inputs): handle a batch in order, publish every reaction without waiting for each
        ack, then wait for the acks and ack the causes. A cause is acked only once all its
        reactions are stored, so a crash in between only means a redelivery (same derived ids)."""
        pending: list[tuple[Any, Stored, list[tuple[Any, Any]]]] = []
        for msg in msgs:
            stored = read_stored(msg)
            if stored.status != "ok":
                await self._process_one(msg, stored)
                continue
            self.stats.last_seq = max(self.stats.last_seq, stored.seq)
            futures: list[tuple[Any, Any]] = []
            try:
                out = await self.service.handle(stored)
                for item in out:
                    emit = item if isinstance(item, Emit) else Emit(item)
                    env = self.bus.envelope(emit.event, cause=stored.envelope, handler=self.service.name,
                                            key=emit.key or emit.event.EVENT_NAME)
                    if emit.expected_last_seq is not None:
                        await self.bus.publish(env, expected_last_seq=emit.expected_last_seq)
                        continue
                    fut = await self.bus.js.publish_async(self.bus.subject_of(env), env.to_json(),
                                                          headers={"Nats-Msg-Id": env.id})
                    futures.append((env, fut))
            except Exception as exc:
                await self._handler_failed(msg, stored, exc)
                continue
            pending.append((msg, stored, futures))
        for msg, stored, futures in pending:
            try:
                for env, fut in futures:
                    try:
                        await fut
                    except Exception:
                        await self.bus.publish(env)  # same id: de-duplicated if it was stored
                    self.stats.published += 1
            except Exception as exc:
                await self._handler_failed(msg, stored, exc)
                continue
            try:
                await msg.ack()
            except Exception as exc:  # redelivered later: its reactions are de-duplicated
                log.warning("%s: ack of seq %d failed: %s", self.service.name, stored.seq, exc)
                continue
            self.stats.handled += 1

    async def _handler_failed(self, msg: Any, stored: Stored, exc: Exception) -> None:
        try:
            await self._handler_failed_unguarded(msg, stored, exc)
        except Exception as inner:  # parking or nak'ing failed (the bus is away): it comes back
            log.warning("%s: could not park or nak seq %d: %s", self.service.name, stored.seq, inner)

    async def _handler_failed_unguarded(self, msg: Any, stored: Stored, exc: Exception) -> None:
        self.stats.failed += 1
        self.stats.note_error(f"seq {stored.seq}: {type(exc).__name__}: {exc}")
        delivered = msg.metadata.num_delivered
        if delivered >= self.max_deliver:
            await self.park(msg, stored, exc)
        else:
            log.warning("%s: handler failed on seq %d (delivery %d): %s", self.service.name, stored.seq,
                        delivered, exc)
            await msg.nak(delay=self.backoff[min(delivered - 1, len(self.backoff) - 1)])

    async def emit(self, cause: Stored, out: Sequence[Event | Emit]) -> None:
        assert cause.envelope is not None
        for item in out:
            emit = item if isinstance(item, Emit) else Emit(item)
            env = self.bus.envelope(emit.event, cause=cause.envelope, handler=self.service.name,
                                    key=emit.key or emit.event.EVENT_NAME)
            await self.bus.publish(env, expected_last_seq=emit.expected_last_seq)
            self.stats.published += 1

    async def park(self, msg: Any, stored: Stored, error: BaseException | str) -> None:
        """Dead letter: the original bytes plus why, on the DLQ stream; then terminate it."""
        self.stats.parked += 1
        await deadletters.park(self.bus, self.service.name, seq=stored.seq, subject=stored.subject,
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


async def run_services(bus: Bus, services: list[Service], stop: asyncio.Event | None = None) -> None:
    """Run several services in one process until `stop` is set (or forever)."""
    runners = [ServiceRunner(bus, s) for s in services]
    tasks = [asyncio.create_task(r.run(), name=f"svc-{r.service.name}") for r in runners]
    try:
        if stop is None:
            await asyncio.gather(*tasks)
        else:
            await stop.wait()
    finally:
        for r in runners:
            r.stop()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def json_dumps(obj: Any) -> str:
    return json.dumps(obj, default=str, sort_keys=True)


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0
