"""Dispatch's pure parts: Kueue's quota walk (its documentation's borrowing walk-through, every
number), admission order and reasons, budgets and their forecast, the policy file's positioned
errors, and the optimizer's gate."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from skypurza.events.dispatch_policy import DispatchPolicy
from skypurza.services.dispatch import admit, budgets, quota
from skypurza.services.dispatch.demand import Pending
from skypurza.services.dispatch.policy import PolicyError, load_policy, load_policy_file
from skypurza.services.optimizer import decide

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=timezone.utc)
F = "default-flavor"


def two_teams(a: dict, b: dict, cohort: dict | None = None) -> DispatchPolicy:
    """Kueue's cluster_queue.md example: team-a-cq and team-b-cq in cohort team-ab, CPUs only."""
    return DispatchPolicy.model_validate({
        "flavors": [{"name": F}],
        "cohorts": [{"name": "team-ab", **(cohort or {})}],
        "queues": [
            {"name": "team-a-cq", "team": "a", "cohort": "team-ab", "quotas": [{"flavor": F, "resources": {"cpu": a}}]},
            {"name": "team-b-cq", "team": "b", "cohort": "team-ab", "quotas": [{"flavor": F, "resources": {"cpu": b}}]},
        ]})


def cap(policy: DispatchPolicy, queue: str, used: dict[str, float] | None = None) -> float:
    usage = {q: {(F, "cpu"): v} for q, v in (used or {}).items()}
    return quota.capacity(quota.build_tree(policy), queue, (F, "cpu"), usage)


def test_kueue_borrowing_walkthrough_numbers():
    # "If team-b-cq has no admitted Workloads, team-a-cq can admit up to 12+9=21 CPUs."
    p = two_teams({"nominal": 9}, {"nominal": 12})
    assert cap(p, "team-a-cq") == 21
    assert cap(p, "team-b-cq") == 21
    assert cap(p, "team-a-cq", {"team-b-cq": 12}) == 9  # b uses its own: a has its nominal only
    assert cap(p, "team-a-cq", {"team-b-cq": 5}) == 16
    # borrowingLimit 1 on team-a: "up to 9+1=10 CPUs"; team-b (no limit) "can use up to 12+9".
    p = two_teams({"nominal": 9, "borrowing_limit": 1}, {"nominal": 12})
    assert cap(p, "team-a-cq") == 10
    assert cap(p, "team-b-cq") == 21
    assert cap(p, "team-a-cq", {"team-a-cq": 10}) == 0
    # lendingLimit 1 on team-b: "while team-b uses at most 12-1=11, team-a can admit up to 9+1=10";
    # team-b itself still "can use up to 9+12".
    p = two_teams({"nominal": 9}, {"nominal": 12, "lending_limit": 1})
    assert cap(p, "team-a-cq") == 10
    assert cap(p, "team-a-cq", {"team-b-cq": 11}) == 10
    assert cap(p, "team-a-cq", {"team-b-cq": 12}) == 9
    assert cap(p, "team-b-cq") == 21
    # A cohort's own quota is an extra pool (hierarchy: a parent cohort lends it too).
    p = two_teams({"nominal": 9}, {"nominal": 12}, {"quotas": [{"flavor": F, "resources": {"cpu": {"nominal": 4}}}]})
    assert cap(p, "team-a-cq") == 25


def test_hierarchical_cohorts_lend_through_the_parent():
    p = DispatchPolicy.model_validate({
        "flavors": [{"name": F}],
        "cohorts": [{"name": "org"}, {"name": "left", "parent": "org"}, {"name": "right", "parent": "org"}],
        "queues": [
            {"name": "qa", "team": "a", "cohort": "left", "quotas": [{"flavor": F, "resources": {"cpu": {"nominal": 2}}}]},
            {"name": "qb", "team": "b", "cohort": "right", "quotas": [{"flavor": F, "resources": {"cpu": {"nominal": 3}}}]},
            {"name": "qc", "team": "c", "cohort": "right",
             "quotas": [{"flavor": F, "resources": {"cpu": {"nominal": 1, "lending_limit": 0}}}]},
        ]})
    assert cap(p, "qa") == 5  # 2 own + qb's 3 through org; qc lends nothing
    assert cap(p, "qc") == 6
    assert cap(p, "qa", {"qb": 3, "qc": 1}) == 2


def pend(task: str, team: str, cpu: float, seq: int, user: str = "u", **kw) -> Pending:
    return Pending(task_id=task, cluster=f"c-{task}", seq=seq, team=team, user=user, request={"cpu": cpu}, **kw)


