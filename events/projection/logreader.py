"""Reading the event log in order, in large batches, with little cost per message.

nats-py's `fetch` reads about 24k messages/s here (it builds a Msg, parses its headers and its
metadata, and passes it through a queue, for each message): the whole budget of a 25k events/s
replay. This reader drives a pull consumer by hand: it sends `CONSUMER.MSG.NEXT` requests for big
batches, keeps up to two in flight so the server never waits for us, and reads the stream
sequence, timestamp and pending count straight from each message's `$JS.ACK...` reply subject.

Two transports carry the messages:
- `RawTransport`: its own TCP connection speaking the NATS client protocol (CONNECT, SUB, PUB,
  PING/PONG, HMSG/MSG), parsing frames from a byte buffer: ~2.5 µs a message here. Used when the
  server needs neither TLS nor credentials beyond user/password or a token.
- `NatsPyTransport`: an inbox subscription on the bus's own nats-py connection (~10 µs a
  message), for everything else (TLS, nkeys, creds files).

The consumer is ephemeral (no acks, memory storage, removed when idle): a projection (the status
service's, the ledger's) keeps its own position (the checkpoint in DuckDB), so after a restart,
a server restart, a lost connection or a lost consumer the reader just creates a new consumer
from the next sequence it needs. Its consumers are named after the reader (`reader=`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from nats.js import api

from skypurza.events import naming

log = logging.getLogger("skypurza.projection.reader")

# (stream sequence, server timestamp in ns since the epoch, payload)
RawMsg = tuple[int, int, bytes]


def parse_ack_subject(reply: str | bytes) -> tuple[int, int, int]:
    """`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` (or the v2 form with
    domain and account hash) -> (stream seq, timestamp ns, pending)."""
    t = reply.split("." if isinstance(reply, str) else b".")
    if len(t) == 9:
        return int(t[5]), int(t[7]), int(t[8])
    if len(t) >= 11:
        return int(t[7]), int(t[9]), int(t[10])
    raise ValueError(f"not a JetStream ack subject: {reply!r}")


class Sink:
    """Where a transport puts what it receives (the LogReader)."""

    def message(self, reply: str | bytes, data: bytes) -> None: ...
    def status(self, code: str, pending: int | None, description: str) -> None: ...
    def broken(self, reason: str) -> None: ...


class NatsPyTransport:
    def __init__(self, bus: Any, sink: Sink):
        self.bus, self.sink = bus, sink
        self.inbox = bus.nc.new_inbox()
        self.sub: Any = None

    async def start(self) -> None:
        async def on_msg(msg: Any) -> None:
            hdr = msg.headers
            if hdr and "Status" in hdr and not msg.data:
                pending = hdr.get("Nats-Pending-Messages")
                self.sink.status(hdr.get("Status") or "", int(pending) if pending else None,
                                 hdr.get("Description") or "")
            elif msg.reply:
                self.sink.message(msg.reply, msg.data)

        self.sub = await self.bus.nc.subscribe(self.inbox, cb=on_msg, pending_msgs_limit=1_000_000,
                                               pending_bytes_limit=1024**3)

    async def request(self, subject: str, body: bytes) -> None:
        await self.bus.nc.publish(subject, body, reply=self.inbox)

    async def close(self) -> None:
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()
            except Exception:
                pass
            self.sub = None


class RawTransport:
    """A minimal NATS client connection that only subscribes to one inbox and publishes requests."""

    def __init__(self, host: str, port: int, sink: Sink, *, user: str | None = None,
                 password: str | None = None, token: str | None = None):
        self.host, self.port, self.sink = host, port, sink
        self.user, self.password, self.token = user, password, token
        # A secured bus lets a user subscribe to its own inbox prefix only (events/natsauth.py).
        self.inbox = f"{naming.inbox_prefix(user) if user else '_INBOX'}.{uuid.uuid4().hex}"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task | None = None

    @classmethod
    def for_bus(cls, bus: Any, sink: Sink) -> RawTransport | None:
        """A raw transport to the server the bus is connected to, or None when one cannot be used."""
        nc = bus.nc
        url = getattr(nc, "connected_url", None)
        opts = getattr(nc, "options", {}) or {}
        if url is None or url.scheme not in ("nats", "") or opts.get("tls"):
            return None
        if opts.get("user_credentials") or opts.get("nkeys_seed") or opts.get("nkeys_seed_str") \
                or opts.get("signature_cb"):
            return None
        info = getattr(nc, "_server_info", {}) or {}
        if info.get("tls_required"):
            return None
        return cls(url.hostname or "127.0.0.1", url.port or 4222, sink,
                   user=url.username or opts.get("user"), password=url.password or opts.get("password"),
                   token=opts.get("token"))

    async def start(self) -> None:
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=1 << 22), timeout=5.0)
        line = await asyncio.wait_for(self.reader.readline(), timeout=5.0)
        if not line.startswith(b"INFO "):
            raise ConnectionError(f"unexpected greeting from NATS: {line[:80]!r}")
        info = json.loads(line[5:])
        if info.get("tls_required"):
            raise ConnectionError("the server requires TLS")
        connect: dict[str, Any] = {"verbose": False, "pedantic": False, "headers": True,
                                   "no_responders": True, "protocol": 1, "lang": "python-raw",
                                   "version": "1", "name": "projection-log-reader"}
        if self.user:
            connect.update(user=self.user, **({"pass": self.password} if self.password else {}))
        if self.token:
            connect["auth_token"] = self.token
        self.writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\n")
        self.writer.write(f"SUB {self.inbox} 1\r\nPING\r\n".encode())
        await self.writer.drain()
        while True:  # the PONG says CONNECT and SUB were accepted
            line = await asyncio.wait_for(self.reader.readline(), timeout=5.0)
            if line.startswith(b"PONG"):
                break
            if line.startswith(b"-ERR"):
                raise ConnectionError(line.decode(errors="replace").strip())
        self.task = asyncio.create_task(self._read_loop())

    async def request(self, subject: str, body: bytes) -> None:
        assert self.writer is not None
        self.writer.write(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), self.inbox.encode(), len(body), body))
        await self.writer.drain()

    async def _read_loop(self) -> None:
        assert self.reader is not None and self.writer is not None
        buf = b""
        sink_msg = self.sink.message
        try:
            while True:
                chunk = await self.reader.read(1 << 20)
                if not chunk:
                    raise ConnectionError("connection closed by the server")
                buf = buf + chunk if buf else chunk
                pos, size = 0, len(buf)
                while True:
                    nl = buf.find(b"\r\n", pos)
                    if nl < 0:
                        break
                    op = buf[pos:pos + 4]
                    if op == b"HMSG":
                        parts = buf[pos:nl].split(b" ")
                        total, hlen = int(parts[-1]), int(parts[-2])
                        end = nl + 2 + total
                        if end + 2 > size:
                            break
                        if len(parts) == 6:
                            sink_msg(parts[3], buf[nl + 2 + hlen:end])
                        else:  # no reply subject: a status (408 timeout, 409 ...), headers only
                            self._status(buf[nl + 2:nl + 2 + hlen])
                        pos = end + 2
                    elif op == b"MSG ":
                        parts = buf[pos:nl].split(b" ")
                        total = int(parts[-1])
                        end = nl + 2 + total
                        if end + 2 > size:
                            break
                        if len(parts) == 5:
                            sink_msg(parts[3], buf[nl + 2:end])
                        pos = end + 2
                    elif op == b"PING":
                        self.writer.write(b"PONG\r\n")
                        pos = nl + 2
                    elif op == b"-ERR":
                        log.warning("NATS: %s", buf[pos:nl].decode(errors="replace"))
                        pos = nl + 2
                    else:  # +OK, PONG, INFO
                        pos = nl + 2
                buf = buf[pos:]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.sink.broken(f"{type(exc).__name__}: {exc}")

    def _status(self, header_block: bytes) -> None:
        lines = header_block.decode(errors="replace").split("\r\n")
        first = lines[0].split(" ", 2)  # NATS/1.0 408 Request Timeout
        code = first[1] if len(first) > 1 else ""
        desc = first[2] if len(first) > 2 else ""
        pending = None
        for h in lines[1:]:
            k, _, v = h.partition(":")
            if k.strip().lower() == "nats-pending-messages":
                try:
                    pending = int(v.strip())
                except ValueError:
                    pass
        self.sink.status(code, pending, desc)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass
            self.task = None
        if self.writer is not None:
            try:
                self.writer.close()
                await self.writer.wait_closed()
            except Exception:
                pass
            self.writer = None


class LogReader(Sink):
    """Batches of `(seq, ts_ns, payload)` from `start_seq` on, in stream order.

    Without `follow`, it stops at the end of the log as it was when reading began (or at
    `until_seq` / before the first message stored after `until_time`). With `follow`, it waits
    for new events forever (yielding an empty batch when a wait ends with nothing new), and
    `caught_up` says whether the last batch reached the end of the log.
    """

    def __init__(self, bus: Any, *, start_seq: int = 1, until_seq: int | None = None,
                 until_time: datetime | None = None, follow: bool = False, batch: int = 5000,
                 expires_s: float = 2.0, filter_subject: str | None = None,
                 start_time: datetime | None = None, transport: str = "auto", reader: str = "ledger"):
        self.bus = bus
        self.reader = reader  # the component its consumers are named after (naming.consumer)
        self.next_seq = max(1, start_seq)
        self.start_time = start_time  # instead of start_seq, until the first message is read
        self.until_seq = until_seq
        self.until_ns = _to_ns(until_time) if until_time is not None else None
        self.follow = follow
        self.batch = max(1, batch)
        self.expires_s = expires_s
        self.filter_subject = filter_subject or naming.all_events_subject(bus.stage)
        self.transport_kind = transport  # "auto", "raw" or "natspy"
        self.caught_up = False
        self._buf: list[RawMsg] = []
        self._wake = asyncio.Event()
        self._outstanding = 0
        self._consumer: str | None = None
        self._marker = b""
        self._transport: RawTransport | NatsPyTransport | None = None
        self._recreate = False
        self._expired = False
        self._last_pending: int | None = None
        self._end: int | None = None
        self._closed = False
        bus.on_reconnect(self._on_reconnect)

    # ------------------------------------------------------------ Sink

    def message(self, reply: str | bytes, data: bytes) -> None:
        if isinstance(reply, str):
            reply = reply.encode()
        if self._marker not in reply:
            return  # a late message of a consumer we replaced
        seq, ts, pending = parse_ack_subject(reply)
        self._outstanding -= 1
        self._last_pending = pending
        self._buf.append((seq, ts, data))
        self._wake.set()

    def status(self, code: str, pending: int | None, description: str) -> None:
        if code == "408":  # a pull request expired: what it still had to deliver is void
            self._outstanding = max(self._outstanding - (pending if pending is not None else self.batch), 0)
            self._expired = True
        elif code in ("404", "409"):
            log.debug("pull request ended: %s %s", code, description)
            self._recreate = True
        self._wake.set()

    def broken(self, reason: str) -> None:
        log.warning("log reader connection lost: %s; reconnecting", reason)
        self._recreate = True
        self._wake.set()

    async def _on_reconnect(self) -> None:
        self._recreate = True
        self._wake.set()

    # ------------------------------------------------------------ consumer and requests

    async def _new_transport(self) -> RawTransport | NatsPyTransport:
        if self.transport_kind in ("auto", "raw"):
            raw = RawTransport.for_bus(self.bus, self)
            if raw is not None:
                try:
                    await raw.start()
                    return raw
                except Exception as exc:
                    await raw.close()
                    if self.transport_kind == "raw":
                        raise
                    log.info("raw NATS reader unavailable (%s); using nats-py", exc)
            elif self.transport_kind == "raw":
                raise ConnectionError("the raw reader cannot be used with this connection (TLS or credentials)")
        t = NatsPyTransport(self.bus, self)
        await t.start()
        return t

    async def _create_consumer(self) -> None:
        await self._delete_consumer()
        if self._transport is not None:
            await self._transport.close()
            self._transport = None
        self._buf = []  # the new consumer delivers them again from next_seq
        self._outstanding = 0
        self._expired = False
        self._transport = await self._new_transport()
        name = naming.consumer(self.bus.stage, self.reader, f"r{uuid.uuid4().hex[:12]}")
        cfg = api.ConsumerConfig(
            name=name, ack_policy=api.AckPolicy.NONE, filter_subject=self.filter_subject,
            mem_storage=True, num_replicas=1, inactive_threshold=30.0, max_waiting=8,
        )
        if self.start_time is not None:
            t = self.start_time if self.start_time.tzinfo else self.start_time.replace(tzinfo=timezone.utc)
            cfg.deliver_policy = api.DeliverPolicy.BY_START_TIME
            cfg.opt_start_time = t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
        elif self.next_seq > 1:
            cfg.deliver_policy, cfg.opt_start_seq = api.DeliverPolicy.BY_START_SEQUENCE, self.next_seq
        else:
            cfg.deliver_policy = api.DeliverPolicy.ALL
        await self.bus.js.add_consumer(self.bus.events_stream, cfg)
        self._consumer = name
        self._marker = f".{name}.".encode()

    async def _delete_consumer(self) -> None:
        if self._consumer is None:
            return
        name, self._consumer = self._consumer, None
        try:
            await self.bus.js.delete_consumer(self.bus.events_stream, name)
        except Exception:  # gone already (server restart, inactivity): nothing to clean up
            pass

    async def _request(self) -> None:
        assert self._consumer is not None and self._transport is not None
        body = json.dumps({"batch": self.batch, "expires": int(self.expires_s * 1e9)}).encode()
        await self._transport.request(f"$JS.API.CONSUMER.MSG.NEXT.{self.bus.events_stream}.{self._consumer}", body)
        self._outstanding += self.batch

    # ------------------------------------------------------------ reading

    async def batches(self) -> AsyncIterator[list[RawMsg]]:
        loop = asyncio.get_running_loop()
        try:
            if not self.follow:
                info = await self.bus.js.stream_info(self.bus.events_stream)
                last = info.state.last_seq
                self._end = last if self.until_seq is None else min(self.until_seq, last)
                if self._end < self.next_seq:
                    self.caught_up = True
                    return
            await self._create_consumer()
            idle_deadline = loop.time() + self.expires_s + 5.0
            while not self._closed:
                if self._recreate:
                    self._recreate = False
                    try:
                        await self._create_consumer()
                    except Exception as exc:
                        log.warning("log reader: cannot create consumer (%r); retrying", exc)
                        await asyncio.sleep(0.5)
                        self._recreate = True
                        continue
                if self._outstanding <= self.batch:
                    try:
                        await self._request()
                    except Exception as exc:
                        log.warning("log reader: pull request failed (%r); retrying", exc)
                        await asyncio.sleep(0.5)
                        self._recreate = True
                        continue
                if not self._buf:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=self.expires_s + 5.0)
                    except asyncio.TimeoutError:
                        pass
                    now = loop.time()
                    if not self._buf:
                        if self._expired:
                            self._expired = False
                            self.caught_up = True
                            idle_deadline = now + self.expires_s + 5.0
                            if not self.follow:
                                return  # nothing more matches before the end (filtered reads)
                            yield []
                        elif now > idle_deadline:
                            # No message and no status for too long: the consumer is gone.
                            self._recreate = True
                            idle_deadline = now + self.expires_s + 5.0
                        continue
                idle_deadline = loop.time() + self.expires_s + 5.0
                out, self._buf = self._buf, []
                if out[0][0] < self.next_seq:
                    out = [m for m in out if m[0] >= self.next_seq]
                    if not out:
                        continue
                done = False
                if self._end is not None and out[-1][0] >= self._end:
                    out = [m for m in out if m[0] <= self._end]
                    done = True
                if self.until_ns is not None and out and out[-1][1] > self.until_ns:
                    out = [m for m in out if m[1] <= self.until_ns]
                    done = True
                if out:
                    self.next_seq = out[-1][0] + 1
                    self.start_time = None
                self.caught_up = self._last_pending == 0 and not self._buf
                if not self.follow and self._last_pending == 0 and not self._buf:
                    done = True
                if out:
                    yield out
                if done:
                    self.caught_up = True
                    return
        finally:
            await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.bus.off_reconnect(self._on_reconnect)
        await self._delete_consumer()
        if self._transport is not None:
            await self._transport.close()
            self._transport = None


def _to_ns(t: datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    delta = t - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
