"""API server benchmark: 50 concurrent clients over HTTP, beside the same through the embedded bus.

Starts, here: a nats-server (file storage, as the control plane runs it), the status service and
the API server as processes of their own (uvicorn), an admin and `--members` members of one team,
each with a token (the identity events), and `--clusters` clusters known to the status service
(each a TaskSubmitted, PlacementChosen and ClusterProvisioned on the log), owned by the members in
turn. Then, in one run, with `--clients` concurrent clients (goal: p50 <= 25 ms with 1,000
clusters known), p50 and p99 latency of:

- a member's `GET /api/v1/clusters` (their own clusters, the default: what most calls are), each
  client a member of its own, beside the status query of one user's clusters on the embedded bus
  (events/status_queries.py `status(user=...)`), as many at once;
- an admin's `GET /api/v1/clusters?all_users=true` (every cluster: ~0.8 MB at 1,000), beside the
  status query the CLI makes on the embedded bus (every cluster); then the same asking for gzip
  (Accept-Encoding, as httpx and browsers do: ~30 kB sent; the lean client decompresses the first
  answer and compares the later ones, still compressed, with it, and prints what a client's
  gunzip of one answer costs beside the figures);
- task submissions per second: `POST /api/v1/tasks` by `--clients` concurrent clients (goal:
  >= 200/s), beside `bus.publish(TaskSubmitted)` as `spz launch` does on the embedded bus.

The log does not move while the listings are measured, so after the first request of a position
they are answered from what the status service and the API server keep per position
(services/status/answers.py, services/api/listing.py); a new position costs one status read.
The load average is printed with the figures (they are this machine's, at that load).

    python bench/api.py [--clusters 1000] [--clients 50] [--members 50] [--requests 1000] [--tasks 2000]

Nothing else runs (no optimizer): submissions are stored and folded, not placed. The figures are
this machine's; the goals are printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

import httpx

from skypurza.events import status_queries
from skypurza.events.bus import Bus
from skypurza.events.models import ClusterProvisioned, PlacementChosen, TaskSubmitted
from skypurza.events.natsserver import NatsServer, free_port
from skypurza.events.types import Candidate, NodeInfo

STAGE = "bench"
GOAL_P50_MS = 25.0
GOAL_SUBMITS_PER_S = 200.0
TASK = "name: bench\nrun: python train.py\nresources:\n  cpus: 2\n"


def _candidate() -> Candidate:
    return Candidate(infra="aws", region="us-east-1", zone="us-east-1a", instance_type="m6i.large",
                     accelerators=None, use_spot=False, vcpus=2, memory_gib=8, hourly_price_micros=96_000,
                     num_nodes=1)


def member(i: int) -> str:
    return f"u{i}"


async def seed_clusters(bus: Bus, n: int, members: int) -> int:
    """`n` clusters up, as the provisioner would have left them, owned by the members in turn;
    returns the last sequence."""
    events = []
    for i in range(n):
        task_id, name, user = f"seed-{i}", f"c{i:05d}", member(i % members)
        events.append(bus.envelope(TaskSubmitted(task_id=task_id, cluster=name, task={"run": "true"},
                                                 user=user, team="ml")))
        placed = bus.envelope(PlacementChosen(task_id=task_id, cluster=name, attempt=1, candidate=_candidate(),
                                              num_nodes=1))
        events.append(placed)
        events.append(bus.envelope(ClusterProvisioned(
            cluster=name, task_id=task_id, placement_id=placed.id, candidate=_candidate(),
            nodes=[NodeInfo(rank=0, instance_id=f"i-{i:08x}", private_ip="10.0.0.1")],
            hourly_price_micros=96_000, launched_at=placed.time, user=user, team="ml")))
    for start in range(0, len(events), 3000):
        await bus.publish_many(events[start:start + 3000])
    return await bus.last_seq()


async def tokens(bus: Bus, members: int) -> tuple[str, list[str]]:
    """The admin's token, and each member's."""
    from skypurza.services.api.directory_io import add_team, add_user

    await add_team(bus, "ml", [], {})
    admin = (await add_user(bus, "bench", "ml", "admin")).token
    return admin, [(await add_user(bus, member(k), "ml", "member")).token for k in range(members)]


def owned(clusters: int, members: int, k: int) -> int:
    """How many of the seeded clusters member k owns."""
    return len(range(k, clusters, members))


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


async def _wait_http(url: str, token: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as c:
        while True:
            try:
                res = await c.get(f"{url}/api/v1/health", headers={"Authorization": f"Bearer {token}"})
                if res.status_code == 200 and res.json().get("caller"):
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the API server at {url} did not come up")
            await asyncio.sleep(0.2)


async def _wait_status(bus: Bus, seq: int, n: int) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            rows = await status_queries.status(bus, min_seq=seq, timeout=10)
            if len(rows) >= n:
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the status service did not catch up with the seeded clusters")
        await asyncio.sleep(0.5)


def _pcts(samples: list[float]) -> tuple[float, float]:
    qs = statistics.quantiles(samples, n=100, method="inclusive")
    return qs[49] * 1000, qs[98] * 1000


async def _concurrently(clients: int, total: int, one) -> tuple[list[float], float]:
    """`total` calls of `one(client)` spread over `clients` workers: each call's seconds, the wall time."""
    times: list[float] = []
    left = iter(range(total))

    async def worker(k: int) -> None:
        for _ in left:
            t = time.perf_counter()
            await one(k)
            times.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    return times, time.perf_counter() - t0


