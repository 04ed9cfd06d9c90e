"""The metrics service: `/metrics` for Prometheus, computed at each scrape from the projections'
summary queries over the bus (status `metrics_summary`, ledger `spend_summary`: aggregated in
DuckDB, so a scrape's cost does not grow with the jobs known), JetStream's own counters, and a
fold of the live log.

A `LoopContract` that emits nothing. `run` follows the log from its first event into
`logfold.LogCounters` and serves HTTP on the configured address (settings.py); each scrape asks
the sources at once, each bounded by `query_timeout_s`: a source that does not answer leaves its
families out and shows `skypurza_metrics_source_up{source} 0`, so a slow ledger never fails a scrape.
Where it listens is written to `naming.metrics_endpoint_file` (`spz api status -o json`).

    python -m skypurza.services.observability.service --nats URL --stage dev [--port N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import json
import logging
import os
import sys
from typing import Any

from skypurza.events import ledger_queries, metrics_queries, naming, status_queries
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.bus import CANNOT_CONNECT, Bus, stored_from_msg
from skypurza.events.contract import BusAccess
from skypurza.events.models import ClusterProvisioned
from skypurza.events.nodesample import decode_sample
from skypurza.events.service import LoopContract

from . import goodput, logfold, render
from .samples import COST_DIMENSIONS, QUEUE_WAIT_BUCKETS, Snapshot, families, segments
from .settings import DEFAULT_PORT, MetricsSettings

log = logging.getLogger("skypurza.observability")

# It reads the log (a fold of its own), asks the status and ledger services, and hears node
# samples (goodput's useful GPU time); it publishes nothing.
CONTRACT = LoopContract(name="observability", consumes=(), emits=(),
                        bus=BusAccess(answers=metrics_queries.SERVICE, asks=("status", "ledger"), samples="read",
                                      dead_letters="read",
                                      consumers="read"))

MAX_REQUEST_BYTES = 8192  # a scrape's request line and headers; anything longer is refused
READ_TIMEOUT_S = 5.0


def paid_of(spend: dict[str, Any]) -> goodput.Paid:
    """The ledger's paid GPU-seconds and GPU dollars by team and job (`spend_summary`)."""
    by = spend.get("by") or {}
    return {d: {str(line["key"]): (float(line.get("gpu_seconds") or 0), int(line.get("gpu_cost_micros") or 0) / 1e6)
                for line in by.get(d, [])} for d in ("team", "job")}


