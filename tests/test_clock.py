"""Time is injected (events/clock.py): decisions are taken at the instant a test sets, never by
sleeping, and no decider reads the clock itself.

- the ManualClock moves only when told, both readings together, never back;
- recovery (the real service on a real bus, the other services played): a node's heartbeat
  silence is judged at the clock's instant — 29 s silent is alive, 31 s is lost — and the
  transition it causes carries the clock's time;
- the node agent (in this process, on a real bus): autostop's ClusterIdle comes when the clock
  passes the interval, not a second before, and its times are the clock's;
- the provisioner (real service, real bus): the ClusterTerminated it answers a down with is
  stamped by its clock, event and envelope;
- the source scan: decider modules (and the pure functions of mixed modules) read no clock at
  all; every other module of events/ and services/ reads the system clock only where an I/O
  wait or a stamp of storage is named below, with why.
"""

from __future__ import annotations

import ast
import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from managed_fixtures import STAGE, Stand, events_of, recovery, statuses, until, wait_status
from nats_fixtures import connect_bus
from provisioner_fixtures import SETTINGS, running, subject, wait_for

from skypurza.events import naming
from skypurza.events.agentspec import AgentSpec
from skypurza.events.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock
from skypurza.events.models import (
    Candidate,
    ClusterIdle,
    ClusterProvisioned,
    ClusterTerminated,
    DownRequested,
    NodeInfo,
    NodeLost,
)
from skypurza.services.agent.agent import Agent
from skypurza.services.provisioner.service import ProvisionerService
from skypurza.services.recovery.service import RecoveryService
from skypurza.services.recovery.settings import RecoverySettings
from skypurza.services.recovery.submit import submit_managed_job

ROOT = Path(__file__).resolve().parents[1]
T0 = ManualClock().now()


# ---------------------------------------------------------------------- the clock itself

def test_the_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(T0, monotonic=50.0)
    assert isinstance(clock, Clock) and isinstance(SYSTEM_CLOCK, Clock) and isinstance(SYSTEM_CLOCK, SystemClock)
    assert clock.now() == T0 and clock.monotonic() == 50.0
    assert clock.now() == T0, "reading it does not move it"
    assert clock.advance(90) == T0 + timedelta(seconds=90) and clock.monotonic() == 140.0
    assert clock.set(T0 + timedelta(hours=1)) == T0 + timedelta(hours=1) and clock.monotonic() == 3650.0
    with pytest.raises(ValueError, match="does not go back"):
        clock.set(T0)
    assert SYSTEM_CLOCK.now().tzinfo is not None  # aware UTC, like every time an event carries


# ---------------------------------------------------------------------- recovery: heartbeats

def test_recovery_judges_heartbeat_silence_at_the_clocks_instant(nats_server, spz_home) -> None:
    clock = ManualClock(T0)
    settings = RecoverySettings(ec2_poll_s=0, heartbeat_timeout_s=30, reconcile_s=3600)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        stand = await Stand(bus, default="hold").start()
        svc = RecoveryService(settings, bucket_store="dir", clock=clock)
        async with recovery(bus, svc):
            await submit_managed_job(bus, name="hb", tasks=[{"run": "x"}], clock=clock)
            running_ = await wait_status(bus, 1, "RUNNING")
            cluster = running_[-1].cluster
            assert cluster
            await bus.nc.publish(naming.heartbeat_subject(STAGE, cluster, 0), b"{}")
            await bus.nc.flush()
            assert svc._heartbeats is not None
            await until(lambda: (cluster, 0) in svc._heartbeats.heard(), what="the beat heard")

            lost_subject = naming.event_subject(STAGE, "cluster", cluster, NodeLost.EVENT_NAME)
            clock.advance(29)
            assert await svc.check_heartbeats() == []
            assert await events_of(bus, lost_subject) == [], "29 s of silence, timeout 30: alive"

            clock.advance(2)
            judged_at = clock.now()
            await svc.check_heartbeats()  # (the service's own loop may have got there first)
            lost = await events_of(bus, lost_subject)
            assert len(lost) == 1 and lost[0].evidence["silent_s"] == 31.0
            assert lost[0].detected_at == judged_at and lost[0].last_heartbeat == judged_at - timedelta(seconds=31)

            got = await wait_status(bus, 1, "RECOVERING")
            assert "no heartbeat for 31.0 s" in got[-1].reason
            subject_ = naming.event_subject(STAGE, "mjob", "1", "managed_job_status_changed")
            stamped = [s.envelope.time async for s in bus.replay(filter_subject=subject_)]
            # Every transition is stamped by the service's clock, never the machine's.
            assert stamped and all(t == T0 or t == judged_at for t in stamped)
            assert [e.status for e in await statuses(bus, 1)][:3] == ["STARTING", "RUNNING", "RECOVERING"]
        await stand.stop()
        await bus.close()

    asyncio.run(main())


