"""Budget stops (`on_limit: stop`), over the dispatch service's fold and its reactions: at 100%
of a stop budget the team's running work is stopped once, with the reason; a cluster job is
cancelled (CancelRequested), a managed job cancelled for good (ManagedJobCancelRequested, never
a TaskPreempted, which recovery would answer with a relaunch); the stops read back at a restart
are not said again; a `hold` budget stops nothing; `stop` on a soft budget is refused with a
position."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from skypurza.events.bus import Stored
from skypurza.events.clock import ManualClock
from skypurza.events.dispatch_events import DispatchPolicyApplied, TaskBudgetStopped, TaskPreempted
from skypurza.events.job_events import CancelRequested
from skypurza.events.managed_events import ManagedJobCancelRequested
from skypurza.events.models import JobQueued, TaskSubmitted, UsageRecorded
from skypurza.services.dispatch.policy import PolicyError, load_policy
from skypurza.services.dispatch.service import DispatchService

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=timezone.utc)

POLICY = """
flavors:
  - name: local
    infra: local
queues:
  - {name: team-a, team: team-a, quotas: [{flavor: local, resources: {cpu: {nominal: 8}}}]}
  - {name: team-b, team: team-b, quotas: [{flavor: local, resources: {cpu: {nominal: 8}}}]}
budgets:
  - {team: team-a, period: month, limit_usd: 100, on_limit: ON_LIMIT}
