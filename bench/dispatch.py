"""Dispatch benchmark: 10,000 pending tasks from 100 teams and 1,000 users under a policy with
quotas and Slurm's multifactor priority (fairshare over decayed usage, age, job size).

Prints:
- submissions decided per second, in process, through the service's own fold and reactions
  (each submission folded and decided; goal >= 5,000/s), and the TaskHeld events they caused
  (one per held task: a hold's reason is not re-said on every later submission);
- one whole pass over the 10,000 pending (a job's end frees quota: every task re-decided in
  priority order), its time and decisions per second;
- TaskSubmitted -> TaskAdmitted through a real nats-server and the dispatch service with an
  empty queue, p50 and p99 (goal p50 <= 5 ms);
- memory: the fold's peak (tracemalloc, in a second, untimed run) with 10,000 pending;
- `spz dispatch queue`'s read with a long log (100 pending, --usage UsageRecorded): the fold of
  the log (the old path, still the answer without a dispatch service) beside the dispatch
  service's `queue` query (events/dispatch_queries.py), same run, median wall and CPU seconds
  and the messages each reads (`--reads-only`: this row alone).

    python bench/dispatch.py [--pending 10000] [--teams 100] [--users 1000] [--samples 300] [--usage 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.dispatch_events import DispatchPolicyApplied, TaskAdmitted, TaskHeld
from skypurza.events.dispatch_policy import DispatchPolicy
from skypurza.events.models import JobQueued, JobSucceeded, TaskSubmitted, UsageRecorded
from skypurza.events.natsserver import NatsServer, free_port
from skypurza.events.service import ServiceRunner
from skypurza.services.dispatch.service import DispatchService

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=timezone.utc)
TASK = {"resources": {"cpus": 2, "infra": "local"}, "run": "true"}


def policy(teams: int, users_per_team: int, nominal: float) -> DispatchPolicy:
    return DispatchPolicy.model_validate({
        "flavors": [{"name": "local", "infra": "local"}],
        "cohorts": [{"name": "org"}],
        "queues": [{"name": f"q{t}", "team": f"team{t}", "cohort": "org",
                    "quotas": [{"flavor": "local", "resources": {"cpu": {"nominal": nominal}}}]} for t in range(teams)],
        "priority": {"weights": {"age": 1000, "fairshare": 10000, "jobsize": 500},
                     "shares": [{"team": f"team{t}", "shares": 1 + t % 5,
                                 "users": {f"u{t}-{u}": 1 + u % 3 for u in range(users_per_team)}}
                                for t in range(teams)]},
    })


class Log:
    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, ev, at: datetime = NOW) -> Stored:
        self.seq += 1
        return Stored(self.seq, "s", at, None, ev, "ok")


class Clock:
    def now(self) -> datetime:
        return NOW


def in_process(pending: int, teams: int, users: int, trace: bool = False) -> dict[str, float]:
    """The timed run (trace=False), or the same run under tracemalloc for its memory (which
    slows every allocation: its times are not reported)."""
    per_team = max(1, users // teams)
    svc = DispatchService(clock=Clock())  # type: ignore[arg-type]
    log = Log()
    st = svc.state
    if trace:
        tracemalloc.start()
    st.apply(log(DispatchPolicyApplied(policy=policy(teams, per_team, nominal=4))))
    svc.react()
    for i in range(users):  # a day of usage for every user
        t, u = i % teams, (i // teams) % per_team
        st.apply(log(UsageRecorded(cluster=f"old{i}", rank=0, instance_id="i", start=NOW - timedelta(hours=24),
                                   end=NOW - timedelta(hours=1), hourly_price_micros=1, cost_micros=1,
                                   billing=1.0 + i % 7, user=f"u{t}-{u}", team=f"team{t}")))
    svc.react()
    submitted = [log(TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}", task=TASK, user=f"u{i % teams}-{(i // teams) % per_team}",
                                   team=f"team{i % teams}"), NOW - timedelta(seconds=pending - i))
                 for i in range(pending)]
    held = admitted = 0
    t0 = time.perf_counter()
    for s in submitted:
        st.apply(s)
        for e in svc.react():
            if isinstance(e.event, TaskHeld):
                held += 1
            elif isinstance(e.event, TaskAdmitted):
                admitted += 1
    submit_s = time.perf_counter() - t0
    peak = 0
    if trace:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    # A job of an admitted task ends: its quota frees, every pending task is decided again.
    first = next(iter(st.admitted))
    st.apply(log(JobQueued(cluster=st.cluster_of[first], job_id=1, task_id=first, task=TASK)))
    st.apply(log(JobSucceeded(cluster=st.cluster_of[first], job_id=1, ended_at=NOW)))
    n_pending = len(st.pending)
    t0 = time.perf_counter()
    out = svc.react()
    pass_s = time.perf_counter() - t0
    return {"submissions": pending, "submit_s": submit_s, "per_s": pending / submit_s, "held_events": held,
            "admitted": admitted, "pass_pending": n_pending, "pass_s": pass_s, "pass_per_s": n_pending / pass_s,
            "pass_events": len(out), "peak_mib": peak / 2**20}


async def through_bus(samples: int, teams: int, users: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        server = NatsServer(Path(d) / "js", free_port()).start()
        try:
            bus = await Bus.connect(server.url, "bench", source="/bench")
            await bus.publish(DispatchPolicyApplied(policy=policy(teams, max(1, users // teams), nominal=1e6)))
            runner = ServiceRunner(bus, DispatchService())
            job = asyncio.create_task(runner.run())
            arrived: dict[str, float] = {}
            waiting: dict[str, asyncio.Event] = {}

            async def seen(msg) -> None:
                tid = msg.subject.split(".")[-2]
                arrived[tid] = time.perf_counter()
                if tid in waiting:
                    waiting[tid].set()

            await bus.nc.subscribe(naming.event_filter("bench", "task", "task_admitted"), cb=seen)
            await asyncio.sleep(0.5)
            lat = []
            for i in range(samples):
                tid = f"lat{i}"
                waiting[tid] = asyncio.Event()
                t0 = time.perf_counter()
                await bus.publish(TaskSubmitted(task_id=tid, cluster=f"lc{i}", task=TASK, user="u0-0", team="team0"))
                await asyncio.wait_for(waiting[tid].wait(), 30)
                lat.append(arrived[tid] - t0)
            runner.stop()
            await job
            await bus.close()
            q = statistics.quantiles(lat, n=100)
            return statistics.median(lat), q[98]
        finally:
            server.stop()


async def queue_read(usage: int, rounds: int = 5) -> dict[str, float]:
    """`spz dispatch queue`'s read, the fold against the service's answer, on one log."""
    from skypurza.services.dispatch import ask, reads
    from skypurza.services.dispatch.service import load_state

    with tempfile.TemporaryDirectory() as d:
        server = NatsServer(Path(d) / "js", free_port()).start()
        try:
            bus = await Bus.connect(server.url, "bench", source="/bench")
            await bus.publish(DispatchPolicyApplied(policy=policy(10, 10, nominal=0)))
            await bus.publish_many([TaskSubmitted(task_id=f"p{i}", cluster=f"pc{i}", task=TASK, user=f"u{i % 10}-0",
                                                  team=f"team{i % 10}") for i in range(100)])
            t = datetime.now(timezone.utc) - timedelta(hours=1)
            for lo in range(0, usage, 5000):
                await bus.publish_many([UsageRecorded(cluster="old", rank=0, instance_id="i-1",
                                                      start=t + timedelta(milliseconds=i),
                                                      end=t + timedelta(milliseconds=i + 1), hourly_price_micros=1,
                                                      cost_micros=1, billing=1.0, user="u0-0", team="team0")
                                        for i in range(lo, min(usage, lo + 5000))])
            service = DispatchService()
            runner = ServiceRunner(bus, service)
            job = asyncio.create_task(runner.run())
            while await ask.from_service(bus, "queue") is None:
                await asyncio.sleep(0.05)

            async def timed(read) -> tuple[float, float, dict]:
                walls, cpus = [], []
                for _ in range(rounds):
                    w, c = time.perf_counter(), time.process_time()
                    got = await read()
                    walls.append(time.perf_counter() - w)
                    cpus.append(time.process_time() - c)
                return statistics.median(walls), statistics.median(cpus), got

            async def fold() -> dict:
                return reads.view(await load_state(bus), "queue", datetime.now(timezone.utc))

            fold_wall, fold_cpu, a = await timed(fold)
            ask_wall, ask_cpu, b = await timed(lambda: ask.read(bus, "queue"))
            assert [p["task_id"] for p in a["pending"]] == [p["task_id"] for p in b["pending"]]
            n_fold = 0
            async for _ in bus.replay_raw(filter_subjects=[naming.event_filter("bench", c.AGGREGATE, c.EVENT_NAME)
                                                           for c in (UsageRecorded, TaskSubmitted, DispatchPolicyApplied,
                                                                     TaskHeld)]):
                n_fold += 1
            runner.stop()
            await job
            await service.close()
            await bus.close()
            return {"fold_wall": fold_wall, "fold_cpu": fold_cpu, "ask_wall": ask_wall, "ask_cpu": ask_cpu,
                    "fold_msgs": n_fold, "pending": len(b["pending"])}
        finally:
            server.stop()


def print_queue_read(usage: int) -> None:
    import os

    r = asyncio.run(queue_read(usage))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"`spz dispatch queue` read, {r['pending']:.0f} pending, {usage:,} UsageRecorded in the log (load {load}): "
          f"fold of the log (old path; {r['fold_msgs']:,.0f} messages) {r['fold_wall'] * 1000:.0f} ms wall / "
          f"{r['fold_cpu'] * 1000:.0f} ms CPU; the dispatch service's answer (0 messages replayed) "
          f"{r['ask_wall'] * 1000:.1f} ms wall / {r['ask_cpu'] * 1000:.1f} ms CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--teams", type=int, default=100)
    ap.add_argument("--users", type=int, default=1_000)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--usage", type=int, default=50_000, help="UsageRecorded in the log for the queue-read row")
    ap.add_argument("--reads-only", action="store_true", help="only the `spz dispatch queue` read row")
    a = ap.parse_args()
    if a.reads_only:
        print_queue_read(a.usage)
        return
    r = in_process(a.pending, a.teams, a.users)
    r["peak_mib"] = in_process(a.pending, a.teams, a.users, trace=True)["peak_mib"]
    print(f"submissions: {r['submissions']:,} decided in {r['submit_s']:.2f} s = {r['per_s']:,.0f}/s "
          f"(goal >= 5,000/s); {r['admitted']:,} admitted, {r['held_events']:,} TaskHeld")
    print(f"whole pass over {r['pass_pending']:,} pending (a job ended): {r['pass_s'] * 1000:.0f} ms = "
          f"{r['pass_per_s']:,.0f} decisions/s, {r['pass_events']} events")
    print(f"memory: fold peak {r['peak_mib']:.1f} MiB with {r['pass_pending']:,} pending")
    p50, p99 = asyncio.run(through_bus(a.samples, a.teams, a.users))
    print(f"TaskSubmitted -> TaskAdmitted, empty queue, real nats-server: p50 {p50 * 1000:.2f} ms, "
          f"p99 {p99 * 1000:.2f} ms (goal p50 <= 5 ms)")
    print_queue_read(a.usage)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
