"""Dispatch through the real bus: a real nats-server, the real optimizer and the dispatch
service under ServiceRunner. Two teams with quotas on the local infra: beyond quota a task is
held with its reason and admitted as capacity frees (a job's end, as its agent reports it);
borrowing within the cohort; a hard budget holds new work (spend from UsageRecorded, as the
ledger's metering records it); the dispatch service killed and restarted mid-queue admits
nothing twice and forgets nothing; with no policy the optimizer places at once and the
dispatch service says nothing."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.dispatch_events import DispatchPolicyApplied, TaskAdmitted, TaskHeld
from skypurza.events.models import JobQueued, JobSucceeded, PlacementChosen, TaskSubmitted, UsageRecorded
from skypurza.events.service import ServiceRunner
from skypurza.services.dispatch.policy import load_policy
from skypurza.services.dispatch.service import DispatchService
from skypurza.services.optimizer.service import OptimizerService

POLICY = """
flavors:
  - name: local
    infra: local
cohorts:
  - name: research
queues:
  - name: team-a
    team: team-a
    cohort: research
    quotas:
      - flavor: local
        resources:
          cpu: {nominal: 1}
  - name: team-b
    team: team-b
    cohort: research
    quotas:
      - flavor: local
        resources:
          cpu: {nominal: 1}
budgets:
  - team: team-c
    period: month
    limit_usd: 10
"""


def task(cpus: float = 1) -> dict:
    return {"resources": {"cpus": cpus, "infra": "local"}, "run": "sleep 1"}


async def of_type(bus, cls, task_id: str) -> list:
    return [s.event async for s in bus.replay(filter_subject=naming.aggregate_subjects("test", "task", task_id))
            if isinstance(s.event, cls)]


async def until(check, timeout: float = 20.0, what: str = ""):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert asyncio.get_running_loop().time() < deadline, f"waited for {what}"
        await asyncio.sleep(0.05)


async def admitted(bus, task_id: str, count: int = 1):
    return await until(lambda: _at_least(bus, TaskAdmitted, task_id, count), what=f"{task_id} admitted")


async def placed(bus, task_id: str):
    return await until(lambda: _at_least(bus, PlacementChosen, task_id, 1), what=f"{task_id} placed")


async def held(bus, task_id: str, text: str):
    async def check():
        hs = await of_type(bus, TaskHeld, task_id)
        return hs if hs and text in hs[-1].reason else None
    return await until(check, what=f"{task_id} held with {text!r}")


async def _at_least(bus, cls, task_id, count):
    got = await of_type(bus, cls, task_id)
    return got if len(got) >= count else None


async def submit(bus, task_id: str, team: str, cpus: float = 1) -> None:
    await bus.publish(TaskSubmitted(task_id=task_id, cluster=f"c-{task_id}", task=task(cpus), user="u", team=team))


async def finish(bus, task_id: str) -> None:
    """What the provisioner and the head agent publish for a task's one job."""
    cluster = f"c-{task_id}"
    await bus.publish(JobQueued(cluster=cluster, job_id=1, task_id=task_id, task=task()))
    await bus.publish(JobSucceeded(cluster=cluster, job_id=1, ended_at=datetime.now(timezone.utc)))


def start(bus, service):
    runner = ServiceRunner(bus, service)
    return runner, asyncio.create_task(runner.run())


async def stop(runner, job):
    runner.stop()
    await job


def test_quotas_borrowing_budgets_and_a_restart_mid_queue(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        opt, opt_job = start(bus, OptimizerService(enabled=frozenset({"local"})))
        disp, disp_job = start(bus, DispatchService())

        # No policy: placed at once, no admission event.
        await submit(bus, "free", "team-a")
        await placed(bus, "free")
        policy = load_policy(POLICY, "policy.yaml")
        await bus.publish(DispatchPolicyApplied(policy=policy, source="policy.yaml"))

        # team-a fills its nominal quota, then borrows team-b's idle one; the third waits.
        for t in ("a1", "a2", "a3"):
            await submit(bus, t, "team-a")
        a1, a2 = (await admitted(bus, "a1"))[0], (await admitted(bus, "a2"))[0]
        assert not a1.borrowing and a2.borrowing and a2.flavor == "local" and a2.infra == "local"
        await placed(bus, "a1")
        await placed(bus, "a2")
        await held(bus, "a3", "team-a: 2/1 cpu in use (flavor local), cohort research has 0 to lend; needs 1")
        assert not await of_type(bus, PlacementChosen, "a3")
        assert len(await of_type(bus, PlacementChosen, "free")) == 1 and not await of_type(bus, TaskAdmitted, "free")

        # team-b's own quota is lent out: it waits too (no preemption configured).
        await submit(bus, "b1", "team-b")
        await held(bus, "b1", "team-b: 0/1 cpu in use")

        # Kill the dispatch service mid-queue; capacity frees while it is down.
        await stop(disp, disp_job)
        await finish(bus, "a1")
        disp, disp_job = start(bus, DispatchService())
        # What frees goes to the team within its nominal quota first: b1, not a3.
        await admitted(bus, "b1")
        await placed(bus, "b1")
        await asyncio.sleep(0.5)
        assert not await of_type(bus, TaskAdmitted, "a3")
        await held(bus, "a3", "team-a: 1/1 cpu in use")

        await finish(bus, "a2")
        await admitted(bus, "a3")
        await placed(bus, "a3")

        # Restart again: nothing is admitted twice, no placement repeated.
        await stop(disp, disp_job)
        disp, disp_job = start(bus, DispatchService())
        await submit(bus, "a4", "team-a")
        await held(bus, "a4", "team-a: 1/1 cpu in use (flavor local), cohort research has 0 to lend")
        for t in ("a1", "a2", "a3", "b1"):
            assert len(await of_type(bus, TaskAdmitted, t)) == 1, t
            assert len(await of_type(bus, PlacementChosen, t)) == 1, t

        # A hard budget: team-c spent $10 of $10 this month (the ledger's UsageRecorded).
        now = datetime.now(timezone.utc)
        await bus.publish(UsageRecorded(cluster="c-old", rank=0, instance_id="i-1", start=now - timedelta(hours=1),
                                        end=now, hourly_price_micros=10_000_000, cost_micros=10_000_000,
                                        user="u", team="team-c"))
        await submit(bus, "c1", "team-c")
        hold = (await held(bus, "c1", "team-c: $10.00 of $10.00 monthly budget spent (hard limit)"))[-1]
        assert hold.kind == "budget"
        await asyncio.sleep(0.3)
        assert not await of_type(bus, PlacementChosen, "c1")

        # The policy removed: everything held is admitted and placed.
        await bus.publish(DispatchPolicyApplied(policy=None))
        for t in ("a4", "c1"):
            await admitted(bus, t)
            await placed(bus, t)
        await stop(disp, disp_job)
        await stop(opt, opt_job)
        await bus.close()

    asyncio.run(main())