class _Received(asyncio.BufferedProtocol):
    """One response at a time, read by the kernel straight into one buffer (no chunk copies):
    the head, then a body of its Content-Length. The buffer is kept from one response to the next
    and only grows: a fresh 0.8 MB buffer per response costs the client ~200 page faults, CPU the
    server's measurement would be charged with on a machine the two share."""

    def __init__(self) -> None:
        self.buf = bytearray(1 << 16)
        self.n = 0
        self.head_end = self.length = -1
        self.done: asyncio.Future[None] | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        # (grown here, not in buffer_updated: the loop still holds the last view then)
        want = self.head_end + self.length if self.head_end >= 0 else 0
        if self.n == len(self.buf):  # (a head longer than the buffer so far)
            want = max(want, 2 * len(self.buf))
        if len(self.buf) < want:
            self.buf.extend(bytes(want - len(self.buf)))
        return memoryview(self.buf)[self.n:]

    def buffer_updated(self, nbytes: int) -> None:
        self.n += nbytes
        if self.head_end < 0 and (end := self.buf.find(b"\r\n\r\n", 0, self.n)) >= 0:
            self.head_end, self.length = end + 4, 0
            for line in bytes(self.buf[:end]).split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    self.length = int(line[15:])
        if self.head_end >= 0 and self.n >= self.head_end + self.length and self.done and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done and not self.done.done():
            self.done.set_exception(exc or ConnectionError("the server closed the connection"))


class LeanClient:
    """One keep-alive HTTP/1.1 connection, as little Python per request as a client can be: the
    load generator shares this machine's cores with the server, and httpx's own cost per request
    (about 1.5 ms of CPU here, more than the server's) would be measured as the server's latency;
    so would asyncio streams' copies of a 0.8 MB body (about 0.6 ms: the kernel here reads it
    into one buffer). (`--client httpx` measures with httpx.) Bodies come with Content-Length, as
    the server sends. With `gzip` it asks for a compressed body (Accept-Encoding, as httpx and
    browsers do); `get` hands back that body as it came, and `gunzipped` says whether it is."""

    def __init__(self, url: str, token: str, gzip: bool = False) -> None:
        hostport = url.split("://", 1)[1]
        self.host, _, port = hostport.partition(":")
        self.port = int(port)
        self.auth = f"Authorization: Bearer {token}\r\n".encode() + (b"Accept-Encoding: gzip\r\n" if gzip else b"")
        self.conn: tuple[asyncio.Transport, _Received] | None = None
        self.gunzipped = False  # the last body was sent compressed (gzip)

    async def send(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.conn is None or self.conn[0].is_closing():  # (the server closes an idle keep-alive: 5 s)
            transport, got = await asyncio.get_running_loop().create_connection(_Received, self.host, self.port)
            self.conn = (transport, got)  # type: ignore[assignment]
        transport, got = self.conn  # type: ignore[misc]
        got.n, got.head_end, got.length = 0, -1, -1
        got.done = asyncio.get_running_loop().create_future()
        extra = (b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
                 if body else b"")
        transport.write(f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n".encode() + self.auth + extra + b"\r\n"
                        + body)
        await asyncio.wait_for(got.done, 60)
        head = bytes(got.buf[:got.head_end])
        content = bytes(memoryview(got.buf)[got.head_end:got.head_end + got.length])  # (the buffer is reused)
        self.gunzipped = any(line.lower().startswith(b"content-encoding:") and line[17:].strip().lower() == b"gzip"
                             for line in head.split(b"\r\n"))
        return int(head[9:12]), content

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self.send("GET", path)

    async def post(self, path: str, payload: dict) -> tuple[int, bytes]:
        return await self.send("POST", path, json.dumps(payload).encode())

    async def aclose(self) -> None:
        if self.conn is not None:
            self.conn[0].close()


class HttpxClient:
    def __init__(self, url: str, token: str, gzip: bool = False) -> None:
        self.gunzipped = False  # (httpx decompresses)
        self.c = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}",
                                                          "Accept-Encoding": "gzip" if gzip else "identity"}, timeout=60)

    async def get(self, path: str) -> tuple[int, bytes]:
        res = await self.c.get(path)
        return res.status_code, res.content

    async def post(self, path: str, payload: dict) -> tuple[int, bytes]:
        res = await self.c.post(path, json=payload)
        return res.status_code, res.content

    async def aclose(self) -> None:
        await self.c.aclose()


