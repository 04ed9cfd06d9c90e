"""The bus client: the event log and the logs stream on NATS JetStream.

What it adds to nats-py (see ../shared/reference/jetstream-facts.md for why each exists):
- streams created with the right settings (file storage, no max age, deny delete/purge, a
  de-duplication window) — `ensure_streams`;
- publish with `Nats-Msg-Id` = event id, retried with the SAME id on timeouts and "no responders"
  (nats-py never retries), optional optimistic concurrency on an aggregate's wildcard subject;
- pipelined publish for bulk work;
- ordered replay from a sequence or a time up to the current end (`replay`), and live follow;
- the last event on a subject filter (for optimistic concurrency and id allocation);
- the secrets KV bucket (secrets never enter the immutable log);
- request-reply queries (the ledger answers `spz status` this way);
- job output as numbered chunks with a de-duplication id (`publish_log`, `log_chunk_id`);
- how long the connection has been down (`unreachable_for`), so a CLI command can give up on a
  lost control plane instead of waiting for ever.
Durable consumers with retries and dead letters live in `events.service`.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Awaitable, Callable, NamedTuple, Protocol, Sequence, TypeVar

from . import natslight  # noqa: F401,I001  (first: nats-py without aiohttp, 100+ ms less per command)

import nats
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError, ServiceUnavailableError

from . import naming
from .bussettings import BusSettings, parse_servers
from .envelope import Decoded, Envelope, Event, PoisonEvent, decode, derive_id, envelope_of, envelopes_of
from .natscreds import BusCredentials, CredentialsError, credentials_from_env
from .pubpipe import AckInbox, Window

log = logging.getLogger("skypurza.bus")
T = TypeVar("T")

DUPLICATE_WINDOW_S = 300.0
# The logs stream's de-duplication window: longer than everything one agent process does to get
# one chunk stored (its retries, and nats-py's resend of what it buffered while disconnected),
# see services/agent/agent.py `log_retry_horizon_s`. A copy sent later than that (an agent that
# came back after a long outage) is dropped by the readers (events/logchunks.py `ChunkFilter`).
LOGS_DUPLICATE_WINDOW_S = 300.0
LOGS_MAX_AGE_S = 30 * 24 * 3600.0
LOGS_MAX_BYTES = 2 * 1024**3
SECRETS_TTL_S = 30 * 24 * 3600.0
WRONG_LAST_SEQUENCE = 10071
# "no suitable peers for placement": a cluster just started (its JetStream meta leader not yet
# elected, or fewer nodes up than the stream's replicas) cannot place a replicated stream yet.
NO_SUITABLE_PEERS = 10005
STREAM_EXISTS = 10058
# How long a publish keeps trying while the stream has no leader ("no responders", 503): a
# cluster's stream leader SIGKILLed was replaced in ~5.2 s here (ordinary retries give ~3 s).
ELECTION_WAIT_S = 12.0
# How long a pipelined append waits for its ack before it is retried with the same id: the
# same as one attempt of `publish` (a window of them: how long it waits without any ack).
ACK_WAIT_S = 5.0
# A replay waits for this many empty one-second fetches while the server still reports messages
# pending before it gives up on the rest; a JetStream API call (stream info, consumer create)
# that times out is tried this many times (a server just restarted answers late).
REPLAY_QUIET_FETCHES = 10
API_ATTEMPTS = 5


def log_chunk_id(cluster: str, job_id: int | str, rank: int, stream: str, seq: int | None,
                 offset: int | None, line: str = "") -> str:
    """The Nats-Msg-Id of one chunk of job output. From where the chunk is (job, rank, phase,
    its number and byte offset in the phase's output file), never from when it was sent: an
    agent that sends it again, the same process or a restarted one, derives the same id. Job ids
    are never reused on a cluster name (events/jobqueue.py), so neither are these. Notices
    without an offset (the agent's own lines) are identified by their text."""
    where = f"{cluster}.{job_id}.{rank}.{stream}"
    if offset is None:
        return f"log.{where}.h{hashlib.sha256(line.encode()).hexdigest()[:32]}"
    return f"log.{where}.{seq if seq is not None else '-'}.{offset}"


class ConcurrencyConflict(Exception):
    """Another writer appended to the aggregate first: reload and decide again."""


class BusRefused(RuntimeError):
    """A secured bus refused the connection's user (unknown, or a wrong password): no retry mends
    that, so the first connect says so at once instead of retrying for ever."""


# What a process that connects says in one line and exits on: its credentials file is missing or
# broken (which file, what is wrong), or the server refuses its user.
CANNOT_CONNECT = (CredentialsError, BusRefused)


def _refused_user(exc: BaseException) -> bool:
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower()


class StreamPlacementError(RuntimeError):
    """A replicated stream could not be placed within the placement wait (too few nodes up)."""


class Stored(NamedTuple):
    """An event as read back from the log (a NamedTuple: one is built for every consumed event)."""

    seq: int
    subject: str
    timestamp: datetime
    envelope: Envelope | None
    event: Event | None
    status: str  # "ok", "unknown", "newer", "poison"
    reason: str = ""
    raw: bytes = b""


def _seq_and_time(msg: Any) -> tuple[int, datetime]:
    """Stream sequence and store time from a JetStream reply subject, without building nats-py's
    full metadata objects (a hot path: every consumed event goes through it). Reply forms:
    $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending> and the 12-token form
    with a domain and an account hash after ACK."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9:
        sseq, ns = tokens[5], tokens[7]
    elif len(tokens) >= 11:
        sseq, ns = tokens[7], tokens[9]
    else:
        md = msg.metadata
        return md.sequence.stream, md.timestamp
    n = int(ns)
    return int(sseq), datetime.fromtimestamp(n // 1_000_000_000, timezone.utc).replace(
        microsecond=(n % 1_000_000_000) // 1000)


def stored_from_msg(msg: Any) -> Stored:
    seq, when = _seq_and_time(msg)
    try:
        d: Decoded = decode(msg.data)
        return Stored(seq, msg.subject, when, d.envelope, d.event, d.status, d.reason, msg.data)
    except PoisonEvent as exc:
        return Stored(seq, msg.subject, when, None, None, "poison", str(exc), msg.data)


class PublishHooks(Protocol):
    def before(self, env: Envelope) -> None: ...

    def after(self, env: Envelope, ack: api.PubAck) -> None: ...


@dataclass
class _Link:
    reconnected: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    disconnected_at: float | None = None
    closed_on_purpose: bool = False  # `close()` was called: a closed connection is not a lost one
    acks: AckInbox | None = None  # the pipelined appends' reply inbox (`publish_many`), made on first use



async def _settled(call: Callable[[], Awaitable[T]], attempts: int = API_ATTEMPTS) -> T:
    """A JetStream API call, tried again on a timeout, no answer, or "JetStream not ready" (503:
    a server just restarted is still recovering its streams); bounded: then it raises."""
    delay = 0.2
    for attempt in range(attempts):
        try:
            return await call()
        except (NatsTimeout, NoStreamResponseError, ServiceUnavailableError, NoRespondersError, asyncio.TimeoutError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")

async def fetch(sub: Any, *, batch: int, timeout: float) -> list[Any]:
    """`sub.fetch(...)`, except that a cancellation nats-py swallowed is raised. Python 3.11's
    `asyncio.wait_for` (inside nats-py's fetch) returns the result instead of raising when the
    wait it guards finishes in the same turn as the cancel, so a reader looping on fetch would
    never stop: a follower cancelled at that moment kept a test's teardown waiting for ever."""
    try:
        return await sub.fetch(batch=batch, timeout=timeout)
    finally:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError


def _concurrent(answer: Callable[[Any], Awaitable[None]], bound: int) -> Callable[[Any], Awaitable[None]]:
    """A subscription callback that answers each message in a task of its own, at most `bound` at
    once: the callback waits for a slot, so past the bound messages queue in nats-py as before."""
    slots = asyncio.Semaphore(bound)
    running: set[asyncio.Task[None]] = set()  # held: a task only weakly referenced may be collected

    async def one(msg: Any) -> None:
        try:
            await answer(msg)
        finally:
            slots.release()

    async def cb(msg: Any) -> None:
        await slots.acquire()
        task = asyncio.ensure_future(one(msg))
        running.add(task)
        task.add_done_callback(running.discard)

    return cb


def stream_configs(stage: str, replicas: int) -> list[api.StreamConfig]:
    """Pure: the stage's streams, events, logs and dead letters in that order, as `ensure_streams`
    makes them. One definition: a deployment's node set-up (infra/busconfig.py
    `stream_definitions`, applied as `control` by infra/bus_streams.py) emits these same configs,
    because on a secured bus no service may create what is missing."""
    return [
        api.StreamConfig(
            name=naming.events_stream(stage),
            subjects=[naming.all_events_subject(stage)],
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            max_age=0,  # the log is kept forever: audit and billing replay need every event
            duplicate_window=DUPLICATE_WINDOW_S,
            deny_delete=True,
            deny_purge=True,
            allow_direct=True,
            num_replicas=replicas,
        ),
        api.StreamConfig(
            name=naming.logs_stream(stage),
            subjects=[naming.all_logs_subject(stage)],
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            max_age=LOGS_MAX_AGE_S,
            max_bytes=LOGS_MAX_BYTES,
            duplicate_window=LOGS_DUPLICATE_WINDOW_S,
            allow_direct=True,
            num_replicas=replicas,
        ),
        api.StreamConfig(
            name=naming.dead_letter_stream(stage),
            subjects=[f"{naming.subject_prefix(stage)}.dlq.>"],
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            deny_delete=True,
            num_replicas=replicas,
        ),
    ]


def secrets_kv_config(stage: str, replicas: int) -> api.KeyValueConfig:
    """Pure: the stage's secrets bucket, as `_secrets_kv` makes it (and a deployment's node set-up,
    infra/busconfig.py). Direct gets (`$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>`) name
    the key in the subject, so a cluster's bus user can be granted its own cluster's keys only."""
    return api.KeyValueConfig(bucket=naming.secrets_bucket(stage), history=1, ttl=SECRETS_TTL_S, direct=True,
                              replicas=replicas)


class Bus:
    def __init__(self, nc: Any, stage: str, source: str, *, servers: list[str] | None = None,
                 settings: BusSettings | None = None):
        self.nc = nc
        self.js = nc.jetstream()
        self.stage = naming.check_stage(stage)
        self.source = source
        self.events_stream = naming.events_stream(stage)
        self.logs_stream = naming.logs_stream(stage)
        self.dlq_stream = naming.dead_letter_stream(stage)
        self._link = _Link()  # the connection's state, shared with every view (`watched`)
        self._hooks: PublishHooks | None = None
        self.servers = list(servers or [])  # every URL it was given (a cluster: all its nodes)
        self._settings = settings
        self.user = ""  # the secured bus's user it connected as ("": none, the embedded bus)

    @property
    def settings(self) -> BusSettings:
        """Replicas and the placement wait (read once, when first needed)."""
        if self._settings is None:
            self._settings = BusSettings.load()
        return self._settings

    @property
    def servers_url(self) -> str:
        """Every server, comma-separated: what a process this one starts (a node agent) is given."""
        return ",".join(self.servers)

    @property
    def _reconnected(self) -> list[Callable[[], Awaitable[None]]]:
        return self._link.reconnected

    @property
    def disconnected_at(self) -> float | None:
        """time.monotonic() when the connection was lost (None while connected)."""
        return self._link.disconnected_at

    @disconnected_at.setter
    def disconnected_at(self, value: float | None) -> None:
        self._link.disconnected_at = value

    def watched(self, hooks: PublishHooks) -> "Bus":
        """A view of this bus (same connection, same state) whose every event publish is shown to
        `hooks` first (`before` may refuse it by raising) and after its ack: how a service's
        contract checks and counts everything it publishes, whichever module publishes it."""
        view = copy.copy(self)
        view._hooks = hooks
        return view

    # ------------------------------------------------------------ connection

    @classmethod
    async def connect(cls, url: str, stage: str, *, source: str, ensure: bool = True,
                      connect_timeout: float = 5.0, max_reconnect_attempts: int = -1,
                      ping_interval: float = 120.0, settings: BusSettings | None = None,
                      credentials: BusCredentials | None = None) -> "Bus":
        """`url`: one server, or every node of a cluster comma-separated (events/bussettings.py).
        `credentials`: a secured bus's user (events/natscreds.py); by default the file named by
        SKYPURZA_NATS_CREDS, if any (the embedded bus has none: no auth on loopback)."""
        holder: dict[str, Bus] = {}
        creds = credentials or credentials_from_env()
        auth: dict[str, Any] = {}
        if creds is not None:
            # Its own inbox prefix: the server lets each user read its own replies only.
            auth = {"user": creds.user, "password": creds.password, "inbox_prefix": naming.inbox_prefix(creds.user)}
        servers = parse_servers(url, "the NATS URL")

        async def on_disconnect() -> None:
            bus = holder.get("bus")
            if bus and bus.disconnected_at is None:
                bus.disconnected_at = time.monotonic()

        async def on_reconnect() -> None:
            bus = holder.get("bus")
            if bus:
                bus.disconnected_at = None
                for cb in list(bus._reconnected):
                    try:
                        await cb()
                    except Exception:  # a watchdog must never kill the client
                        log.exception("reconnect callback failed")

        async def on_error(exc: Exception) -> None:
            log.debug("nats error: %s", exc)
            if "bus" not in holder and _refused_user(exc):  # raised out of the first connect's retry loop
                who = f"user {creds.user}" if creds is not None else "a client without credentials"
                raise BusRefused(f"the bus at {url} refused {who} (Authorization Violation): "
                                 f"{'a wrong password' if creds is not None else 'it is a secured deployment'}")

        nc = nats.NATS()
        try:
            await nc.connect(
                servers,
                name=source,
                connect_timeout=connect_timeout,
                reconnect_time_wait=0.5,
                max_reconnect_attempts=max_reconnect_attempts,
                reconnected_cb=on_reconnect,
                disconnected_cb=on_disconnect,
                error_cb=on_error,
                ping_interval=ping_interval,
                pending_size=64 * 1024 * 1024,
                **auth,
            )
        except BusRefused:
            await nc.close()
            raise
        bus = cls(nc, stage, source, servers=servers, settings=settings)
        bus.user = creds.user if creds is not None else ""
        holder["bus"] = bus
        if ensure:
            await bus.ensure_streams()
        return bus

    def on_reconnect(self, cb: Callable[[], Awaitable[None]]) -> None:
        """Run `cb` after each reconnect (pull subscriptions can go silent after a server restart)."""
        self._reconnected.append(cb)

    def off_reconnect(self, cb: Callable[[], Awaitable[None]]) -> None:
        if cb in self._reconnected:
            self._reconnected.remove(cb)

    def unreachable_for(self) -> float:
        """Seconds since the connection to the server was lost (0.0 while connected; infinite
        once the client gave up and closed)."""
        if self.nc.is_closed:
            # Closed by its owner (a command that is done), not lost: a watchdog polling between
            # that close and the command's return must not call the control plane gone.
            return 0.0 if self._link.closed_on_purpose else float("inf")
        if self.disconnected_at is None:
            return 0.0
        return time.monotonic() - self.disconnected_at

    async def close(self) -> None:
        # Not drain(): draining idle pull subscriptions waits out its 30 s timeout. Everything we
        # publish is awaited (acked) already, so a flush and close lose nothing.
        self._link.closed_on_purpose = True
        if self.nc.is_connected:  # a flush while reconnecting would wait out its timeout
            try:
                await self.nc.flush(timeout=2)
            except Exception:
                pass
        try:
            await self.nc.close()
        except (ConnectionError, OSError, nats.errors.Error):  # the server went away first
            pass

    # ------------------------------------------------------------ streams

    async def ensure_streams(self) -> None:
        events, logs, dead_letters = stream_configs(self.stage, self.settings.replicas)
        await self._ensure(events)
        await self._ensure(logs, widen_duplicate_window=True)
        await self._ensure(dead_letters)

    async def _ensure(self, cfg: api.StreamConfig, *, widen_duplicate_window: bool = False) -> None:
        try:
            info = await self._stream_info(cfg.name)
            if widen_duplicate_window and cfg.duplicate_window and \
                    (info.config.duplicate_window or 0) < cfg.duplicate_window:
                # A stream an older version made with a shorter window (the server's 2 minutes).
                try:
                    await self.js.update_stream(replace(info.config, duplicate_window=cfg.duplicate_window))
                except APIError as exc:
                    log.warning("cannot widen the duplicate window of %s: %s", cfg.name, exc)
            if (info.config.num_replicas or 1) != (cfg.num_replicas or 1):
                log.info("stream %s keeps %s replicas (settings ask for %s): a stream's replicas are "
                            "changed by an operator (nats stream edit), not by a client", cfg.name,
                            info.config.num_replicas, cfg.num_replicas)
        except NotFoundError:
            await self._add_stream(cfg)

    async def _stream_info(self, name: str) -> Any:
        """Stream info, tried again while the server cannot answer yet. In a cluster that is
        for up to the placement wait (a cluster just started answers 503 until its JetStream
        meta leader is elected); on one server, `_settled`'s few attempts."""
        if self.settings.replicas <= 1:
            return await _settled(lambda: self.js.stream_info(name))
        deadline = time.monotonic() + self.settings.placement_wait_s
        delay = 0.2
        while True:
            try:
                return await self.js.stream_info(name)
            except (NatsTimeout, NoStreamResponseError, ServiceUnavailableError, NoRespondersError,
                    asyncio.TimeoutError):
                if time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _add_stream(self, cfg: api.StreamConfig) -> None:
        """Create a stream; a replicated one is retried while the cluster cannot place it yet
        (err 10005), for at most the placement wait, then a StreamPlacementError says why."""
        wait = self.settings.placement_wait_s
        deadline = time.monotonic() + wait
        delay = 0.25
        while True:
            try:
                await self.js.add_stream(cfg)
                return
            except APIError as exc:
                if exc.err_code == STREAM_EXISTS:  # created concurrently by another process
                    return
                if exc.err_code != NO_SUITABLE_PEERS:
                    raise
                said = exc.description or "no suitable peers for placement"
                if "insufficient" in said:  # the nodes' JetStream limits (max_file) are too small: final
                    raise StreamPlacementError(
                        f"the NATS cluster cannot place stream {cfg.name} ({said}): raise max_file in the "
                        "nodes' jetstream {} block") from exc
                if time.monotonic() + delay > deadline:
                    raise StreamPlacementError(
                        f"the NATS cluster could not place stream {cfg.name} with {cfg.num_replicas} replicas "
                        f"within {wait:g} s ({said}): are {cfg.num_replicas} nodes up, with JetStream, in one "
                        "cluster? (SKYPURZA_REPLICAS sets the count; 1 for a single server)") from exc
                log.info("stream %s: no suitable peers yet for %s replicas; retrying", cfg.name, cfg.num_replicas)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # ------------------------------------------------------------ publishing

    def envelope(self, event: Event, *, cause: Envelope | str | None = None, handler: str | None = None,
                 key: str = "", id: str | None = None, time: datetime | None = None) -> Envelope:
        """Wrap an event; when `cause` and `handler` are given, the id is derived from them."""
        if id is None and cause is not None:
            cause_id = cause if isinstance(cause, str) else cause.id
            id = derive_id(cause_id, handler or self.source, key)
        return envelope_of(event, source=self.source, id=id, time=time)

    def subject_of(self, env: Envelope) -> str:
        return naming.event_subject(self.stage, env.aggregate, env.aggregate_id, env.event_name)

    async def publish(self, item: Event | Envelope, *, expected_last_seq: int | None = None,
                      occ_subject: str | None = None, retries: int = 6, timeout: float = 5.0,
                      **envelope_kw: Any) -> api.PubAck:
        """Append one event and wait for the ack. Retries keep the same Nats-Msg-Id.

        With `expected_last_seq`, the append only succeeds if the last event on `occ_subject`
        (default: the aggregate's wildcard) still has that sequence (0: no event yet);
        otherwise ConcurrencyConflict.
        """
        env = item if isinstance(item, Envelope) else self.envelope(item, **envelope_kw)
        if self._hooks is not None:
            self._hooks.before(env)
        ack = await self._append(env, expected_last_seq=expected_last_seq, occ_subject=occ_subject,
                                 retries=retries, timeout=timeout)
        if self._hooks is not None:
            self._hooks.after(env, ack)
        return ack

    async def _append(self, env: Envelope, *, expected_last_seq: int | None, occ_subject: str | None,
                      retries: int = 6, timeout: float = 5.0) -> api.PubAck:
        headers = {"Nats-Msg-Id": env.id}
        if expected_last_seq is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected_last_seq)
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = occ_subject or naming.aggregate_subjects(
                self.stage, env.aggregate, env.aggregate_id)
        subject = self.subject_of(env)
        payload = env.to_json()
        delay = 0.1
        began = time.monotonic()
        attempt = 0
        while True:
            try:
                return await self.js.publish(subject, payload, timeout=timeout, headers=headers)
            except ServiceUnavailableError as exc:  # 503: the stream has no leader this moment
                leaderless, failure = True, exc
            except APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    raise ConcurrencyConflict(str(exc)) from exc
                raise
            except (NoStreamResponseError, NoRespondersError) as exc:
                leaderless, failure = True, exc
            except (NatsTimeout, asyncio.TimeoutError) as exc:
                leaderless, failure = False, exc
            attempt += 1
            # A stream without a leader answers at once: in a cluster that is an election, so
            # those answers are retried for ELECTION_WAIT_S whatever their count. Raised outside
            # its `except` (a bare `raise` here has no exception to re-raise): the last failure.
            if attempt >= retries and not (leaderless and time.monotonic() - began < ELECTION_WAIT_S):
                raise failure
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def publish_many(self, items: list[Event | Envelope], *, window: int = 4000,
                           ack_wait: float = ACK_WAIT_S) -> list[api.PubAck]:
        """Pipelined appends (many in flight), each with its own Nats-Msg-Id; what is not acked
        once its window has had no ack for `ack_wait` is retried by id (`publish`'s retries)."""
        if any(isinstance(i, Envelope) for i in items):
            envs = [i if isinstance(i, Envelope) else self.envelope(i) for i in items]
        else:
            envs = envelopes_of(items, source=self.source)  # type: ignore[arg-type]
        if self._hooks is not None:
            for env in envs:  # all checked before any is published
                self._hooks.before(env)
        acks: list[api.PubAck] = []
        inbox = self._ack_inbox()
        stage, subject = self.stage, naming.event_subject
        for start in range(0, len(envs), window):
            chunk = envs[start:start + window]
            # The bus's hot path (issue 21, bench/bus.py): one reply inbox, one wait per window
            # (events/pubpipe.py) rather than nats-py's future, timer slot and token per append.
            sent = await inbox.send([(subject(stage, e.aggregate, e.aggregate_id, e.event_name), e.to_json(), e.id)
                                     for e in chunk])
            # What is still unanswered once acks stop coming (or was answered with anything but
            # an ack) is appended again by id, one by one, as `settle` does.
            await inbox.wait(sent, ack_wait)
            for env, ack in zip(chunk, sent.acks):
                if ack is None:
                    ack = await self._append(env, expected_last_seq=None, occ_subject=None)
                acks.append(ack)
                if self._hooks is not None:
                    self._hooks.after(env, ack)
        return acks

    def _ack_inbox(self) -> AckInbox:
        inbox = self._link.acks
        if inbox is None:
            inbox = self._link.acks = AckInbox(self.nc)
        return inbox

    async def send_many(self, envs: Sequence[Envelope]) -> Window:
        """Start appends, in order, without waiting for their acks: through the connection's one
        reply inbox (events/pubpipe.py), one future for all of them rather than nats-py's future,
        token and timer per append (issue 21). No hooks run here: see `settle_many`."""
        stage, subject = self.stage, naming.event_subject
        return await self._ack_inbox().send([(subject(stage, e.aggregate, e.aggregate_id, e.event_name), e.to_json(),
                                              e.id) for e in envs])

    async def settle_many(self, envs: Sequence[Envelope], window: Window, *,
                          quiet: float = ACK_WAIT_S) -> list[api.PubAck]:
        """The acks of a `send_many`, as `settle` gives one: what gets no ack once answers stop
        coming for `quiet` seconds (or an answer that is not an ack) is appended again by id."""
        inbox = self._ack_inbox()
        if not window.done.done():
            await inbox.wait(window, quiet)
        acks = []
        for env, ack in zip(envs, window.acks):
            if ack is None:
                ack = await self._append(env, expected_last_seq=None, occ_subject=None)
            acks.append(ack)
        return acks

    async def send(self, env: Envelope) -> asyncio.Future:
        """Start one append without waiting for its ack (no hooks run here: see `settle`)."""
        return await self.js.publish_async(self.subject_of(env), env.to_json(), headers={"Nats-Msg-Id": env.id})

    async def settle(self, env: Envelope, fut: asyncio.Future, *, timeout: float = ACK_WAIT_S) -> api.PubAck:
        """The ack of a `send`, waited for at most `timeout`; otherwise the append is retried
        with the same id (de-duplicated if the first copy was stored). Bounded because a server
        killed between storing and answering never answers: an unbounded wait would hang its
        caller for ever (and hold one of nats-py's pending-publish slots)."""
        try:
            if fut.done():  # the common case in a pipeline: no timer to set up
                return fut.result()
            return await asyncio.wait_for(fut, timeout)  # cancelling on timeout frees the slot
        except asyncio.CancelledError:
            raise
        except Exception:
            return await self._append(env, expected_last_seq=None, occ_subject=None)

    # ------------------------------------------------------------ reading

    async def last_event(self, subject_filter: str, *, direct: bool = False) -> Stored | None:
        """The newest event whose subject matches `subject_filter` (wildcards allowed).
        `direct`: a direct get by subject (`$JS.API.DIRECT.GET.<stream>.<subject>`), which a
        grant can narrow to subjects, where a stored get (`STREAM.MSG.GET`, which also reads by
        sequence) cannot: a cluster's agent reads so. Any replica may answer it, so it can miss
        an event acknowledged a moment ago; without it the leader answers."""
        try:
            raw = await self.js.get_last_msg(self.events_stream, subject_filter, direct=direct)
        except NotFoundError:
            return None
        try:
            d = decode(raw.data or b"")
            env, ev, status, reason = d.envelope, d.event, d.status, d.reason
        except PoisonEvent as exc:
            env, ev, status, reason = None, None, "poison", str(exc)
        ts = raw.headers.get("Nats-Time-Stamp") if raw.headers else None
        when = datetime.fromisoformat(ts.replace("Z", "+00:00")) if ts else datetime.now(timezone.utc)
        return Stored(raw.seq or 0, raw.subject or "", when, env, ev, status, reason, raw.data or b"")

    async def last_seq(self) -> int:
        info = await self.js.stream_info(self.events_stream)
        return info.state.last_seq

    async def last_seq_of(self, subject_filters: list[str]) -> int:
        """The stream sequence of the newest event matching any of `subject_filters` (wildcards
        allowed; 0: none): one message get each, at once, whatever the log's length."""
        async def one(subject: str) -> int:
            try:
                return int((await self.js.get_last_msg(self.events_stream, subject)).seq or 0)
            except NotFoundError:
                return 0

        return max(await asyncio.gather(*(one(s) for s in subject_filters)), default=0)

    async def replay(self, *, filter_subject: str | None = None, start_seq: int | None = None,
                     start_time: datetime | None = None, until_seq: int | None = None,
                     until_time: datetime | None = None, stream: str | None = None,
                     batch: int = 1000, filter_subjects: list[str] | None = None) -> AsyncIterator[Stored]:
        """Every stored event from a point to the end of the log as it is now, in order."""
        async for msg in self.replay_raw(filter_subject=filter_subject, start_seq=start_seq,
                                         start_time=start_time, until_seq=until_seq,
                                         until_time=until_time, stream=stream, batch=batch,
                                         filter_subjects=filter_subjects):
            yield stored_from_msg(msg)

    async def replay_raw(self, *, filter_subject: str | None = None, start_seq: int | None = None,
                         start_time: datetime | None = None, until_seq: int | None = None,
                         until_time: datetime | None = None, stream: str | None = None,
                         batch: int = 1000, filter_subjects: list[str] | None = None) -> AsyncIterator[Any]:
        """`filter_subjects` (instead of `filter_subject`): several subjects as one ordered read,
        so the server skips what none of them matches (a cluster's usage ticks, say)."""
        stream = stream or self.events_stream
        subject = filter_subject or (naming.all_events_subject(self.stage) if stream == self.events_stream
                                     else naming.all_logs_subject(self.stage))
        info = await _settled(lambda: self.js.stream_info(stream))
        end = info.state.last_seq if until_seq is None else min(until_seq, info.state.last_seq)
        if end == 0 or (start_seq is not None and start_seq > end):
            return
        next_seq = max(1, start_seq) if start_seq is not None else None

        def config() -> api.ConsumerConfig:
            # Named by us so it can be deleted at once: left to `inactive_threshold`, replays in a
            # loop pile up consumers until the server refuses new ones (err 10026).
            cfg = api.ConsumerConfig(name=f"replay_{uuid.uuid4().hex}", ack_policy=api.AckPolicy.NONE,
                                     inactive_threshold=60.0,
                                     max_waiting=1, mem_storage=True, num_replicas=1)
            if filter_subjects:
                cfg.filter_subjects = list(filter_subjects)
            if next_seq is not None:
                cfg.deliver_policy, cfg.opt_start_seq = api.DeliverPolicy.BY_START_SEQUENCE, next_seq
            elif start_time is not None:
                cfg.deliver_policy = api.DeliverPolicy.BY_START_TIME
                cfg.opt_start_time = start_time.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
            else:
                cfg.deliver_policy = api.DeliverPolicy.ALL
            return cfg

        async def close(sub: Any, name: str | None) -> None:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
            await self._delete_consumer(stream, name)

        cfg = config()
        sub = await _settled(lambda: self.js.pull_subscribe(subject, stream=stream, config=cfg))
        quiet = recreated = 0
        try:
            # Nothing matches (a new cluster's history, logs of an unknown job): say so at once,
            # not after a fetch has waited out its timeout (a second on every such replay).
            try:
                if (await sub.consumer_info()).num_pending == 0:
                    return
            except (NatsTimeout, asyncio.TimeoutError, NotFoundError, ServiceUnavailableError):
                pass  # the loop below copes with a slow or restarted server
            while True:
                lost = False
                try:
                    msgs = await fetch(sub, batch=batch, timeout=1.0)
                except (NatsTimeout, asyncio.TimeoutError):  # nats-py also raises a bare one
                    # Nothing in a second: the end, unless the server says more is pending (a
                    # server just restarted, or busy, is slow to deliver: do not cut a replay short).
                    quiet += 1
                    try:
                        pending = (await sub.consumer_info()).num_pending
                    except (NotFoundError, ServiceUnavailableError):
                        pending, lost = None, True  # the server restarted: its memory consumer is gone
                    except Exception:
                        pending = None
                    if not lost:
                        if pending == 0 or quiet >= REPLAY_QUIET_FETCHES:
                            return
                        continue
                    msgs = []
                except (ServiceUnavailableError, NotFoundError):
                    lost, msgs = True, []
                if lost:
                    # Go on from the next message on a new consumer, a bounded number of times.
                    recreated += 1
                    if recreated > API_ATTEMPTS or self.nc.is_closed:
                        raise NoStreamResponseError
                    await close(sub, cfg.name)
                    await asyncio.sleep(min(0.2 * 2 ** recreated, 2.0))
                    cfg = config()
                    sub = await _settled(lambda: self.js.pull_subscribe(subject, stream=stream, config=cfg))
                    continue
                quiet = 0
                for msg in msgs:
                    md = msg.metadata
                    if md.sequence.stream > end:
                        return
                    if until_time is not None and md.timestamp > until_time:
                        return
                    next_seq = md.sequence.stream + 1
                    yield msg
                    if md.sequence.stream >= end or md.num_pending == 0:
                        return
        finally:
            await close(sub, cfg.name)

    async def follow(self, *, filter_subject: str | None = None, start_seq: int | None = None,
                     start_time: datetime | None = None, new_only: bool = False,
                     stream: str | None = None) -> AsyncIterator[Any]:
        """Live messages (raw nats Msg) from a point on, forever; recreated after a reconnect."""
        stream = stream or self.events_stream
        subject = filter_subject or (naming.all_events_subject(self.stage) if stream == self.events_stream
                                     else naming.all_logs_subject(self.stage))
        next_seq = start_seq
        while True:
            cfg = api.ConsumerConfig(name=f"follow_{uuid.uuid4().hex}", ack_policy=api.AckPolicy.NONE,
                                     inactive_threshold=30.0,
                                     mem_storage=True, num_replicas=1)
            if next_seq is not None:
                cfg.deliver_policy, cfg.opt_start_seq = api.DeliverPolicy.BY_START_SEQUENCE, next_seq
            elif start_time is not None:
                cfg.deliver_policy = api.DeliverPolicy.BY_START_TIME
                cfg.opt_start_time = start_time.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
            elif new_only:
                cfg.deliver_policy = api.DeliverPolicy.NEW
            try:
                sub = await self.js.pull_subscribe(subject, stream=stream, config=cfg)
            except Exception:
                await asyncio.sleep(0.5)
                continue
            try:
                while True:
                    try:
                        msgs = await fetch(sub, batch=256, timeout=2.0)
                    except (NatsTimeout, asyncio.TimeoutError):  # nats-py also raises a bare one
                        continue
                    for msg in msgs:
                        next_seq = msg.metadata.sequence.stream + 1
                        yield msg
            except (nats.errors.ConnectionClosedError, NotFoundError, APIError, nats.errors.Error):
                if self.nc.is_closed:
                    return
                await asyncio.sleep(0.3)  # consumer lost (server restart): recreate from next_seq
            finally:
                try:
                    await sub.unsubscribe()
                except Exception:
                    pass
                await self._delete_consumer(stream, cfg.name)

    async def _delete_consumer(self, stream: str, name: str | None) -> None:
        if not name or not self.nc.is_connected:  # closed, or reconnecting: it expires by itself
            return
        try:
            await self.js.delete_consumer(stream, name)
        except Exception:  # already gone (inactive threshold) or the server is away: harmless
            pass

    # ------------------------------------------------------------ logs stream

    async def publish_log(self, cluster: str, job_id: int | str, rank: int, line: str, *,
                          stream_name: str = "stdout", ts: datetime | None = None, seq: int | None = None,
                          offset: int | None = None, msg_id: str | None = None,
                          timeout: float | None = None, end: str = "\n") -> api.PubAck:
        """One chunk of a job's output: `seq` is its number in the (job, rank, phase) output and
        `offset` its byte offset in the phase's output file. With either (or `msg_id`) it carries
        a Nats-Msg-Id (`log_chunk_id`), so a chunk sent again is stored once. `end` is how the
        chunk ended: a line ("\n", the default, not written), "\r" (a progress state the next
        chunk overwrites) or "" (a partial line sent after a pause; its rest follows)."""
        chunk: dict[str, Any] = {"ts": (ts or datetime.now(timezone.utc)).isoformat(), "cluster": cluster,
                                 "job_id": job_id, "rank": rank, "stream": stream_name, "line": line}
        if end != "\n":
            chunk["end"] = end
        if seq is not None:
            chunk["seq"] = seq
        if offset is not None:
            chunk["offset"] = offset
        if msg_id is None and (seq is not None or offset is not None):
            msg_id = log_chunk_id(cluster, job_id, rank, stream_name, seq, offset, line)
        if msg_id:
            chunk["id"] = msg_id  # readers drop a copy stored after the window (cli/jobwatch.py)
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        return await self.js.publish(naming.log_subject(self.stage, cluster, job_id, rank),
                                     json.dumps(chunk).encode(), timeout=timeout, headers=headers)

    # ------------------------------------------------------------ secrets (outside the log)

    async def _secrets_kv(self) -> Any:
        bucket = naming.secrets_bucket(self.stage)
        try:
            return await self.js.key_value(bucket)
        except (NotFoundError, nats.js.errors.BucketNotFoundError):
            # Direct gets (`$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>`) name the key in
            # the subject, so a cluster's bus user can be granted its own cluster's keys only.
            return await self.js.create_key_value(secrets_kv_config(self.stage, self.settings.replicas))

    async def ensure_secrets_bucket(self) -> None:
        """The secrets bucket, made, or given direct gets if an older version made it without
        them (a stream update: only the deployment's `control` user may; busauth.set_up)."""
        await self._secrets_kv()
        stream = f"KV_{naming.secrets_bucket(self.stage)}"
        info = await self._stream_info(stream)
        if not info.config.allow_direct:
            await self.js.update_stream(replace(info.config, allow_direct=True))
            log.info("secrets bucket %s: direct gets allowed (a cluster's agent reads only its own keys)", stream)

    async def put_secrets(self, key: str, values: dict[str, str], cluster: str | None = None) -> None:
        """`cluster`: the cluster that runs the job (none for a managed job's, whose clusters come
        later: the recovery service copies them to each launch's, `copy_secrets`)."""
        kv = await self._secrets_kv()
        await kv.put(naming.secrets_key(key, cluster), json.dumps(values).encode())

    async def get_secrets(self, key: str | None, cluster: str | None = None, *, legacy: bool = True,
                          attempts: int = 3) -> dict[str, str]:
        """A job's secrets on `cluster` (`naming.secrets_key`). `legacy`: if none are under the
        cluster, look under the key alone too (as written before secrets were keyed by cluster);
        a cluster's own bus user may not read that, so its agent passes False. A key not found
        is looked for again (`attempts`): a direct get may be answered by a replica that the
        write has not reached yet."""
        if not key:
            return {}
        kv = await self._secrets_kv()
        names = [naming.secrets_key(key, cluster)] if cluster else []
        if legacy or not cluster:
            names.append(naming.secrets_key(key))
        for attempt in range(max(1, attempts)):
            for kv_key in names:
                try:
                    entry = await kv.get(kv_key)
                except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                    continue
                return json.loads(entry.value or b"{}")
            if attempt + 1 < attempts:
                await asyncio.sleep(0.2 * (attempt + 1))
        return {}

    async def copy_secrets(self, key: str, cluster: str) -> bool:
        """A managed job's task secrets (under `key` alone) to the key of the cluster a launch
        runs on; False when there are none (expired, or never written)."""
        values = await self.get_secrets(key, attempts=1)
        if not values:
            return False
        await self.put_secrets(key, values, cluster)
        return True

    # ------------------------------------------------------------ queries (request-reply)

    async def request(self, service: str, query: str, payload: dict[str, Any] | None = None,
                      timeout: float = 10.0) -> Any:
        msg = await self.nc.request(naming.query_subject(self.stage, service, query),
                                    json.dumps(payload or {}).encode(), timeout=timeout)
        body = json.loads(msg.data or b"null")
        if isinstance(body, dict) and "__error__" in body:
            raise RuntimeError(body["__error__"])
        return body

    async def serve_queries(self, service: str,
                            handlers: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]],
                            concurrency: int = 1) -> list[Any]:
        """Answer each query with its handler's result as JSON (a result that is `bytes` is JSON
        already: sent as it is). With `concurrency` > 1 up to that many requests of one query are
        answered at once (nats-py runs a subscription's callbacks one after the other, so one slow
        answer, or one waiting for its `min_seq`, would hold up every other); past the bound the
        next request waits for a slot."""
        subs = []
        for query, handler in handlers.items():
            async def answer(msg: Any, handler: Callable[[dict[str, Any]], Awaitable[Any]] = handler) -> None:
                try:
                    result = await handler(json.loads(msg.data or b"{}"))
                    data = result if isinstance(result, bytes) else json.dumps(result, default=str).encode()
                except Exception as exc:  # the caller sees the error, the service goes on
                    log.exception("query failed")
                    data = json.dumps({"__error__": f"{type(exc).__name__}: {exc}"}).encode()
                try:
                    await msg.respond(data)
                except Exception as exc:  # the bus went away mid-answer: the caller times out and asks again
                    log.warning("answering a %s query failed: %s: %s", query, type(exc).__name__, exc)

            cb = answer if concurrency <= 1 else _concurrent(answer, concurrency)
            subs.append(await self.nc.subscribe(naming.query_subject(self.stage, service, query),
                                                queue=service, cb=cb))
        return subs
