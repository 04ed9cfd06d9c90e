"""Preemption with Kueue's classical semantics (services/dispatch/preempt.py): within a queue by
priority, reclaim within a cohort from queues over nominal, candidates ordered (borrowing
queues first, lowest priority, most recently admitted) and minimised, the policy's keys; and
no two tasks ever preempt each other in turn (Kueue #3779), on a random simulation."""

from __future__ import annotations

import random

import pytest

from skypurza.events.dispatch_policy import DispatchPolicy
from skypurza.services.dispatch import preempt, quota
from skypurza.services.dispatch.demand import Pending
from skypurza.services.dispatch.policy import PolicyError, load_policy

F = "local"


def two_queues(a_nominal: float, b_nominal: float, within: str = "Never", reclaim: str = "Never") -> DispatchPolicy:
    pre = {"within_queue": within, "reclaim_within_cohort": reclaim}
    return DispatchPolicy.model_validate({
        "flavors": [{"name": F}], "cohorts": [{"name": "org"}],
        "queues": [{"name": q, "team": q, "cohort": "org", "preemption": pre,
                    "quotas": [{"flavor": F, "resources": {"cpu": {"nominal": n}}}]}
                   for q, n in (("a", a_nominal), ("b", b_nominal))],
        "priority": {"classes": [{"name": "low", "value": 1}, {"name": "mid", "value": 5}, {"name": "high", "value": 9}]},
    })


def pend(task_id: str, team: str, cpu: float, cls: str | None = None, seq: int = 100) -> Pending:
    return Pending(task_id=task_id, cluster=f"c-{task_id}", seq=seq, team=team, user="u", request={"cpu": cpu},
                   priority_class=cls)


def run(task_id: str, queue: str, cpu: float, prio: int, order: int, seq: int | None = None) -> preempt.Admitted:
    return preempt.Admitted(task_id, queue, F, {"cpu": cpu}, prio, seq if seq is not None else order, order)


def usage_of(admitted: list[preempt.Admitted]) -> dict:
    use: dict = {}
    for v in admitted:
        quota.add(use, v.queue, v.flavor, v.request)
    return use


def plan(pol: DispatchPolicy, p: Pending, admitted: list[preempt.Admitted]) -> preempt.Preemption | None:
    q = next(q for q in pol.queues if q.team == p.team)
    return preempt.plan(pol, quota.build_tree(pol), q, [F], p, usage_of(admitted), admitted)


def ids(pr: preempt.Preemption | None) -> list[str] | None:
    return None if pr is None else [t.task_id for t in pr.targets]


def test_within_queue_lower_priority_takes_the_lowest_most_recent_and_minimises():
    pol = two_queues(4, 0, within="LowerPriority")
    running = [run("low-old", "a", 1, 1, 1), run("low-new", "a", 1, 1, 2), run("mid", "a", 2, 5, 3)]
    # 2 CPUs for a high task: the two low ones go (most recent first), the mid one stays
    assert ids(plan(pol, pend("h", "a", 2, "high"), running)) == ["low-new", "low-old"]
    # 1 CPU: only the most recently admitted low one
    got = plan(pol, pend("h", "a", 1, "high"), running)
    assert ids(got) == ["low-new"]
    assert got.reason == "preempted by h (priority 9) in a: a higher-priority task of the same queue"
    # 3 CPUs: greedy takes low-new, low-old, then mid; minimising puts low-old back (mid + low-new is 3)
    assert ids(plan(pol, pend("h", "a", 3, "high"), running)) == ["low-new", "mid"]
    # equal priority never preempts under LowerPriority; nothing lower: it waits
    assert plan(pol, pend("m", "a", 2, "low"), running) is None
    assert plan(two_queues(4, 0), pend("h", "a", 1, "high"), running) is None  # Never


def test_lower_or_newer_equal_priority():
    pol = two_queues(2, 0, within="LowerOrNewerEqualPriority")
    running = [run("older", "a", 1, 5, 1, seq=10), run("newer", "a", 1, 5, 2, seq=200)]
    # equal priority, submitted at 100: only the one submitted after it may go
    assert ids(plan(pol, pend("p", "a", 1, "mid", seq=100), running)) == ["newer"]
    assert plan(pol, pend("p", "a", 2, "mid", seq=100), running) is None  # it would need "older" too


