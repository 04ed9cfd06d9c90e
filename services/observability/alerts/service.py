"""The alerts service: folds the live log and the dead-letter stream into the rules' state
(rules.py), judges it every `eval_s`, and turns what begins and ends into events, which it
delivers to the configured webhooks (delivery.py).

- AlertRaised when a key starts firing, AlertResolved when it stops. Ids are derived from the
  key and its occurrence, so two instances (or a restart) store each once; the alerts already on
  the log are read back before the first judgement, so a restart raises nothing twice.
- Delivery outcomes are events (AlertDelivered, one per message and webhook: delivered, or given
  up after the bounded retries), not only log lines: the log then says which messages a
  restarted service still owes, so a restart neither loses a message nor sends one twice. Each
  attempt's failure is a log line only (a flapping receiver must not fill the event log).
- Several instances (high availability, or two started at once) post each message once: before
  a post an instance claims it on the log (AlertDeliveryClaimed, claims.py); the first claim
  stored posts, the others wait and take the message over only if that claim lapses undelivered
  (a stopping instance gives up its claims at once: the next round of another posts them).
- A receiver failing never stops the service: each webhook has its own worker and bounded queue
  (a slow one holds up no other, a full queue drops the newest with a warning line).
- `spz alerts list` reads the events back (services/observability/alerts/cli.py).

    python -m skypurza.services.observability.alerts.service --nats URL --stage dev
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from skypurza.events import naming
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.alert_events import AlertDelivered, AlertDeliveryClaimed, AlertRaised, AlertResolved
from skypurza.events.bus import CANNOT_CONNECT, Bus, stored_from_msg
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.cluster_events import (
    AutostopSet,
    ClusterProvisioned,
    ClusterStarted,
    ClusterStopped,
    ClusterTerminated,
    OrphanFound,
)
from skypurza.events.dispatch_events import BudgetThresholdCrossed, TaskAdmitted, TaskHeld
from skypurza.events.envelope import derive_id
from skypurza.events.health_events import GpuUnhealthy
from skypurza.events.job_events import JobCancelled, JobFailed, JobQueued, JobStarted, JobSucceeded
from skypurza.events.managed_events import ManagedJobStatusChanged, ManagedJobSubmitted
from skypurza.events.contract import BusAccess
from skypurza.events.service import LoopContract, declared_bus
from skypurza.events.task_events import PlacementFailed, ProvisionFailed

from . import claims, delivery, rules
from .settings import AlertSettings, Webhook

log = logging.getLogger("skypurza.alerts")

QUEUE_PER_WEBHOOK = 1000
RELEASE_TIMEOUT_S = 2.0  # each claim given up at a stop: a stop never waits long on a bus that is away
MAX_WAITING = 10_000  # messages another instance's claim holds, looked at again each round

CONTRACT = LoopContract(
    name="alerts",
    reads=(ClusterProvisioned, ClusterStarted, ClusterStopped, ClusterTerminated, AutostopSet, JobQueued, JobStarted,
           JobSucceeded, JobFailed, JobCancelled, ManagedJobSubmitted, ManagedJobStatusChanged, OrphanFound,
           GpuUnhealthy, TaskHeld, TaskAdmitted, PlacementFailed, ProvisionFailed, AlertRaised, AlertResolved,
           AlertDelivered, AlertDeliveryClaimed, BudgetThresholdCrossed),
    emits=(AlertRaised, AlertResolved, AlertDeliveryClaimed, AlertDelivered),
    emit_notes={AlertRaised: "a rule's condition began (judged every eval_s over the folded log)",
                AlertResolved: "that condition no longer holds",
                AlertDeliveryClaimed: "before a post; of several instances, the one whose claim is stored first posts",
                AlertDelivered: "a webhook took the message, or the bounded retries gave up"},
    bus=BusAccess(dead_letters="read"),  # the dead_letters rule follows what services park
)


@dataclass
class Book:
    """The alerts as the log tells them: what fires now, how often each key fired, what was sent
    and who is sending what."""

    firing: dict[str, AlertRaised] = field(default_factory=dict)
    occurrences: dict[str, int] = field(default_factory=dict)
    delivered: set[claims.MessageKey] = field(default_factory=set)
    claims: dict[claims.MessageKey, claims.Claim] = field(default_factory=dict)  # until delivered

    def apply(self, event: object) -> None:
        if isinstance(event, AlertRaised):
            now = self.firing.get(event.key)
            if now is None or now.occurrence <= event.occurrence:  # a lagging read never brings back an old one
                self.firing[event.key] = event
            self.occurrences[event.key] = max(self.occurrences.get(event.key, 0), event.occurrence)
        elif isinstance(event, AlertResolved):
            raised = self.firing.get(event.key)
            if raised is not None and raised.occurrence <= event.occurrence:
                del self.firing[event.key]
        elif isinstance(event, AlertDelivered):
            k = (event.key, event.occurrence, event.what, event.webhook_id)
            self.claims.pop(k, None)
            if len(self.delivered) < 1_000_000:
                self.delivered.add(k)
        elif isinstance(event, AlertDeliveryClaimed):
            k = (event.key, event.occurrence, event.what, event.webhook_id)
            if k not in self.delivered and len(self.claims) < 1_000_000:
                claims.fold(self.claims, k, claims.claim_of(event.claimant, event.round, event.at, event.until))


def message_of(stage: str, ev: AlertRaised | AlertResolved, raised: AlertRaised | None = None) -> delivery.Message:
    if isinstance(ev, AlertRaised):
        return delivery.Message(stage, "raised", ev.key, ev.kind, ev.subject, ev.severity, ev.summary, ev.occurrence,
                                ev.raised_at.isoformat(), dict(ev.evidence))
    return delivery.Message(stage, "resolved", ev.key, ev.kind, ev.subject, raised.severity if raised else "info",
                            raised.summary if raised else "", ev.occurrence, ev.resolved_at.isoformat(), {},
                            reason=ev.reason)


class AlertsService:
    contract = CONTRACT
    name = CONTRACT.name

    def __init__(self, settings: AlertSettings | None = None, *, clock: Clock = SYSTEM_CLOCK,
                 send: Callable[[str, bytes, float], None] = delivery.post,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep):
        self.settings = settings or AlertSettings.load()
        self.clock = clock
        self.state = rules.AlertState()
        self.book = Book()
        self.bus: Bus | None = None
        self._send, self._sleep = send, sleep
        self._queues: dict[str, asyncio.Queue[delivery.Message]] = {}
        self.me = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"  # this process, as its claims name it
        self._waiting: dict[claims.MessageKey, tuple[Webhook, delivery.Message]] = {}
        self._tasks: list[asyncio.Task] = []
        self._caught_up = asyncio.Event()
        self._ready = asyncio.Event()

    async def serving(self) -> None:
        await self._ready.wait()

    async def run(self, bus: Bus, stop: asyncio.Event) -> None:
        self.bus = declared_bus(bus, CONTRACT)
        events_end = await bus.last_seq()
        dlq_end = (await bus.js.stream_info(bus.dlq_stream)).state.last_seq
        events_seen, dlq_seen = asyncio.Event(), asyncio.Event()
        if events_end == 0:
            events_seen.set()
        if dlq_end == 0:
            dlq_seen.set()
        self._tasks = [asyncio.create_task(self._follow_events(bus, events_end, events_seen)),
                       asyncio.create_task(self._follow_dead_letters(bus, dlq_end, dlq_seen))]
        for hook in self.settings.webhooks:
            q: asyncio.Queue[delivery.Message] = asyncio.Queue(maxsize=QUEUE_PER_WEBHOOK)
            self._queues[hook.id] = q
            self._tasks.append(asyncio.create_task(self._deliver_loop(hook, q)))
        try:
            await events_seen.wait()
            await dlq_seen.wait()
            self._owed()
            self._ready.set()
            log.info("alerts: %d firing, %d webhook(s)", len(self.book.firing), len(self.settings.webhooks))
            while not stop.is_set():
                try:
                    await self.judge()
                    self._look_again()
                except asyncio.CancelledError:
                    raise
                except Exception:  # a publish failed (the bus is away): the next round tries again
                    log.exception("alerts: a round of the rules failed")
                try:
                    await asyncio.wait_for(stop.wait(), self.settings.eval_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self.close()

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        if tasks:
            await stop_tasks(*tasks)
            await self._release()

    async def _release(self) -> None:
        """On a stop: the claims this instance holds on undelivered messages, given up on the
        log (the next round's claim, lapsed as it is made), so another instance, or this one
        restarted, posts them at its next round rather than after the lease. Best effort: with
        the bus away they lapse at their `until` as a crashed instance's do."""
        if self.bus is None:
            return
        now = self.clock.now()
        for k, claim in list(self.book.claims.items()):
            if claim.claimant != self.me:
                continue
            try:
                await self._append_claim(k, claim.round + 1, now, now, retries=1, timeout=RELEASE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - stopping: the claim lapses at its until instead
                log.warning("alerts: could not give up the claim on %s for %s: %r", k[0], k[3], exc)
                return

    async def _append_claim(self, k: claims.MessageKey, round_: int, until: datetime, now: datetime,
                            **publish_kw: Any) -> tuple[AlertDeliveryClaimed, Any]:
        """This instance's claim of round `round_` on message `k`, its id derived from both (so of
        several instances' appends of one round the log keeps the first), and the append's ack."""
        assert self.bus is not None
        key, occurrence, what, hook_id = k
        ev = AlertDeliveryClaimed(key=key, occurrence=occurrence, what=what, webhook_id=hook_id,  # type: ignore[arg-type]
                                  claimant=self.me, round=round_, until=until, at=now)
        ack = await self.bus.publish(self.bus.envelope(
            ev, id=derive_id(key, CONTRACT.name, f"claim:{occurrence}:{what}:{hook_id}:{round_}"), time=now),
            **publish_kw)
        return ev, ack

    # ------------------------------------------------------------ what the log says

    async def _follow_events(self, bus: Bus, end: int, seen: asyncio.Event) -> None:
        async for msg in bus.follow(start_seq=1):
            seq = end
            try:
                st = stored_from_msg(msg)
                seq = st.seq
                rules.apply(self.state, st.timestamp, st.event)
                self.book.apply(st.event)
            except Exception as exc:  # one bad event never stops the alerts
                log.warning("alerts: event skipped: %r", exc)
            if seq >= end:
                seen.set()

    async def _follow_dead_letters(self, bus: Bus, end: int, seen: asyncio.Event) -> None:
        prefix = f"{naming.subject_prefix(bus.stage)}.dlq."
        async for msg in bus.follow(stream=bus.dlq_stream, filter_subject=f"{prefix}>", start_seq=1):
            try:
                service = (msg.subject or "")[len(prefix):] or "?"
                rules.apply_dead_letter(self.state, service, msg.metadata.timestamp,
                                        self.settings.dead_letter_window_s)
            except Exception as exc:
                log.warning("alerts: dead letter skipped: %r", exc)
            if msg.metadata.sequence.stream >= end:
                seen.set()

    # ------------------------------------------------------------ one round

    async def judge(self) -> tuple[list[AlertRaised], list[AlertResolved]]:
        """Judge the rules now: raise what began, resolve what ended (and queue their messages)."""
        assert self.bus is not None
        now = self.clock.now()
        current = rules.firing(self.state, now, self.settings)
        raised, resolved = [], []
        for key, a in current.items():
            if key in self.book.firing:
                continue
            occ = self.book.occurrences.get(key, 0) + 1
            ev = AlertRaised(key=key, kind=a.kind, subject=a.subject, severity=a.severity,  # type: ignore[arg-type]
                             summary=a.summary, evidence=a.evidence, occurrence=occ, raised_at=now)
            await self.bus.publish(self.bus.envelope(ev, id=derive_id(key, CONTRACT.name, f"raised:{occ}"), time=now))
            self.book.apply(ev)
            log.warning("alert raised: %s", a.summary)
            self._queue(message_of(self.bus.stage, ev))
            raised.append(ev)
        for key in [k for k in self.book.firing if k not in current]:
            was = self.book.firing[key]
            ev2 = AlertResolved(key=key, kind=was.kind, subject=was.subject, occurrence=was.occurrence,
                                reason="the condition no longer holds", resolved_at=now)
            await self.bus.publish(self.bus.envelope(ev2, id=derive_id(key, CONTRACT.name,
                                                                       f"resolved:{was.occurrence}"), time=now))
            self.book.apply(ev2)
            log.info("alert resolved: %s", key)
            if self.settings.notify_resolved:
                self._queue(message_of(self.bus.stage, ev2, was))
            resolved.append(ev2)
        return raised, resolved

    # ------------------------------------------------------------ delivery

    def _owed(self) -> None:
        """At start: the messages of alerts firing now that a webhook has not taken yet."""
        assert self.bus is not None
        for ev in self.book.firing.values():
            self._queue(message_of(self.bus.stage, ev))

    def _queue(self, m: delivery.Message) -> None:
        for hook in self.settings.webhooks:
            if (m.key, m.occurrence, m.what, hook.id) in self.book.delivered:
                continue
            try:
                self._queues[hook.id].put_nowait(m)
            except (KeyError, asyncio.QueueFull):
                log.warning("alerts: webhook %s is behind; message for %s dropped", hook.id, m.key)

    async def _deliver_loop(self, hook: Webhook, q: asyncio.Queue[delivery.Message]) -> None:
        while True:
            m = await q.get()
            if (m.key, m.occurrence, m.what, hook.id) in self.book.delivered:
                continue
            try:
                mine = await self._claim(hook, m)
            except asyncio.CancelledError:
                raise
            except Exception:  # the claim could not be appended (the bus is away): the next round tries again
                log.exception("alerts: could not claim %s for %s", m.key, hook.id)
                self._wait_for(hook, m)
                continue
            if not mine:
                continue
            try:
                await self._deliver(hook, m)
            except asyncio.CancelledError:
                raise
            except Exception:  # recording the outcome failed (the bus is away): logged, the loop goes on
                log.exception("alerts: delivery of %s to %s could not be recorded", m.key, hook.id)

    async def _claim(self, hook: Webhook, m: delivery.Message) -> bool:
        """Whether this instance posts `m` to `hook` (claims.py); if another's claim holds it, the
        message waits for the next rounds to look again."""
        assert self.bus is not None
        k = (m.key, m.occurrence, m.what, hook.id)
        now = self.clock.now()
        step, round_ = claims.next_step(self.book.claims.get(k), k in self.book.delivered, self.me, now)
        if step in ("done", "deliver"):
            return step == "deliver"
        if step == "wait":
            self._wait_for(hook, m)
            return False
        ev, ack = await self._append_claim(k, round_, claims.lease(self.settings, now), now)
        if ack.duplicate:  # stored before: another instance's claim (or ours, whose first ack was lost)
            self._wait_for(hook, m)
            return False
        self.book.apply(ev)
        return True

    def _wait_for(self, hook: Webhook, m: delivery.Message) -> None:
        if len(self._waiting) >= MAX_WAITING:
            log.warning("alerts: %d messages wait on other instances' claims; message for %s dropped",
                        len(self._waiting), m.key)
            return
        self._waiting[(m.key, m.occurrence, m.what, hook.id)] = (hook, m)

    def _look_again(self) -> None:
        """Each round: the messages other instances' claims held, queued again once they are this
        instance's to post (the claim lapsed, or it was ours) and dropped once delivered."""
        now = self.clock.now()
        for k, (hook, m) in list(self._waiting.items()):
            step, _ = claims.next_step(self.book.claims.get(k), k in self.book.delivered, self.me, now)
            if step == "wait":
                continue
            if step != "done":
                try:
                    self._queues[hook.id].put_nowait(m)
                except asyncio.QueueFull:  # the webhook is behind: it stays here for a later round
                    continue
                except KeyError:  # not a webhook of this instance's settings
                    pass
            del self._waiting[k]

    async def _deliver(self, hook: Webhook, m: delivery.Message) -> None:
        assert self.bus is not None

        def failed(attempt: int, error: str) -> None:
            log.warning("alerts: %s to webhook %s: attempt %d failed: %s", m.key, hook.id, attempt, error)

        out = await delivery.deliver(hook, m, attempts=self.settings.attempts, backoff_s=self.settings.backoff_s,
                                     timeout_s=self.settings.timeout_s, sleep=self._sleep, send=self._send,
                                     on_failure=failed)
        now: datetime = self.clock.now()
        ev = AlertDelivered(key=m.key, occurrence=m.occurrence, what=m.what, webhook_id=hook.id,  # type: ignore[arg-type]
                            outcome=out.outcome, attempts=out.attempts, error=out.error, at=now)  # type: ignore[arg-type]
        self.book.apply(ev)
        await self.bus.publish(self.bus.envelope(ev, id=derive_id(m.key, CONTRACT.name,
                                                                  f"delivered:{m.occurrence}:{m.what}:{hook.id}"),
                                                 time=now))
        (log.info if out.outcome == "delivered" else log.error)(
            "alerts: %s %s to webhook %s after %d attempt(s)%s", m.key, out.outcome, hook.id, out.attempts,
            f": {out.error}" if out.error else "")


# ---------------------------------------------------------------- process entry point


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skypurza.services.observability.alerts.service", description=__doc__)
    p.add_argument("--nats", required=True)
    p.add_argument("--stage", default=naming.DEFAULT_STAGE)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from skypurza.events.settings import SettingsError

    try:
        settings = AlertSettings.load()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    async def go() -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        bus = await Bus.connect(args.nats, args.stage, source=f"/skypurza/{args.stage}/alerts")
        try:
            await AlertsService(settings).run(bus, stop)
        finally:
            await bus.close()

    try:
        asyncio.run(go())
    except CANNOT_CONNECT as exc:  # which credentials file, what is wrong: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