def _cpu_s(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) each process has used, this one as "client"."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            out[name] = float("nan")
    out["client"] = time.process_time()
    return out


async def bench_http(url: str, token: str, members: list[str], clients: int, requests: int, tasks: int,
                     clusters: int, client_kind: str = "lean", pids: dict[str, int] | None = None) -> dict:
    kind = LeanClient if client_kind == "lean" else HttpxClient
    pool = [kind(url, token) for _ in range(clients)]
    packed = [kind(url, token, gzip=True) for _ in range(clients)]
    mine = [kind(url, members[k % len(members)]) for k in range(clients)]
    out: dict = {}
    try:
        # (checked without parsing: the clients share this process's one core with each other)
        async def own(k: int) -> None:
            status, body = await mine[k].get("/api/v1/clusters")
            want = owned(clusters, len(members), k % len(members))
            if status != 200 or body.count(b'"name":') != want:
                raise SystemExit(f"a member's GET /api/v1/clusters: {status} {body[:200]!r}")

        # Every cluster's answer is counted once; the log does not move, so each later answer must be
        # that one, byte for byte (a compare is ~30 us where counting 0.8 MB again is ~460 us, and a
        # gunzip ~500 us, of the client's CPU, which this machine's server would be measured with).
        checked: dict[bool, bytes] = {}  # gzip sent? -> the answer as it came

        def whole(client, status: int, body: bytes, what: str) -> None:
            gz = client.gunzipped
            if status == 200 and body == checked.get(gz):
                return
            text = zlib.decompress(body, 31) if gz else body
            if status != 200 or text.count(b'"name":') < clusters:
                raise SystemExit(f"{what}: {status} {text[:200]!r}")
            if gz in checked:
                raise SystemExit(f"{what}: a different answer while the log did not move")
            checked[gz] = body

        async def every(k: int) -> None:
            status, body = await pool[k].get("/api/v1/clusters?all_users=true")
            whole(pool[k], status, body, "GET /api/v1/clusters")

        async def every_gzip(k: int) -> None:
            status, body = await packed[k].get("/api/v1/clusters?all_users=true")
            whole(packed[k], status, body, "GET /api/v1/clusters (gzip)")

        for row, listing in (("member", own), ("admin", every), ("admin_gzip", every_gzip)):
            await _concurrently(clients, clients, listing)  # warm: connections, the first read of the position
            before = _cpu_s(pids or {})
            lat, _ = await _concurrently(clients, requests, listing)
            after = _cpu_s(pids or {})
            out[row] = _pcts(lat)
            out[row + "_cpu"] = {k: (after[k] - before[k]) * 1000 / requests for k in after}
        if True in checked:  # what a client that decompresses adds to each gzip answer
            t = time.process_time()
            for _ in range(20):
                zlib.decompress(checked[True], 31)
            out["gunzip_ms"] = (time.process_time() - t) * 1000 / 20

        async def submit(k: int) -> None:
            status, body = await pool[k].post("/api/v1/tasks", {"task": TASK, "cluster": f"s-{uuid.uuid4().hex[:10]}"})
            if status != 202:
                raise SystemExit(f"POST /api/v1/tasks: {status} {body[:200]!r}")

        _, wall = await _concurrently(clients, tasks, submit)
    finally:
        for c in pool + packed + mine:
            await c.aclose()
    return {**_figures(out), "submits_per_s": tasks / wall,
            "cpu_ms": {row: out[row + "_cpu"] for row in ("member", "admin", "admin_gzip")},
            "gunzip_ms": out.get("gunzip_ms")}


def _figures(rows: dict) -> dict:
    (m50, m99), (a50, a99) = rows["member"], rows["admin"]
    out = {"member_p50_ms": m50, "member_p99_ms": m99, "p50_ms": a50, "p99_ms": a99}
    if "admin_gzip" in rows:
        out["gzip_p50_ms"], out["gzip_p99_ms"] = rows["admin_gzip"]
    return out