def test_reclaim_within_cohort_from_a_borrowing_queue_only():
    pol = two_queues(2, 2, reclaim="Any")
    # b borrowed a's quota: it uses 4 of its 2
    running = [run("b1", "b", 2, 9, 1), run("b2", "b", 2, 9, 2)]
    got = plan(pol, pend("a1", "a", 2), running)
    assert ids(got) == ["b2"] and "reclaiming its nominal quota" in got.reason
    # a task that would borrow cannot reclaim (a's nominal is 2: 3 would borrow)
    assert plan(pol, pend("a1", "a", 3), running) is None
    # b within its nominal: nothing to reclaim
    assert plan(pol, pend("a1", "a", 2), [run("b1", "b", 2, 0, 1)]) is None
    # LowerPriority reclaim: b's tasks are priority 9, a's task 0: not lower, no reclaim
    assert plan(two_queues(2, 2, reclaim="LowerPriority"), pend("a1", "a", 2), running) is None


def test_borrowing_queues_go_before_the_own_queue():
    pol = two_queues(2, 2, within="LowerPriority", reclaim="Any")
    running = [run("mine-low", "a", 1, 1, 5), run("b1", "b", 2, 9, 1), run("b2", "b", 1, 9, 2)]
    # a uses 1 of 2, b uses 3 of 2: one CPU for a is reclaimed from b, its own low task stays
    assert ids(plan(pol, pend("a2", "a", 1, "high"), running)) == ["b2"]
    # 2 CPUs would make a borrow unless its own low task goes too: b2 (reclaimed), then mine-low
    assert ids(plan(pol, pend("a2", "a", 2, "high"), running)) == ["b2", "mine-low"]