# ---------------------------------------------------------------------- the agent: autostop

def test_the_agent_decides_autostop_at_the_clocks_instant(nats_server, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    cluster = "idler"

    async def main() -> None:
        bus = await connect_bus(nats_server)
        spec = AgentSpec(nats_url=nats_server.url, stage=STAGE, cluster=cluster, rank=0, num_nodes=1,
                         node_ips=("127.0.0.1",), instance_id="i-idler", home=str(tmp_path / "node0"))
        agent = Agent(spec, heartbeat_s=60, tick_s=0.02, clock=clock, detect_gpu=False)
        provisioned = ClusterProvisioned(
            cluster=cluster, task_id="t-idler", placement_id="p-idler", candidate=Candidate(infra="local"),
            nodes=[NodeInfo(rank=0, instance_id="i-idler")], hourly_price_micros=0, launched_at=T0,
            idle_minutes=5)
        await bus.publish(bus.envelope(provisioned, time=clock.now()))  # up at T0: idle since T0
        run = asyncio.create_task(agent.run())
        idle_subject = naming.event_subject(STAGE, "cluster", cluster, ClusterIdle.EVENT_NAME)
        try:
            await until(lambda: agent.view.provisioned is not None, what="the agent read its cluster")
            clock.advance(5 * 60 - 1)
            await asyncio.sleep(0.3)  # ~15 ticks of the agent at 4 min 59 s
            assert await bus.last_event(idle_subject) is None, "idle for 4 min 59 s of 5: not yet"

            clock.advance(2)
            await until(lambda: bus.last_event(idle_subject), what="ClusterIdle once the interval passed")
            idle = await bus.last_event(idle_subject)
            assert isinstance(idle.event, ClusterIdle)
            assert idle.event.idle_since == T0 and idle.event.idle_minutes == 5
            assert idle.envelope.time == T0 + timedelta(seconds=5 * 60 + 1), "stamped by the agent's clock"
        finally:
            await bus.publish(ClusterTerminated(cluster=cluster, terminated_at=clock.now()))
            await asyncio.wait_for(run, 20)
            await bus.close()

    asyncio.run(main())


# ---------------------------------------------------------------------- the provisioner

def test_the_provisioner_stamps_what_it_decides_with_its_clock(nats_server, spz_home) -> None:
    clock = ManualClock(T0 + timedelta(days=3))

    async def main() -> None:
        bus = await connect_bus(nats_server)
        svc = ProvisionerService(replace(SETTINGS, cleanup_interval_s=0), backends={}, clock=clock)
        async with running(bus, svc):
            # A down of a cluster never up (a launch in flight) ends it at once.
            await bus.publish(DownRequested(cluster="never-up", reason="user"))
            ended = await wait_for(bus, subject("cluster", "never-up", ClusterTerminated.EVENT_NAME))
        assert isinstance(ended.event, ClusterTerminated)
        assert ended.event.terminated_at == clock.now() and ended.envelope.time == clock.now()
        await bus.close()

    asyncio.run(main())


# ---------------------------------------------------------------------- the source scan

# Whole modules that decide: they take `now` as an argument and read no clock of any kind.
DECIDER_MODULES = (
    "events/fold.py",
    "services/optimizer/decide.py",
    "services/optimizer/placement.py",
    "services/provisioner/plan.py",
    "services/recovery/machine.py",
    "services/recovery/detect.py",
    "services/recovery/strategy.py",
    "services/agent/decide.py",
    "services/agent/view.py",
    "services/agent/packing.py",
    "events/jobdemand.py",
    "services/ledger/meter.py",
    "services/ledger/billing.py",
    "cli/launchplan.py",
)
# The pure functions of modules that also do I/O.
DECIDER_FUNCTIONS = {
    "services/recovery/reconcile.py": ("due",),
    "services/provisioner/cleanup.py": ("attempts_by_key", "skip_keys", "failure_event"),
    "services/provisioner/reconcile.py": ("old_enough", "ended_clusters", "expected_nodes"),
}
# Where events/ and services/ may read the system clock directly, and why (events/clock.py says
# the same): I/O waits and stamps of storage, never a decision a test or a replay must reproduce.
SYSTEM_TIME_ALLOWED = {
    "events/clock.py": "the system clock itself",
    "events/envelope.py": "an envelope built with no time given (the bus's own publishes)",
    "events/bus.py": "the reconnect grace of a lost connection; a log chunk's stamp",
    "events/natsserver.py": "waiting for nats-server to listen",
    "events/deadletters.py": "a dead letter's parked_at",
    "events/service.py": "the stand-in timestamp of a message that cannot be read",
    "events/projection/replay.py": "measuring how long a replay took",
    "services/agent/procs.py": "a pid file's start time (compared with /proc); a kill's grace",
    "services/provisioner/aws.py": "a launch's and a stop's polling deadline",
    "services/provisioner/local.py": "the local 'cloud's' own node records; start and kill deadlines",
    "services/provisioner/slurm.py": "the allocation's record (like local's) and the sbatch-to-RUNNING deadline",
    "services/recovery/history.py": "the stand-in timestamp of an event that cannot be decoded",
    "services/optimizer/catalog/build.py": "the date a catalog was built",
    "services/optimizer/catalog/refresh.py": "the date of a price refresh and EC2's StartTime",
    "services/ledger/cli.py": "a command's default `--since` (the CLI edge)",
    "services/observability/top.py": "the moment a `spz top` frame is drawn (the terminal edge)",
    "services/api/routes_clusters.py": "a purge's terminated_at, stamped when the request arrives (the HTTP edge)",
    "services/api/routes_dispatch.py": "the moment a queue or budget answer is judged at (the HTTP edge)",
    "services/api/timetravel.py": "the upper bound of `at=` (no time after the request's own)",
    "services/provisioner/slurm_account.py": "the deadline of an sacct read over SSH",
}
_WALL = {("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today"),
         ("time", "time"), ("time", "time_ns"), ("time", "monotonic"), ("time", "monotonic_ns"),
         ("time", "perf_counter"), ("SYSTEM_CLOCK", "now"), ("SYSTEM_CLOCK", "monotonic")}
_ANY_CLOCK_METHODS = {"now", "utcnow", "today", "monotonic", "monotonic_ns", "time", "time_ns", "perf_counter"}


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def system_time_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Direct reads of the system clock: `datetime.now()`, `time.monotonic()`, `utcnow()`,
    `SYSTEM_CLOCK.now()` ... (an injected `self.clock.now()` is not one)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and (_name(f.value), f.attr) in _WALL:
            out.append((node.lineno, f"{_name(f.value)}.{f.attr}()"))
        elif isinstance(f, ast.Name) and f.id in ("utcnow", "monotonic", "perf_counter"):
            out.append((node.lineno, f"{f.id}()"))
    return out


def any_clock_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Any reading of any clock, injected or not, and any mention of the system clock or `time`."""
    out = system_time_reads(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _ANY_CLOCK_METHODS:
            out.append((node.lineno, f"….{node.func.attr}()"))
        elif isinstance(node, ast.Name) and node.id in ("SYSTEM_CLOCK", "utcnow"):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Import) and any(a.name == "time" for a in node.names):
            out.append((node.lineno, "import time"))
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "skypurza.events.clock") or (
                isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("clock")):
            out.append((node.lineno, f"from {node.module} import ..."))
    return sorted(set(out))


def _functions(tree: ast.AST, names: tuple[str, ...]) -> dict[str, ast.AST]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name in names}


def _parse(rel: str) -> ast.AST:
    return ast.parse((ROOT / rel).read_text(), rel)


def test_decider_modules_read_no_clock() -> None:
    bad = [f"{rel}:{line}: {what}" for rel in DECIDER_MODULES for line, what in any_clock_reads(_parse(rel))]
    for rel, names in DECIDER_FUNCTIONS.items():
        found = _functions(_parse(rel), names)
        assert set(found) == set(names), f"{rel}: {sorted(set(names) - set(found))} not found (renamed?)"
        bad += [f"{rel}:{line}: {what} in {fn}()" for fn, node in found.items() for line, what in any_clock_reads(node)]
    assert not bad, "a decider reads the clock itself; take `now` as an argument:\n" + "\n".join(bad)


def test_no_other_module_reads_the_system_clock_outside_the_named_io_places() -> None:
    bad, used = [], set()
    for top in ("events", "services"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            reads = system_time_reads(ast.parse(path.read_text(), rel))
            if reads and rel in SYSTEM_TIME_ALLOWED:
                used.add(rel)
            elif reads:
                bad += [f"{rel}:{line}: {what}" for line, what in reads]
    assert not bad, ("read the time from the injected clock (events/clock.py), or name the I/O place in "
                     "SYSTEM_TIME_ALLOWED with why:\n" + "\n".join(bad))
    assert used == set(SYSTEM_TIME_ALLOWED), f"allowed but reading no clock now: {set(SYSTEM_TIME_ALLOWED) - used}"


def test_the_scan_finds_planted_reads(tmp_path: Path) -> None:
    planted = ast.parse("import time\nfrom datetime import datetime\n"
                        "def f(clock):\n    a = datetime.now()\n    b = time.monotonic()\n    c = clock.now()\n")
    assert [w for _, w in system_time_reads(planted)] == ["datetime.now()", "time.monotonic()"]
    assert {w for _, w in any_clock_reads(planted)} >= {"import time", "….now()", "….monotonic()"}
    assert system_time_reads(ast.parse("def f(clock):\n    return clock.now()\n")) == []