async def bench_embedded(bus: Bus, members: int, clients: int, requests: int, tasks: int, clusters: int) -> dict:
    async def own(k: int) -> None:
        seq = await bus.last_seq()  # as the CLI and the server ask: caught up with the log
        rows = await status_queries.status(bus, user=member(k % members), min_seq=seq, timeout=30)
        if len(rows) != owned(clusters, members, k % members):
            raise SystemExit(f"status of one user: {len(rows)} rows")

    async def every(k: int) -> None:
        seq = await bus.last_seq()
        rows = await status_queries.status(bus, min_seq=seq, timeout=30)
        if len(rows) < clusters:
            raise SystemExit(f"status: {len(rows)} rows")

    out = {}
    for row, listing in (("member", own), ("admin", every)):
        await _concurrently(clients, clients, listing)
        lat, _ = await _concurrently(clients, requests, listing)
        out[row] = _pcts(lat)

    async def submit(k: int) -> None:
        name = f"e-{uuid.uuid4().hex[:10]}"
        await bus.publish(TaskSubmitted(task_id=str(uuid.uuid4()), cluster=name, task={"run": "python train.py"},
                                        user="bench", team="ml"))

    _, wall = await _concurrently(clients, tasks, submit)
    return {**_figures(out), "submits_per_s": tasks / wall}


async def run(args: argparse.Namespace, work: Path) -> dict:
    server = NatsServer(work / "js", free_port()).start()
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "SKYPURZA_NO_PLUGINS": "1"}
    try:
        bus = await Bus.connect(server.url, STAGE, source="/bench/api")
        try:
            token, members = await tokens(bus, args.members)
            seq = await seed_clusters(bus, args.clusters, args.members)
            procs.append(_spawn(["skypurza.services.status.service", "--nats", server.url, "--stage", STAGE,
                                 "--db", str(work / "status.duckdb")], work / "status.log", env))
            await _wait_status(bus, seq, args.clusters)
            port = free_port()
            procs.append(_spawn(["skypurza.services.api", "--nats", server.url, "--stage", STAGE, "--host",
                                 "127.0.0.1", "--port", str(port), "--log-level", "warning"], work / "api.log", env))
            url = f"http://127.0.0.1:{port}"
            await _wait_http(url, token)
            pids = {"api server": procs[1].pid, "status": procs[0].pid, "nats": server.process.pid}
            http = await bench_http(url, token, members, args.clients, args.requests, args.tasks, args.clusters,
                                    getattr(args, "client", "lean"), pids)
            load = os.getloadavg()
            embedded = await bench_embedded(bus, args.members, args.clients, args.requests, args.tasks, args.clusters)
            load = tuple(max(a, b) for a, b in zip(load, os.getloadavg()))
        finally:
            await bus.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        server.stop()
    return {"http": http, "embedded": embedded, "load": load}


def report(res: dict, args: argparse.Namespace) -> str:
    h, e = res["http"], res["embedded"]
    ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
    load = res.get("load") or os.getloadavg()
    w = 46
    lines = [
        f"API server bench: {args.clients} concurrent clients, {args.clusters:,} clusters known, "
        f"{args.members} members; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        f"({os.cpu_count()} CPUs); {getattr(args, 'client', 'lean')} HTTP client",
        f"{'':{w}}{'API server':>12}{'embedded bus':>14}{'goal':>10}",
    ]
    for label, key, ekey in (("a member's GET /api/v1/clusters", "member_p", "member_p"),
                             ("admin, all users (~0.8 MB at 1,000)", "p", "p"),
                             ("admin, all users, gzip (~30 kB)", "gzip_p", "p")):  # the bus has no gzip
        lines += [
            f"{label + ' p50 (ms)':{w}}{h[key + '50_ms']:>12.1f}{e[ekey + '50_ms']:>14.1f}{'<= 25':>10}  "
            f"{ok(h[key + '50_ms'] <= GOAL_P50_MS)}",
            f"{label + ' p99 (ms)':{w}}{h[key + '99_ms']:>12.1f}{e[ekey + '99_ms']:>14.1f}",
        ]
    lines.append(f"{'task submissions per second':{w}}{h['submits_per_s']:>12.0f}{e['submits_per_s']:>14.0f}"
                 f"{'>= 200':>10}  {ok(h['submits_per_s'] >= GOAL_SUBMITS_PER_S)}")
    if h.get("gunzip_ms") is not None:
        lines.append(f"the gzip answers are compared as they came; a client's gunzip of one costs "
                     f"{h['gunzip_ms']:.2f} ms of CPU more")
    if h.get("cpu_ms"):
        lines.append("CPU ms per request (user + system), by process: "
                     + "; ".join(f"{row}: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
                                 for row, cpu in h["cpu_ms"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clusters", type=int, default=1000)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--members", type=int, default=50, help="members of the team, owning the clusters in turn")
    p.add_argument("--client", choices=("lean", "httpx"), default="lean",
                   help="the HTTP client of the load (lean: one keep-alive connection per client, little Python)")
    p.add_argument("--requests", type=int, default=1000, help="GET /api/v1/clusters requests in all")
    p.add_argument("--tasks", type=int, default=2000, help="submissions in all")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="spz-bench-api-") as d:
        res = asyncio.run(run(args, Path(d)))
    print(report(res, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