def test_admission_reasons_nominal_first_and_strict_fifo():
    p = two_teams({"nominal": 8}, {"nominal": 8, "lending_limit": 0})
    d = admit.decide(p, [pend("a1", "a", 8, 1), pend("a2", "a", 8, 2)], {}, {}, {}, NOW)
    assert isinstance(d[0], admit.Admit) and not d[0].borrowing and d[0].flavor == F
    assert isinstance(d[1], admit.Hold) and d[1].kind == "quota"
    assert d[1].reason == "team-a-cq: 8/8 cpu in use (flavor default-flavor), cohort team-ab has 0 to lend; needs 8"

    # Work within nominal goes before borrowing: b's job fits its own quota and is admitted even
    # though a's borrowing job came first and would have taken what b needs.
    p = two_teams({"nominal": 4}, {"nominal": 4})
    d = admit.decide(p, [pend("a1", "a", 6, 1), pend("b1", "b", 4, 2)], {}, {}, {}, NOW)
    assert [type(x).__name__ for x in d] == ["Hold", "Admit"]
    assert "4/4 cpu in use" not in d[0].reason and "0/4 cpu in use" in d[0].reason and "has 0 to lend" in d[0].reason

    # BestEffortFIFO: a big head does not block a small one; StrictFIFO: it does.
    base = {"flavors": [{"name": F}], "queues": [{"name": "q", "team": "a",
                                                   "quotas": [{"flavor": F, "resources": {"cpu": {"nominal": 4}}}]}]}
    jobs = [pend("big", "a", 8, 1), pend("small", "a", 1, 2)]
    d = admit.decide(DispatchPolicy.model_validate(base), jobs, {}, {}, {}, NOW)
    assert [type(x).__name__ for x in d] == ["Hold", "Admit"]
    base["queues"][0]["strategy"] = "StrictFIFO"
    d = admit.decide(DispatchPolicy.model_validate(base), jobs, {}, {}, {}, NOW)
    assert [x.kind for x in d] == ["quota", "order"] and "waiting behind big" in d[1].reason


def test_user_limits_flavors_and_unqueued_teams():
    p = DispatchPolicy.model_validate({
        "flavors": [{"name": "spot", "infra": "aws", "market": "spot"}, {"name": "local", "infra": "local"}],
        "queues": [{"name": "q", "team": "a", "users": [{"user": "alice", "resources": {"A100": 4}}],
                    "quotas": [{"flavor": "spot", "resources": {"A100": {"nominal": 8}, "cpu": {"nominal": 64}}},
                               {"flavor": "local", "resources": {"A100": {"nominal": 0}, "cpu": {"nominal": 2}}}]}]})
    gpu = lambda t, seq, user, spot=True, infra=None: Pending(t, "c", seq, "a", user, {"cpu": 8, "A100": 4},  # noqa: E731
                                                             infra=infra, spot=spot)
    d = admit.decide(p, [gpu("t1", 1, "alice"), gpu("t2", 2, "alice"), gpu("t3", 3, "bob"),
                         gpu("t4", 4, "bob", spot=False)], {}, {}, {}, NOW)
    assert isinstance(d[0], admit.Admit) and d[0].flavor == "spot" and d[0].infra == "aws"
    assert d[1].kind == "user_limit" and d[1].reason == "q/alice: 4/4 A100 in use (user limit); needs 4"
    assert isinstance(d[2], admit.Admit)
    assert d[3].kind == "quota" and "flavor local" in d[3].reason  # on-demand: only the local flavor
    d = admit.decide(p, [Pending("x", "c", 1, "zeta", "u", {"cpu": 1})], {}, {}, {}, NOW)
    assert isinstance(d[0], admit.Admit) and d[0].queue is None
    held = p.model_copy(update={"unqueued": "hold"})
    assert admit.decide(held, [Pending("x", "c", 1, "zeta", "u", {"cpu": 1})], {}, {}, {}, NOW)[0].kind == "no_queue"