"""


class Log:
    """The log: every stored event, in order (a restart folds it all again)."""

    def __init__(self) -> None:
        self.stored: list[Stored] = []

    def __call__(self, ev, at: datetime = NOW) -> Stored:
        s = Stored(len(self.stored) + 1, "s", at, None, ev, "ok")
        self.stored.append(s)
        return s


def submitted(task_id: str, team: str, managed: int | None = None) -> TaskSubmitted:
    return TaskSubmitted(task_id=task_id, cluster=f"c-{task_id}", user="alice", team=team, managed_job_id=managed,
                         task={"resources": {"cpus": 1, "infra": "local"}, "run": "sleep 100"})


def spend(usd: float, team: str = "team-a") -> UsageRecorded:
    return UsageRecorded(cluster="x", rank=0, instance_id="i", start=NOW - timedelta(minutes=5), end=NOW,
                         hourly_price_micros=1, cost_micros=int(usd * 1e6), user="alice", team=team)


def feed(svc: DispatchService, log: Log, events: list) -> list:
    """Apply each event as the consumer would, keep what the service emits (folded back, as the
    runner's publish and the consumer's redelivery would)."""
    out = []
    for ev in events:
        svc.state.apply(log(ev))
        emitted = [e.event for e in svc.react()]
        for e in emitted:
            svc.state.apply(log(e))
        out += emitted
    return out


def running(on_limit: str = "stop"):
    """team-a runs a cluster job (a1) and a managed job (m1, managed job 7); team-b a cluster job (b1)."""
    log, svc = Log(), DispatchService(clock=ManualClock(NOW))
    out = feed(svc, log, [DispatchPolicyApplied(policy=load_policy(POLICY.replace("ON_LIMIT", on_limit))),
                          submitted("a1", "team-a"), submitted("m1", "team-a", managed=7), submitted("b1", "team-b"),
                          JobQueued(cluster="c-a1", job_id=3, task_id="a1", task={"run": "x"}),
                          JobQueued(cluster="c-b1", job_id=1, task_id="b1", task={"run": "x"})])
    assert {e.task_id for e in out if type(e).__name__ == "TaskAdmitted"} == {"a1", "m1", "b1"}
    return log, svc


def test_a_spent_stop_budget_stops_its_teams_running_work_once_with_the_reason():
    log, svc = running()
    # under the limit: an alert, nothing stops
    assert [type(e).__name__ for e in feed(svc, log, [spend(99.99)])] == ["BudgetThresholdCrossed"]
    out = feed(svc, log, [spend(0.01)])
    reason = "budget team-a/month: $100.00 of $100.00 spent"
    stops = [e for e in out if isinstance(e, TaskBudgetStopped)]
    assert sorted((s.task_id, s.job_id, s.budget_id, s.period_key, s.reason) for s in stops) == [
        ("a1", 3, "team-a/month", "2026-12", reason), ("m1", None, "team-a/month", "2026-12", reason)]
    assert [(c.cluster, c.job_id, c.requested_by) for c in out if isinstance(c, CancelRequested)] == [
        ("c-a1", 3, f"dispatch: {reason}")]
    # the managed job is cancelled for good: no TaskPreempted (recovery would relaunch it)
    assert [(c.managed_job_id, c.requested_by) for c in out if isinstance(c, ManagedJobCancelRequested)] == [
        (7, f"dispatch: {reason}")]
    assert not any(isinstance(e, TaskPreempted) for e in out)
    # more spend, more events: each task was stopped once
    assert [e for e in feed(svc, log, [spend(5), spend(1, "team-b")]) if isinstance(e, (TaskBudgetStopped,
            CancelRequested, ManagedJobCancelRequested))] == []


def test_a_restart_does_not_stop_again_and_a_late_job_is_stopped_when_it_is_queued():
    log, svc = running()
    # a3 admitted, its job not queued yet: nothing to cancel until its JobQueued
    first = feed(svc, log, [submitted("a3", "team-a"), spend(100), submitted("a2", "team-a")])
    assert {e.task_id for e in first if isinstance(e, TaskBudgetStopped)} == {"a1", "m1"}
    held = [e for e in first if type(e).__name__ == "TaskHeld" and e.task_id == "a2"]
    assert held and held[-1].kind == "budget"  # new work of the stopped team waits for its budget
    # a restart: the whole log folded again (its own decisions included), then more events
    again = DispatchService(clock=ManualClock(NOW))
    for s in list(log.stored):
        again.state.apply(s)
    late = feed(again, log, [spend(1), JobQueued(cluster="c-a3", job_id=2, task_id="a3", task={"run": "x"})])
    assert [(e.task_id, e.job_id) for e in late if isinstance(e, TaskBudgetStopped)] == [("a3", 2)]
    assert [(c.cluster, c.job_id) for c in late if isinstance(c, CancelRequested)] == [("c-a3", 2)]
    assert not any(isinstance(e, ManagedJobCancelRequested) for e in late)  # managed job 7: said once


def test_a_new_period_stops_nothing_and_a_user_budget_stops_only_that_user():
    log, svc = running()
    pol = load_policy(POLICY.replace("ON_LIMIT", "stop").replace(
        "{team: team-a, period: month, limit_usd: 100, on_limit: stop}",
        "{team: team-a, user: bob, period: day, limit_usd: 1, on_limit: stop}"))
    feed(svc, log, [DispatchPolicyApplied(policy=pol)])
    out = feed(svc, log, [spend(500)])  # alice's spend: bob's budget is not hers
    assert not any(isinstance(e, TaskBudgetStopped) for e in out)
    out = feed(svc, log, [UsageRecorded(cluster="x", rank=0, instance_id="i", start=NOW - timedelta(days=2),
                                        end=NOW - timedelta(days=1), hourly_price_micros=1, cost_micros=5_000_000,
                                        user="bob", team="team-a")])
    assert not any(isinstance(e, TaskBudgetStopped) for e in out)  # yesterday's spend: today's budget is fine


def test_hold_budget_stops_nothing_and_stop_on_a_soft_budget_is_refused_with_a_position():
    log, svc = running(on_limit="hold")
    out = feed(svc, log, [spend(150)])
    assert not any(isinstance(e, (TaskBudgetStopped, CancelRequested, ManagedJobCancelRequested)) for e in out)
    with pytest.raises(PolicyError) as exc:
        load_policy(POLICY.replace("ON_LIMIT", "stop").replace("on_limit:", "hard: false, on_limit:"), "p.yaml")
    assert "p.yaml:9:" in str(exc.value) and "budgets[0].on_limit" in str(exc.value)
    with pytest.raises(PolicyError) as exc:
        load_policy(POLICY.replace("ON_LIMIT", "halt"), "p.yaml")
    assert "budgets[0].on_limit" in str(exc.value)
