"""Helpers for recovery-service tests that play the other services by publishing their events.

`Stand` plays the optimizer, the provisioner and the agents of every cluster a managed launch
asks for: TaskSubmitted(kind="managed") -> ClusterProvisioned, JobQueued, JobStarted, and then
whatever the test scripts for that cluster (succeed at once by default, or hold); a
DownRequested of a provisioned cluster -> ClusterTerminated. It records what it saw, so tests
can count launches, blocks and teardowns. The recovery service under test is the real one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored, stored_from_msg
from skypurza.events.jobqueue import queue_job
from skypurza.events.models import (
    ClusterProvisioned,
    ClusterTerminated,
    DownRequested,
    JobFailed,
    JobStarted,
    JobSucceeded,
    ManagedJobStatusChanged,
    PlacementFailed,
    TaskSubmitted,
)
from skypurza.events.service import ServiceRunner
from skypurza.events.types import Candidate, NodeInfo
from skypurza.services.recovery.service import RecoveryService
from skypurza.services.recovery.settings import RecoverySettings

STAGE = "test"
FAST = RecoverySettings(ec2_poll_s=0, heartbeat_timeout_s=0, reconcile_s=0.5)


def now() -> datetime:
    return datetime.now(timezone.utc)


def spot(zone: str = "us-east-1a", region: str = "us-east-1") -> Candidate:
    return Candidate(infra="aws", region=region, zone=zone, instance_type="m5.large", use_spot=True,
                     hourly_price_micros=30_000, vcpus=2, memory_gib=8)


@dataclass
class Stand:
    bus: Bus
    # cluster -> "succeed" | "hold" | "fail:<code>" | "setup:<code>" | "noplace"
    script: dict[str, str] = field(default_factory=dict)
    default: str = "succeed"
    place: Callable[[TaskSubmitted], Candidate] = lambda ts: spot()
    submitted: list[TaskSubmitted] = field(default_factory=list)
    downs: list[str] = field(default_factory=list)
    provisioned: set[str] = field(default_factory=set)
    terminated: set[str] = field(default_factory=set)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> "Stand":
        start = await self.bus.last_seq() + 1
        self._task = asyncio.create_task(self._run(start))
        return self

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, start_seq: int) -> None:
        subject = naming.all_events_subject(self.bus.stage)
        async for msg in self.bus.follow(filter_subject=subject, start_seq=start_seq):
            stored = stored_from_msg(msg)
            try:
                if isinstance(stored.event, TaskSubmitted) and stored.event.kind == "managed":
                    await self._launch(stored, stored.event)
                elif isinstance(stored.event, DownRequested):
                    await self._down(stored.event)
            except Exception as exc:  # keep playing: a test failure shows as a timeout with this log
                print(f"stand: {type(exc).__name__}: {exc}")

    async def _launch(self, stored: Stored, ts: TaskSubmitted) -> None:
        self.submitted.append(ts)
        what = self.script.get(ts.cluster, self.default)
        if what == "noplace":
            await self.bus.publish(PlacementFailed(task_id=ts.task_id, cluster=ts.cluster, managed_job_id=ts.managed_job_id,
                                                   reason="every candidate was tried; attempts:\n1) x"))
            return
        cand = self.place(ts)
        await self.bus.publish(ClusterProvisioned(
            cluster=ts.cluster, task_id=ts.task_id, placement_id=stored.envelope.id, candidate=cand,
            nodes=[NodeInfo(rank=0, instance_id=f"i-{ts.cluster}", zone=cand.zone)], hourly_price_micros=1,
            launched_at=now(), managed_job_id=ts.managed_job_id))
        self.provisioned.add(ts.cluster)
        job, _ = await queue_job(self.bus, cluster=ts.cluster, task_id=ts.task_id, task=ts.task,
                                 managed_job_id=ts.managed_job_id, skypilot_task_id=ts.skypilot_task_id or "")
        await self.bus.publish(JobStarted(cluster=ts.cluster, job_id=job.job_id, started_at=now()))
        await self.bus.publish_log(ts.cluster, job.job_id, 0, f"hello from {ts.cluster} as {ts.skypilot_task_id}")
        await self.finish(ts.cluster, what, job.job_id)

    async def finish(self, cluster: str, what: str, job_id: int = 1) -> None:
        if what == "succeed":
            await self.bus.publish(JobSucceeded(cluster=cluster, job_id=job_id, ended_at=now()))
        elif what.startswith(("fail:", "setup:")):
            phase, code = what.split(":")
            await self.bus.publish(JobFailed(cluster=cluster, job_id=job_id, ended_at=now(),
                                             phase="setup" if phase == "setup" else "run", exit_code=int(code)))

    async def _down(self, ev: DownRequested) -> None:
        self.downs.append(ev.cluster)
        if ev.cluster in self.provisioned and ev.cluster not in self.terminated:
            self.terminated.add(ev.cluster)
            await self.bus.publish(ClusterTerminated(cluster=ev.cluster, terminated_at=now(), reason=ev.reason))


async def statuses(bus: Bus, job_id: int) -> list[ManagedJobStatusChanged]:
    subject = naming.event_subject(STAGE, "mjob", str(job_id), ManagedJobStatusChanged.EVENT_NAME)
    if await bus.last_event(subject) is None:
        return []
    return [s.event async for s in bus.replay(filter_subject=subject)]  # type: ignore[misc]


async def wait_status(bus: Bus, job_id: int, status: str, timeout: float = 15.0, count: int = 1
                      ) -> list[ManagedJobStatusChanged]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await statuses(bus, job_id)
        if sum(1 for e in got if e.status == status) >= count:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"job {job_id}: no {status} within {timeout} s; saw "
                                 f"{[(e.status, e.cluster, e.reason) for e in got]}")
        await asyncio.sleep(0.05)


async def events_of(bus: Bus, subject: str) -> list[Any]:
    if await bus.last_event(subject) is None:
        return []
    return [s.event async for s in bus.replay(filter_subject=subject)]


async def until(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = pred()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.05)


class Background:
    """The recovery service and a Stand on a loop of their own (for CLI tests, whose commands
    run their own event loops in the test's thread)."""

    def __init__(self, url: str, **stand: Any):
        import threading

        self.url = url
        self.stand_kw = stand
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.stand: Stand | None = None
        self._stop: asyncio.Event | None = None
        self._main: Any = None

    def __enter__(self) -> "Background":
        self.thread.start()
        ready = asyncio.run_coroutine_threadsafe(self._start(), self.loop)
        ready.result(15)
        return self

    async def _start(self) -> None:
        bus = await Bus.connect(self.url, STAGE, source="/tests/background")
        self.bus = bus
        self.stand = await Stand(bus, **self.stand_kw).start()
        self._stop = asyncio.Event()
        started = asyncio.Event()

        async def main() -> None:
            async with recovery(bus):
                started.set()
                await self._stop.wait()  # type: ignore[union-attr]

        self._main = asyncio.create_task(main())
        await started.wait()

    async def _shutdown(self) -> None:
        assert self._stop is not None and self.stand is not None
        self._stop.set()
        await self._main
        await self.stand.stop()
        await self.bus.close()

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@contextlib.asynccontextmanager
async def recovery(bus: Bus, service: RecoveryService | None = None, consumer: str | None = None
                   ) -> AsyncIterator[RecoveryService]:
    svc = service or RecoveryService(FAST, bucket_store="dir")
    runner = ServiceRunner(bus, svc, consumer_name=consumer, clock=svc.clock)  # one clock for both
    task = asyncio.create_task(runner.run())
    try:
        yield svc
    finally:
        runner.stop()
        await asyncio.wait_for(task, 15)
        await svc.close()
