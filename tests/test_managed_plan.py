"""Submitting a launch's managed jobs all or none (events/managed_plan.py), and a member's cost
report cut to their team by the ledger itself (services/ledger/queries.py `team`).

Real parts: a nats-server, the ledger service on a real DuckDB file. For all-or-none, the second
submission of a job group fails after the first is in the log (the submission function given to
submit_plans raises on its second call: the bus and the log stay real); the first job is then
cancelled in the log, stamped as the submissions were, and the error names both.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from ledger_history import History, cand, publish_all
from nats_fixtures import connect_bus

from skypurza.events import ledger_queries as lq
from skypurza.events import naming
from skypurza.events.managed_events import ManagedJobCancelRequested, ManagedJobSubmitted
from skypurza.events.managed_plan import PartialSubmission, PlanError, plan_jobs, submit_plans
from skypurza.events.managed_submit import submit_managed_job
from skypurza.events.models import ClusterProvisioned, ClusterTerminated, PlacementChosen, TaskSubmitted
from skypurza.events.principal import stamp, stamped_principal
from skypurza.events.types import NodeInfo
from skypurza.services.ledger.ledgerconfig import LedgerConfig
from skypurza.services.ledger.service import LedgerService

GROUP = {"name": "g", "execution": "parallel"}
TASKS = [{"name": "a", "run": "echo a"}, {"name": "b", "run": "echo b"}, {"name": "c", "run": "echo c"}]


def test_a_plan_is_bounded_as_the_cli_bounds_it() -> None:
    with pytest.raises(PlanError, match="from 1 to 1,000"):
        plan_jobs("x", ["a"], {}, 1001)
    with pytest.raises(PlanError, match="a job group's jobs are its tasks"):
        plan_jobs("x", ["a", "b"], GROUP, 2)
    assert [p.task_indexes for p in plan_jobs("pipe", ["a", "b"], {}, 1)] == [(0, 1)]


def test_a_failed_submission_leaves_no_partial_group(nats_server) -> None:
    calls = []

    async def second_fails(bus, **kw):
        calls.append(kw["name"])
        if len(calls) == 2:
            raise RuntimeError("the bus refused it")
        return await submit_managed_job(bus, **kw)

    async def main():
        bus = await connect_bus(nats_server)
        try:
            plans = plan_jobs("g", [t["name"] for t in TASKS], GROUP, 1)
            with pytest.raises(PartialSubmission) as caught:
                await submit_plans(bus, plans, TASKS, [{}, {}, {}], user="alice",
                                   attribution=lambda p: ("ml", None), stamped=("alice", "ml"), submit=second_fails)
            last_submit = await bus.last_event(naming.event_filter(bus.stage, "mjob", ManagedJobSubmitted.EVENT_NAME))
            last_cancel = await bus.last_event(naming.event_filter(bus.stage, "mjob",
                                                                   ManagedJobCancelRequested.EVENT_NAME))
            # A bad task is refused before any id is taken: nothing reaches the log.
            with pytest.raises(ValueError):
                await submit_plans(bus, plans, [*TASKS[:2], "not a task"],
                                   [{}, {}, {}], user="alice", attribution=lambda p: ("ml", None))
            after_bad = await bus.last_event(naming.event_filter(bus.stage, "mjob", ManagedJobSubmitted.EVENT_NAME))
            return caught.value, last_submit, last_cancel, after_bad
        finally:
            await bus.close()

    exc, last_submit, last_cancel, after_bad = asyncio.run(main())
    assert calls == ["g/a", "g/b"]
    assert exc.submitted == [1] and exc.cancelled == [1]
    assert "2 of 3 failed" in str(exc) and "the bus refused it" in str(exc) and "(1) were cancelled" in str(exc)
    assert last_submit.event.managed_job_id == 1 and last_submit.event.group.root_job_id == 1
    assert last_cancel is not None and last_cancel.event.managed_job_id == 1
    assert stamped_principal(last_cancel.envelope) == ("alice", "ml")
    assert after_bad.seq == last_submit.seq


def _run_of(h: History, task_id: str, cluster: str, user: str, team: str) -> None:
    env = h.add(TaskSubmitted(task_id=task_id, cluster=cluster, task={"name": task_id, "run": "x"}, user=user,
                              team=team))
    h.envs[-1] = stamp(env, user, team)
    c = cand()
    pc = h.add(PlacementChosen(task_id=task_id, cluster=cluster, attempt=1, candidate=c, num_nodes=1))
    launched = h.t
    h.add(ClusterProvisioned(cluster=cluster, task_id=task_id, placement_id=pc.id, candidate=c,
                             nodes=[NodeInfo(rank=0, instance_id=f"i-{cluster}", private_ip="10.0.0.1",
                                             zone="us-east-1a")],
                             hourly_price_micros=c.hourly_price_micros, launched_at=launched, user=user, team=team))
    end = launched + timedelta(hours=1)
    h.add(ClusterTerminated(cluster=cluster, terminated_at=end, reason="user", instance_ids=[f"i-{cluster}"]), at=end)


def test_the_ledger_cuts_a_report_to_one_team_by_any_grouping(nats_server, tmp_path: Path) -> None:
    h = History(prefix="cut")
    _run_of(h, "t1", "c1", "alice", "ml")
    _run_of(h, "t2", "c2", "mallory", "finance")

    async def main():
        bus = await connect_bus(nats_server)
        svc = LedgerService(tmp_path / "ledger.duckdb", tick_s=3600, config=LedgerConfig())
        try:
            last = await publish_all(bus, h.envs)
            await svc.start(bus)
            assert await svc.wait_written(last)
            deadline = asyncio.get_running_loop().time() + 30
            while len((await lq.cost_report(bus, by="user"))["lines"]) < 2:
                assert asyncio.get_running_loop().time() < deadline, "the meter never billed both runs"
                await asyncio.sleep(0.1)
            return {by: (await lq.cost_report(bus, by=by), await lq.cost_report(bus, by=by, team="ml"))
                    for by in ("user", "cluster", "team")}
        finally:
            await svc.close()
            await bus.close()

    reports = asyncio.run(main())
    assert [x["key"] for x in reports["user"][0]["lines"]] == ["alice", "mallory"]
    assert [x["key"] for x in reports["user"][1]["lines"]] == ["alice"] and reports["user"][1]["team"] == "ml"
    assert [x["key"] for x in reports["cluster"][1]["lines"]] == ["c1"]
    assert [x["key"] for x in reports["team"][1]["lines"]] == ["ml"]
    whole, mine = reports["user"]
    assert mine["total"]["cost_micros"] == whole["lines"][0]["cost_micros"] < whole["total"]["cost_micros"]