class ObservabilityService:
    contract = CONTRACT

    def __init__(self, settings: MetricsSettings | None = None) -> None:
        self.settings = settings or MetricsSettings.load()
        self.counters = logfold.LogCounters()
        self.goodput = goodput.GoodputFold(busy_pct=self.settings.busy_pct)
        self.samples_dropped = 0
        self.page = render.PageCache()  # the last encoding of each summary's families (render.py)
        self.bus: Bus | None = None
        self.url: str | None = None
        self._listening = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None

    async def serving(self) -> None:
        await self._listening.wait()

    # ------------------------------------------------------------ the loop

    async def run(self, bus: Bus, stop: asyncio.Event) -> None:
        self.bus = bus
        follower = asyncio.create_task(self._follow(bus))
        try:
            samples = await bus.nc.subscribe(naming.samples_filter(bus.stage), cb=self._on_sample)
            queries = await bus.serve_queries(metrics_queries.SERVICE, {"render": self._render_query,
                                                                         "goodput": self._goodput_query})
            self._server = await self._listen()
        except BaseException:
            await stop_tasks(follower)
            raise
        host, port = self._server.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}/metrics"
        self._write_endpoint(bus.stage)
        self._listening.set()
        log.info("metrics at %s", self.url)
        try:
            await stop.wait()
        finally:
            await self.close()
            await stop_tasks(follower)
            for sub in (samples, *queries):
                try:
                    await sub.unsubscribe()
                except Exception:  # the connection may be gone already
                    pass

    async def _render_query(self, params: dict[str, Any]) -> dict[str, Any]:
        """The page over the bus (events/metrics_queries.py), for the API server's `/metrics`."""
        body, ctype = await self.render(str(params.get("accept") or "")[:metrics_queries.MAX_ACCEPT_CHARS])
        return {"content_type": ctype, "body": body.decode()}

    async def _goodput_query(self, params: dict[str, Any]) -> dict[str, Any]:
        """Goodput by team and job over the bus (events/metrics_queries.py), for the console: the
        same window and numbers as the `*_goodput_ratio` families (one fold, one report)."""
        assert self.bus is not None
        spend = await self._ask(ledger_queries.spend_summary(self.bus, max_jobs=self.settings.max_series,
                                                             timeout=self.settings.query_timeout_s))
        if spend is None:
            return {"ledger": False, "team": [], "job": []}
        rep = goodput.report(self.goodput, paid_of(spend))
        return {"ledger": True, **{dim: [{"key": k, **dataclasses.asdict(g)} for k, g in keys.items()]
                                   for dim, keys in rep.items()}}

    async def _on_sample(self, msg: Any) -> None:
        """A node sample: its busy GPUs credited to the cluster's owner (pure, a few microseconds;
        a sample that does not decode is counted and dropped)."""
        sample = decode_sample(msg.data)
        if sample is None:
            self.samples_dropped += 1
            return
        goodput.observe(self.goodput, sample)

    async def _listen(self) -> asyncio.AbstractServer:
        """The endpoint on the configured port; the default port taken (another stage's control
        plane on this machine) is not a crash loop: any free port, said in the log and shown by
        `spz api status`."""
        try:
            return await asyncio.start_server(self._handle, self.settings.host, self.settings.port,
                                              limit=MAX_REQUEST_BYTES)
        except OSError as exc:
            if self.settings.port != DEFAULT_PORT or exc.errno != errno.EADDRINUSE:
                raise
        server = await asyncio.start_server(self._handle, self.settings.host, 0, limit=MAX_REQUEST_BYTES)
        log.warning("port %d is in use (another control plane on this machine?): metrics on port %d instead; "
                    "set SKYPURZA_METRICS_PORT for a fixed one", DEFAULT_PORT, server.sockets[0].getsockname()[1])
        return server

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            if self.bus is not None:
                try:
                    path = naming.metrics_endpoint_file(self.bus.stage)
                    if json.loads(path.read_text()).get("pid") == os.getpid():
                        path.unlink()
                except (OSError, ValueError):
                    pass

    def _write_endpoint(self, stage: str) -> None:
        path = naming.metrics_endpoint_file(stage)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": self.url, "pid": os.getpid()}))
            tmp.replace(path)
        except OSError as exc:  # the endpoint still serves; only `spz api status` will not show it
            log.warning("cannot record the metrics URL in %s: %s", path, exc)

    async def _follow(self, bus: Bus) -> None:
        async for msg in bus.follow(start_seq=1):
            try:
                st = stored_from_msg(msg)
                logfold.apply(self.counters, st.seq, st.timestamp, st.event)
                if isinstance(st.event, ClusterProvisioned):
                    goodput.own(self.goodput, st.event.cluster, st.event.team, st.event.managed_job_id)
            except Exception as exc:  # one bad event never stops the metrics
                log.warning("metrics: event skipped: %r", exc)

    # ------------------------------------------------------------ one scrape

    async def _ask(self, coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, self.settings.query_timeout_s)
        except Exception as exc:
            log.debug("metrics source failed: %r", exc)
            return None

    async def snapshot(self) -> Snapshot:
        """One scrape's sources: the projections' summaries (aggregated where the data is, so a
        scrape moves a few hundred rows whatever the number of jobs), JetStream, the log fold."""
        assert self.bus is not None
        bus, t, ask = self.bus, self.settings.query_timeout_s, self._ask
        summary, spend, spos, lpos, last, consumers, dlq = await asyncio.gather(
            ask(status_queries.metrics_summary(bus, QUEUE_WAIT_BUCKETS, timeout=t)),
            ask(ledger_queries.spend_summary(bus, max_jobs=self.settings.max_series, timeout=t)),
            ask(status_queries.position(bus, timeout=t)), ask(ledger_queries.position(bus, timeout=t)),
            ask(bus.last_seq()), ask(self._consumers()), ask(self._dead_letters()))
        snap = Snapshot(summary=summary, spend=spend, consumers=consumers, dead_letters=dlq, last_seq=last,
                        log=self.counters)
        snap.projections = {k: v for k, v in (("status", spos), ("ledger", lpos)) if v is not None}
        snap.sources = {"status": summary is not None, "ledger": spend is not None, "jetstream": consumers is not None}
        if spend is not None:
            snap.goodput = goodput.report(self.goodput, paid_of(spend))
        return snap

    async def snapshot_rows(self) -> Snapshot:
        """The first path, kept as the reference the summaries are tested (and benched) against:
        every cluster, job and managed job, and one cost report per dimension, at each scrape."""
        assert self.bus is not None
        bus, t, ask = self.bus, self.settings.query_timeout_s, self._ask
        status, jobs, managed, spos, lpos, last, consumers, dlq, *costs = await asyncio.gather(
            ask(status_queries.status(bus, all=True, timeout=t)), ask(status_queries.queue(bus, timeout=t)),
            ask(status_queries.jobs_queue(bus, timeout=t)), ask(status_queries.position(bus, timeout=t)),
            ask(ledger_queries.position(bus, timeout=t)), ask(bus.last_seq()), ask(self._consumers()),
            ask(self._dead_letters()),
            *(ask(ledger_queries.cost_report(bus, by=d, timeout=t)) for d in COST_DIMENSIONS))
        snap = Snapshot(clusters=status, jobs=jobs, managed=managed, consumers=consumers, dead_letters=dlq,
                        last_seq=last, log=self.counters)
        if all(c is not None for c in costs):
            snap.costs = dict(zip(COST_DIMENSIONS, costs))
        snap.projections = {k: v for k, v in (("status", spos), ("ledger", lpos)) if v is not None}
        snap.sources = {"status": status is not None, "ledger": snap.costs is not None,
                        "jetstream": consumers is not None}
        return snap

    async def _consumers(self) -> list[dict[str, Any]]:
        assert self.bus is not None
        out = []
        for info in await self.bus.js.consumers_info(self.bus.events_stream):
            if not info.config.durable_name:  # replays and follows: short-lived, not a service
                continue
            out.append({"consumer": info.name, "num_pending": info.num_pending or 0,
                        "num_redelivered": info.num_redelivered or 0, "num_ack_pending": info.num_ack_pending or 0})
        return out

    async def _dead_letters(self) -> dict[str, int]:
        assert self.bus is not None
        prefix = f"{naming.subject_prefix(self.bus.stage)}.dlq."
        info = await self.bus.js.stream_info(self.bus.dlq_stream, subjects_filter=f"{prefix}>")
        subjects = info.state.subjects or {}
        return {subj[len(prefix):]: int(n) for subj, n in subjects.items()}

    async def render(self, accept: str | None, rows: bool = False) -> tuple[bytes, str]:
        """The page: the sources asked now; the summaries' runs re-encoded only when their answer
        differs from the last scrape's (render.py). The rows path, the reference, is built whole."""
        if rows:
            return render.encode(families(await self.snapshot_rows(), self.settings.max_series), accept)
        return self.page.page(segments(await self.snapshot(), self.settings.max_series), accept)

    # ------------------------------------------------------------ HTTP, just enough for a scrape

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = (lines[0].split(" ") + ["", "", ""])[:3]
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, body, ctype = "405 Method Not Allowed", b"only GET /metrics\n", "text/plain"
            elif path != "/metrics":
                status, body, ctype = "404 Not Found", b"see /metrics\n", "text/plain"
            else:
                body, ctype = await self.render(headers.get("accept"))
                status = "200 OK"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            pass  # a client that went away or sent too much: nothing to answer
        except Exception:
            log.exception("metrics: scrape failed")
            try:
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except Exception:
                pass
        finally:
            writer.close()


# ---------------------------------------------------------------- process entry point


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skypurza.services.observability.service", description=__doc__)
    p.add_argument("--nats", required=True)
    p.add_argument("--stage", default=naming.DEFAULT_STAGE)
    p.add_argument("--port", type=int, default=None, help="overrides SKYPURZA_METRICS_PORT (0: any free port)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = MetricsSettings.load()
    if args.port is not None:
        if not 0 <= args.port <= 65535:
            print(f"error: --port {args.port}: expected 0 to 65535", file=sys.stderr)
            return 2
        settings = dataclasses.replace(settings, port=args.port)

    async def go() -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        bus = await Bus.connect(args.nats, args.stage, source=f"/skypurza/{args.stage}/observability")
        try:
            await ObservabilityService(settings).run(bus, stop)
        finally:
            await bus.close()

    try:
        asyncio.run(go())
    except CANNOT_CONNECT as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken: one line, not a traceback
        print(f"error: metrics endpoint: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