def test_budgets_alert_hold_and_forecast():
    p = DispatchPolicy.model_validate({"budgets": [{"team": "a", "period": "day", "limit_usd": 100}]})
    spend: dict = {}
    start = NOW.replace(hour=0)
    budgets.charge(spend, "a", "alice", start + timedelta(hours=6), 45_000_000)
    st = budgets.status(p.budgets[0], spend, NOW)
    assert (st.spent_usd, st.state, st.fraction) == (45.0, "ok", 0.45)
    # $45 in 12 h: $3.75/h, the remaining $55 in 14 h 40 min: past midnight, so no run-out today.
    assert st.runs_out_at is None
    budgets.charge(spend, "a", "bob", start + timedelta(hours=11), 40_000_000)
    st = budgets.status(p.budgets[0], spend, NOW)
    assert st.state == "alert" and st.runs_out_at == NOW + timedelta(hours=15 * 12 / 85)
    assert isinstance(admit.decide(p, [pend("t", "a", 1, 1)], {}, {}, spend, NOW)[0], admit.Admit)
    budgets.charge(spend, "a", "bob", NOW - timedelta(minutes=1), 15_000_000)
    d = admit.decide(p, [pend("t", "a", 1, 1), pend("o", "other", 1, 2)], {}, {}, spend, NOW)
    assert d[0].kind == "budget" and d[0].reason.startswith("a: $100.00 of $100.00 daily budget spent (hard limit)")
    assert "2026-12-11 00:00 UTC" in d[0].reason and isinstance(d[1], admit.Admit)
    # Tomorrow is a new day; the month's budget still counts all of it.
    assert budgets.status(p.budgets[0], spend, NOW + timedelta(days=1)).spent_usd == 0
    month = DispatchPolicy.model_validate({"budgets": [{"team": "a", "period": "month", "limit_usd": 1000,
                                                        "hard": False}]})
    assert budgets.status(month.budgets[0], spend, NOW + timedelta(days=1)).spent_usd == 100
    # A tenth of a cent against a large limit: a run-out past what a datetime holds is none, not a crash.
    assert budgets.forecast(0.001, 1e12, NOW - timedelta(days=2), NOW + timedelta(days=28), NOW) is None


def test_policy_errors_are_positioned(tmp_path: Path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("flavors:\n  - name: local\n    infra: local\nqueues:\n  - name: a\n    team: a\n"
                   "    strategy: Fifo\n    quotas:\n      - flavor: local\n        resources:\n"
                   "          cpu: {nominal: 2, lendng_limit: 1}\n")
    with pytest.raises(PolicyError) as e:
        load_policy_file(bad)
    assert str(e.value) == (f"{bad}:11:29: queues[0].quotas[0].resources.cpu.lendng_limit: unknown key; "
                            "accepted here: nominal, borrowing_limit, lending_limit")
    bad.write_text(bad.read_text().replace("lendng_limit", "lending_limit"))
    with pytest.raises(PolicyError) as e:
        load_policy_file(bad)
    assert str(e.value) == f"{bad}:7:15: queues[0].strategy: accepted: 'BestEffortFIFO' or 'StrictFIFO'"
    with pytest.raises(PolicyError) as e:
        load_policy("flavors: [{name: x}]\ncohorts: [{name: c, parent: d}, {name: d, parent: c}]\n"
                    "queues: [{name: q, team: t, quotas: [{flavor: y, resources: {cpu: {nominal: 1, lending_limit: 2}}}]}]\n",
                    "p.yaml")
    text = str(e.value)
    assert "p.yaml:2:" in text and "is its own ancestor (a cycle)" in text
    assert "queues[0].quotas[0].flavor: unknown flavor 'y'; defined: x" in text
    assert "lending_limit: 2 is more than the nominal quota 1" in text
    with pytest.raises(PolicyError, match=r"p.yaml:2:1: YAML syntax error"):
        load_policy("queues: [\n", "p.yaml")


def test_optimizer_gate_reads_the_policy_active_at_the_submission():
    changes = [(10, True), (20, False), (30, True)]
    assert not decide.awaits_admission([], 5)
    assert [decide.awaits_admission(changes, s) for s in (5, 11, 19, 21, 31)] == [False, True, True, False, True]


def test_an_invalid_policy_in_the_log_holds_work_with_what_is_wrong():
    from skypurza.events.bus import Stored
    from skypurza.events.dispatch_events import DispatchPolicyApplied
    from skypurza.events.models import TaskSubmitted
    from skypurza.services.dispatch.state import DispatchState

    # A cycle of cohorts, written straight to the log (not by `spz dispatch policy apply`).
    looped = DispatchPolicy.model_validate({"cohorts": [{"name": "x", "parent": "y"}, {"name": "y", "parent": "x"}]})
    st = DispatchState()
    st.apply(Stored(1, "s", NOW, None, DispatchPolicyApplied(policy=looped), "ok"))
    st.apply(Stored(2, "s", NOW, None, TaskSubmitted(task_id="t", cluster="c", task={"run": "x"}, team="a"), "ok"))
    (d,) = st.decisions(NOW)
    assert d.kind == "policy" and "its own ancestor" in d.reason
    st.apply(Stored(1, "s", NOW, None, DispatchPolicyApplied(policy=None), "ok"))  # folded already: ignored
    assert st.policy is looped
    st.apply(Stored(3, "s", NOW, None, DispatchPolicyApplied(policy=None), "ok"))
    assert isinstance(st.decisions(NOW)[0], admit.Admit)