def test_the_policy_keys():
    text = ("flavors: [{name: local}]\nqueues:\n  - name: a\n    team: a\n    preemption:\n"
            "      within_queue: Sometimes\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(text, "p.yaml")
    assert str(exc.value).startswith("p.yaml:6:21: queues[0].preemption.within_queue: accepted: 'Never', "
                                     "'LowerPriority' or 'LowerOrNewerEqualPriority'")
    with pytest.raises(PolicyError) as exc:
        load_policy(text.replace("within_queue: Sometimes", "reclaim: Any"), "p.yaml")
    assert "queues[0].preemption.reclaim: unknown key; accepted here: within_queue, reclaim_within_cohort" in str(
        exc.value)
    ok = load_policy(text.replace("Sometimes", "LowerPriority"), "p.yaml")
    assert ok.queues[0].preemption.within_queue == "LowerPriority"
    assert ok.queues[0].preemption.reclaim_within_cohort == "Never"


def test_two_tasks_never_preempt_each_other_in_turn():
    """Kueue #3779: a random cohort of two queues with every preemption mode; each preempted
    task is submitted again (as recovery does) and may preempt in turn. No pair (x preempts y,
    then y preempts x) ever happens, and the simulation always settles."""
    rng = random.Random(3779)
    total = 0
    modes = [(w, r) for w in ("LowerPriority", "LowerOrNewerEqualPriority") for r in ("LowerPriority", "Any")]
    for trial in range(60):
        within, reclaim = modes[trial % len(modes)]
        pol = two_queues(rng.choice([1, 2, 3]), rng.choice([1, 2, 3]), within, reclaim)
        tree = quota.build_tree(pol)
        seq = 0
        pending: list[Pending] = []
        for i in range(8):
            seq += 1
            pending.append(pend(f"t{i}", rng.choice("ab"), rng.choice([1, 2]), rng.choice([None, "low", "mid", "high"]),
                                seq=seq))
        tasks = {p.task_id: p for p in pending}
        admitted: list[preempt.Admitted] = []
        preempted_by: set[tuple[str, str]] = set()
        order = 0
        for _ in range(200):
            moved = False
            for p in sorted(pending, key=lambda p: (-preempt.static_priority(pol, p), p.seq)):
                q = next(q for q in pol.queues if q.team == p.team)
                use = usage_of(admitted)
                f = quota.fit(tree, q.name, [F], p.request, use)
                if f.flavor is None:
                    pr = preempt.plan(pol, tree, q, [F], p, use, admitted)
                    if pr is None:
                        continue
                    for v in pr.targets:
                        assert (v.task_id, p.task_id) not in preempted_by, (trial, v.task_id, p.task_id)
                        preempted_by.add((p.task_id, v.task_id))
                        total += 1
                        admitted.remove(v)
                        seq += 1  # submitted again, as a new submission of the same task
                        old = tasks[v.task_id]
                        pending.append(Pending(task_id=v.task_id, cluster=old.cluster, seq=seq, team=old.team,
                                               user="u", request=dict(v.request), priority_class=old.priority_class))
                order += 1
                pending.remove(p)
                admitted.append(preempt.Admitted(p.task_id, q.name, F, p.request, preempt.static_priority(pol, p),
                                                 p.seq, order))
                moved = True
                break
            if not moved:
                break
        else:
            pytest.fail(f"trial {trial}: still preempting after 200 rounds")
    assert total >= 20, total  # the simulation did preempt, often



def test_the_service_preempts_once_and_a_restart_does_not_preempt_again():
    from datetime import datetime, timezone

    from skypurza.events.bus import Stored
    from skypurza.events.dispatch_events import DispatchPolicyApplied, TaskAdmitted, TaskPreempted
    from skypurza.events.job_events import CancelRequested
    from skypurza.events.models import JobCancelled, JobQueued, TaskSubmitted
    from skypurza.services.dispatch.service import DispatchService

    now = datetime(2026, 12, 10, tzinfo=timezone.utc)
    log: list[Stored] = []

    def put(ev) -> Stored:
        s = Stored(len(log) + 1, "s", now, None, ev, "ok")
        log.append(s)
        return s

    def sub(task_id: str, cls: str) -> TaskSubmitted:
        return TaskSubmitted(task_id=task_id, cluster=f"c-{task_id}", user="u", team="a",
                             task={"resources": {"cpus": 1, "infra": "local", "priority_class": cls}, "run": "true"})

    class Clock:
        def now(self):
            return now

    def feed(svc: DispatchService, s: Stored) -> list:
        svc.state.apply(s)
        out = list(svc.react())
        for e in out:  # what the runner publishes is in the log, and folded back
            put(e.event)
            svc.state.apply(log[-1])
        return out

    svc = DispatchService(clock=Clock())  # type: ignore[arg-type]
    feed(svc, put(DispatchPolicyApplied(policy=two_queues(1, 0, within="LowerPriority"))))
    assert [type(e.event) for e in feed(svc, put(sub("low", "low")))] == [TaskAdmitted]
    feed(svc, put(JobQueued(cluster="c-low", job_id=1, task_id="low", task={"run": "true"})))
    out = feed(svc, put(sub("high", "high")))
    kinds = [type(e.event).__name__ for e in out]
    assert kinds == ["TaskHeld", "TaskPreempted", "CancelRequested"], kinds
    pre, cancel = out[1].event, out[2].event
    assert (pre.task_id, pre.by_task, pre.job_id) == ("low", "high", 1)
    assert isinstance(cancel, CancelRequested) and (cancel.cluster, cancel.job_id) == ("c-low", 1)
    assert cancel.requested_by == "dispatch: preempted by high (priority 9) in a: a higher-priority task of the same queue"
    assert isinstance(pre, TaskPreempted)
    # a restart folds the log: nothing is preempted again while the job is being cancelled
    again = DispatchService(clock=Clock())  # type: ignore[arg-type]
    for s in log:
        again.state.apply(s)
    assert [type(e.event).__name__ for e in again.react()] == []
    # the job's end frees the quota: the high task is admitted
    out = feed(again, put(JobCancelled(cluster="c-low", job_id=1, ended_at=now)))
    assert [(type(e.event).__name__, e.event.task_id) for e in out] == [("TaskAdmitted", "high")]
