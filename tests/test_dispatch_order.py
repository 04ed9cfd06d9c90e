"""Admission order by Slurm's multifactor priority (services/dispatch/order.py, usage.py,
state.py): decayed fairshare usage folded interval by interval equals decay.raw_usage; each
factor (fairshare, age with its max, job size, priority class, TRES, SkyPilot's integer
priority) moves a task ahead; the policy's `priority:` keys are checked with positions; the
fold coalesces (a submission alone is decided by itself, a release re-decides everything) and
announces a budget's crossing once."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from skypurza.events.bus import Stored
from skypurza.events.dispatch_events import BudgetThresholdCrossed, DispatchPolicyApplied
from skypurza.events.dispatch_policy import DispatchPolicy
from skypurza.events.models import JobQueued, JobSucceeded, TaskSubmitted, UsageRecorded
from skypurza.services.dispatch import admit, decay, order
from skypurza.services.dispatch.demand import Pending
from skypurza.services.dispatch.policy import PolicyError, load_policy
from skypurza.services.dispatch.state import DispatchState
from skypurza.services.dispatch.usage import DecayedUsage

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=timezone.utc)
T0 = NOW.timestamp()


def policy(priority: dict | None, cpu: float = 1, strategy: str = "BestEffortFIFO", **extra) -> DispatchPolicy:
    return DispatchPolicy.model_validate({
        "flavors": [{"name": "local", "infra": "local"}],
        "queues": [{"name": "qa", "team": "a", "strategy": strategy,
                    "quotas": [{"flavor": "local", "resources": {"cpu": {"nominal": cpu}}}]}],
        **({"priority": priority} if priority is not None else {}), **extra})


def pend(task_id: str, seq: int, user: str = "alice", team: str = "a", cpu: float = 1, age_s: float = 0,
         nodes: int = 1, cls: str | None = None, boost: int = 0, gpu: float = 0) -> Pending:
    req = {"cpu": cpu, **({"gpu": gpu} if gpu else {})}
    return Pending(task_id=task_id, cluster=f"c-{task_id}", seq=seq, team=team, user=user, request=req,
                   submitted_at=T0 - age_s, nodes=nodes, priority_class=cls, boost=boost)


def first_admitted(pol: DispatchPolicy, pending: list[Pending], fs: dict | None = None) -> str:
    ranked = order.rank(pol.priority, pending, fs or {}, T0)
    out = admit.decide(pol, order.ordered(pending, ranked), {}, {}, {}, NOW)
    admitted = [d.task_id for d in out if isinstance(d, admit.Admit)]
    assert len(admitted) == 1, out
    return admitted[0]


# ------------------------------------------------------------------ usage


def test_folded_decayed_usage_equals_raw_usage_over_every_interval():
    rng = random.Random(7)
    hl, period = 3600.0, 300.0
    u = DecayedUsage(half_life_s=hl, calc_period_s=period)
    runs: list[decay.Run] = []
    t = T0 - 86400
    for _ in range(200):
        start = t + rng.uniform(0, 600)
        end = start + rng.uniform(1, 900)
        billing = rng.choice([1.0, 5.25, 16.0])
        runs.append(decay.Run(start, end, billing))
        t = end
    order_in = runs[:]
    rng.shuffle(order_in)  # intervals arrive out of order too (nodes meter independently)
    for r in order_in:
        u.add("a", "alice", r.start, r.end, r.billing)
    now = t + 1234
    want = decay.raw_usage(runs, now, hl, period)
    assert u.at(now)[("a", "alice")] == pytest.approx(want, rel=1e-9)
    # with no decay it is the plain untruncated billing × seconds: 5.25 for 15 s is 78.75
    plain = DecayedUsage(half_life_s=0)
    plain.add("a", "bob", T0, T0 + 15, 5.25)
    assert plain.at(T0 + 99)[("a", "bob")] == pytest.approx(78.75)


def test_a_correction_takes_back_what_was_over_metered():
    u = DecayedUsage(half_life_s=0)
    u.add("a", "alice", T0, T0 + 120, 2.0)
    u.add("a", "alice", T0 + 120, T0 + 60, 2.0)  # end before start: the last minute did not happen
    assert u.at(T0 + 200)[("a", "alice")] == pytest.approx(120.0)


# ------------------------------------------------------------------ each factor


def test_fairshare_puts_the_light_user_first():
    pol = policy({"weights": {"fairshare": 10000}, "half_life_s": 0})
    pending = [pend("heavy-1", 1, user="alice"), pend("light-1", 2, user="bob")]
    tree = order.share_tree(pol.priority, [("a", "alice"), ("a", "bob")], {("a", "alice"): 1000.0})
    fs = order.fairshare_factors(pol.priority, tree)
    assert fs == {("a", "bob"): 1.0, ("a", "alice"): 0.5}  # Fair Tree: rank / users
    assert first_admitted(pol, pending, fs) == "light-1"
    # without a priority section: submission order
    assert first_admitted(policy(None), pending, fs) == "heavy-1"


def test_team_shares_from_the_policy_shape_the_tree():
    pol = policy({"weights": {"fairshare": 100}, "shares": [{"team": "a", "shares": 3, "users": {"alice": 4}},
                                                            {"team": "b", "shares": 1}]})
    tree = order.share_tree(pol.priority, [("b", "carol")], {("a", "alice"): 10.0, ("b", "carol"): 10.0})
    shares = {(n.name, c.name): (n.shares, c.shares) for n in tree.children for c in n.children}
    assert shares == {("a", "alice"): (3, 4), ("b", "carol"): (1, 1)}
    fs = order.fairshare_factors(pol.priority, tree)
    # equal usage, team a has 3 of 4 shares: a's LevelFS 0.75/0.5 = 1.5 beats b's 0.5
    assert fs[("a", "alice")] > fs[("b", "carol")]


def test_age_with_its_maximum():
    pol = policy({"weights": {"age": 1000}, "max_age_s": 3600})
    r = {x.task_id: x for x in order.rank(pol.priority, [pend("old", 1, age_s=7200), pend("half", 2, age_s=1800),
                                                          pend("new", 3)], {}, T0)}
    assert (r["old"].priority, r["half"].priority, r["new"].priority) == (1000, 500, 1)  # 0 is clamped to 1
    assert r["old"].factors["age"] == 1.0
    assert first_admitted(pol, [pend("new", 1), pend("half", 2, age_s=1800)]) == "half"


def test_job_size_favours_large_or_small():
    big, small = pend("big", 1, cpu=4, nodes=2), pend("small", 2, cpu=1, nodes=1)
    large = policy({"weights": {"jobsize": 1000}, "cpus_total": 8, "nodes_total": 4}, cpu=8)
    r = {x.task_id: x.priority for x in order.rank(large.priority, [big, small], {}, T0)}
    assert r == {"big": 500, "small": 187}  # (2/4 + 4/8)/2, (1/4 + 1/8)/2 = 0.1875
    fav = policy({"weights": {"jobsize": 1000}, "cpus_total": 8, "nodes_total": 4, "favor_small": True})
    r = {x.task_id: x.priority for x in order.rank(fav.priority, [big, small], {}, T0)}
    assert r == {"big": 500, "small": 812}


def test_priority_class_is_the_qos_factor_and_an_unknown_one_counts_zero():
    pol = policy({"weights": {"qos": 1000}, "classes": [{"name": "high", "value": 100}, {"name": "low", "value": 25}]})
    r = {x.task_id: x.priority for x in order.rank(pol.priority, [pend("h", 1, cls="high"), pend("l", 2, cls="low"),
                                                                  pend("x", 3, cls="nope")], {}, T0)}
    assert r == {"h": 1000, "l": 250, "x": 1}
    assert first_admitted(pol, [pend("l", 1, cls="low"), pend("h", 2, cls="high")]) == "h"


def test_tres_weights_and_skypilots_integer_priority():
    pol = policy({"weights": {}, "tres_weights": {"gpu": 2000}, "tres_totals": {"gpu": 8}})
    r = {x.task_id: x for x in order.rank(pol.priority, [pend("g", 1, gpu=2), pend("boosted", 2, boost=700)], {}, T0)}
    assert r["g"].priority == 500 and r["g"].weighted_tres == {"gpu": 500.0}
    assert r["boosted"].priority == 700 and r["boosted"].nice == -700  # priority 700 is nice −700
    assert first_admitted(pol, [pend("g", 1, gpu=2), pend("boosted", 2, boost=700)]) == "boosted"


def test_equal_priority_keeps_submission_order():
    pol = policy({"weights": {"qos": 10}})
    assert first_admitted(pol, [pend("first", 5), pend("second", 9)]) == "first"


# ------------------------------------------------------------------ the policy file


def test_priority_keys_are_checked_with_positions():
    text = ("priority:\n  weights: {age: 1000, fairshre: 3}\n  max_age_s: 0\n  algorithm: fancy\n"
            "  classes:\n    - {name: hi, value: 5}\n    - {name: hi, value: 6}\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(text, "p.yaml")
    assert str(exc.value) == ("p.yaml:2:24: priority.weights.fairshre: unknown key; accepted here: age, fairshare, "
                              "jobsize, qos")
    with pytest.raises(PolicyError) as exc:
        load_policy(text.replace("fairshre", "fairshare"), "p.yaml")
    msgs = str(exc.value).splitlines()
    assert msgs[0].startswith("p.yaml:3:14: priority.max_age_s: Input should be greater than or equal to 1")
    assert msgs[1].startswith("p.yaml:4:14: priority.algorithm: accepted: 'fair_tree' or 'classic'")
    with pytest.raises(PolicyError) as exc:
        load_policy(text.replace("fairshre", "fairshare").replace("0\n", "60\n").replace("fancy", "classic"), "p.yaml")
    assert str(exc.value) == "p.yaml:7:14: priority.classes[1].name: 'hi' is given twice in priority.classes"
    ok = load_policy(text.replace("fairshre", "fairshare").replace("0\n", "60\n").replace("fancy", "classic")
                     .replace("name: hi, value: 6", "name: lo, value: 6"), "p.yaml")
    assert ok.priority is not None and ok.priority.max_age_s == 60 and ok.priority.algorithm == "classic"


# ------------------------------------------------------------------ the fold


class Log:
    def __init__(self):
        self.seq = 0

    def __call__(self, ev, at: datetime = NOW) -> Stored:
        self.seq += 1
        return Stored(self.seq, "s", at, None, ev, "ok")


def submitted(task_id: str, user: str = "alice", team: str = "a") -> TaskSubmitted:
    return TaskSubmitted(task_id=task_id, cluster=f"c-{task_id}", user=user, team=team,
                         task={"resources": {"cpus": 1, "infra": "local"}, "run": "true"})


def test_fold_orders_by_usage_from_usage_recorded_and_coalesces():
    log, st = Log(), DispatchState()
    st.apply(log(DispatchPolicyApplied(policy=policy({"weights": {"fairshare": 1000}}))))
    st.apply(log(UsageRecorded(cluster="old", rank=0, instance_id="i", start=NOW - timedelta(hours=1), end=NOW,
                               hourly_price_micros=1, cost_micros=1, billing=4.0, user="alice", team="a")))
    assert st.fs_usage.values[("a", "alice")] > 0
    st.apply(log(submitted("a1", "alice")))
    st.apply(log(submitted("b1", "bob")))
    first = st.decisions(NOW, coalesce=True)
    assert [type(d).__name__ for d in first] == ["Admit", "Hold"] and first[0].task_id == "b1"
    from skypurza.events.dispatch_events import TaskAdmitted
    ev = TaskAdmitted(task_id="b1", cluster="c-b1", submitted_seq=4, queue=first[0].queue, flavor=first[0].flavor)
    st.admitted_decision(ev)
    # a submission alone: decided by itself, the held a1 is not decided again
    st.apply(log(submitted("a2", "alice")))
    again = st.decisions(NOW, coalesce=True)
    assert [d.task_id for d in again] == ["a2"]
    # capacity frees: a whole pass, highest priority first (both alice's: submission order)
    st.apply(log(JobQueued(cluster="c-b1", job_id=1, task_id="b1", task={"run": "true"})))
    st.apply(log(JobSucceeded(cluster="c-b1", job_id=1, ended_at=NOW)))
    full = st.decisions(NOW, coalesce=True)
    assert [(d.task_id, type(d).__name__) for d in full] == [("a1", "Admit"), ("a2", "Hold")]
    ranked = st.ranked(NOW)
    assert [r.task_id for r in ranked] == ["a1", "a2"]


def test_a_budget_crossing_is_announced_once_and_forces_a_pass():
    log, st = Log(), DispatchState()
    st.apply(log(DispatchPolicyApplied(policy=policy(None, budgets=[{"team": "a", "period": "month",
                                                                     "limit_usd": 10, "alert_at": 0.5}]))))
    st.decisions(NOW, coalesce=True)

    def spend(usd: float) -> Stored:
        return log(UsageRecorded(cluster="x", rank=0, instance_id="i", start=NOW - timedelta(minutes=1), end=NOW,
                                 hourly_price_micros=1, cost_micros=int(usd * 1e6), user="alice", team="a"))
    st.apply(spend(4))
    assert st.crossings == [] and not st.full_pass
    st.apply(spend(2))
    assert [(c.state, a) for c, a in st.crossings] == [("alert", 0.5)] and st.full_pass
    st.apply(spend(1))
    assert len(st.crossings) == 1  # still alert: nothing new
    st.apply(spend(3))
    assert [c.state for c, _ in st.crossings] == ["alert", "exceeded"]
    # read back (a restart): what was announced is not announced again
    c = st.crossings[0][0]
    st.apply(log(BudgetThresholdCrossed(budget_id="a/month", team="a", period="month", period_key=c.period_key,
                                        state="alert", spent_usd=6, limit_usd=10, fraction=0.6, hard=True)))
    assert [c.state for c, _ in st.crossings] == ["exceeded"]


def test_the_fast_admission_order_is_sprios_order():
    rng = random.Random(3)
    pol = policy({"weights": {"age": 1000, "fairshare": 5000, "jobsize": 300, "qos": 700},
                  "tres_weights": {"gpu": 900.5}, "max_age_s": 5000,
                  "classes": [{"name": "hi", "value": 9}, {"name": "lo", "value": 2}]})
    pending = [pend(f"t{i}", i, user=f"u{i % 13}", cpu=rng.choice([0.5, 1, 4, 16]), age_s=rng.uniform(0, 9000),
                    nodes=rng.choice([1, 2, 8]), cls=rng.choice([None, "hi", "lo", "zz"]),
                    boost=rng.choice([0, 0, -50, 300]), gpu=rng.choice([0, 1, 8])) for i in range(400)]
    fs = {("a", f"u{i}"): rng.random() for i in range(13)}
    slow = order.ordered(pending, order.rank(pol.priority, pending, fs, T0))
    assert [p.task_id for p in order.admission_order(pol.priority, pending, fs, T0)] == [p.task_id for p in slow]
