"""Preemption, pure, with Kueue's classical semantics (ClusterQueue `.spec.preemption`):

- `within_queue`: a pending task may preempt admitted tasks of its own queue: `Never`,
  `LowerPriority` (strictly lower), `LowerOrNewerEqualPriority` (lower, or equal and submitted
  after it);
- `reclaim_within_cohort`: it may take back its nominal quota from other queues of its cohort
  tree while they are over their nominal quota (borrowing): `Never`, `LowerPriority`, `Any`;
  with a reclaim the task must then fit without borrowing itself (Kueue's rule: reclaim gives
  back nominal quota, it never funds borrowing).

Candidates are ordered as Kueue orders them: tasks of other (borrowing) queues first, then
lowest priority, then most recently admitted; removed one by one until the task fits (a reclaim
candidate is skipped once its queue is no longer over nominal), then the set is minimised by
walking it in reverse and putting back every task the fit does not need.

The priority here is static (the task's priority class value plus SkyPilot's integer
`priority`), never the multifactor one, whose age and fairshare move with time: a preemption
needs a strictly higher static priority, or an equal one and an older submission, and a
reclaim needs the victim's queue over nominal while the preemptor stays within its own. So no
two tasks can preempt each other in turn (Kueue #3779; tests/test_dispatch_preempt.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from skypurza.events.dispatch_policy import DispatchPolicy, Queue

from . import quota
from .demand import Pending


@dataclass(frozen=True)
class Admitted:
    """An admitted task holding quota, as preemption sees it."""

    task_id: str
    queue: str
    flavor: str
    request: Mapping[str, float]
    priority: int  # static: priority class value + SkyPilot's `priority`
    submitted_seq: int  # "newer" is a later submission
    admitted_order: int  # "most recently admitted" is the highest


@dataclass(frozen=True)
class Preemption:
    flavor: str
    targets: tuple[Admitted, ...]
    reason: str  # what the preempted tasks are told


def static_priority(policy: DispatchPolicy, p: Pending) -> int:
    classes = {c.name: c.value for c in policy.priority.classes} if policy.priority is not None else {}
    return classes.get(p.priority_class or "", 0) + p.boost


def _root(tree: quota.Tree, node: str) -> str:
    while tree.nodes[node].parent is not None:
        node = tree.nodes[node].parent  # type: ignore[assignment]
    return node


def _over_nominal(tree: quota.Tree, usage: quota.Usage, queue: str, flavor: str, resources: list[str]) -> bool:
    node = tree.nodes[quota.queue_id(queue)]
    row = usage.get(queue, {})
    return any(row.get((flavor, r), 0.0) > (node.quota[(flavor, r)].nominal if (flavor, r) in node.quota else 0.0)
               + quota.EPS for r in resources)


def _eligible(policy: DispatchPolicy, queue: Queue, tree: quota.Tree, p: Pending, prio: int, v: Admitted,
              flavor: str, resources: list[str], usage: quota.Usage) -> bool:
    pre = queue.preemption
    if v.flavor != flavor or not any(v.request.get(r, 0.0) > quota.EPS for r in resources):
        return False
    if v.queue == queue.name:
        if pre.within_queue == "LowerPriority":
            return v.priority < prio
        if pre.within_queue == "LowerOrNewerEqualPriority":
            return v.priority < prio or (v.priority == prio and v.submitted_seq > p.seq)
        return False
    if pre.reclaim_within_cohort == "Never" or queue.cohort is None:
        return False
    vid = quota.queue_id(v.queue)
    if vid not in tree.nodes or _root(tree, vid) != _root(tree, quota.queue_id(queue.name)):
        return False
    if not _over_nominal(tree, usage, v.queue, flavor, resources):
        return False
    return pre.reclaim_within_cohort == "Any" or v.priority < prio


def plan(policy: DispatchPolicy, tree: quota.Tree, queue: Queue, flavors: list[str], p: Pending,
         usage: quota.Usage, admitted: list[Admitted]) -> Preemption | None:
    """The tasks to preempt so that `p` fits in one of `flavors` (its queue's, in order), or
    None: it waits without preempting anything."""
    if queue.preemption.within_queue == "Never" and queue.preemption.reclaim_within_cohort == "Never":
        return None
    prio = static_priority(policy, p)
    wanted = [r for r, a in p.request.items() if a > quota.EPS and r in quota.covered(tree, queue.name)]
    for flavor in flavors:
        got = _plan_flavor(policy, tree, queue, flavor, p, prio, wanted, usage, admitted)
        if got is not None:
            return got
    return None


def _plan_flavor(policy: DispatchPolicy, tree: quota.Tree, queue: Queue, flavor: str, p: Pending, prio: int,
                 wanted: list[str], usage: quota.Usage, admitted: list[Admitted]) -> Preemption | None:
    cands = [v for v in admitted if _eligible(policy, queue, tree, p, prio, v, flavor, wanted, usage)]
    if not cands:
        return None
    cands.sort(key=lambda v: (0 if v.queue != queue.name else 1, v.priority, -v.admitted_order))
    use = {q: dict(row) for q, row in usage.items()}

    def fits(targets: list[Admitted]) -> bool:
        f = quota.fit(tree, queue.name, [flavor], p.request, use)
        reclaiming = any(t.queue != queue.name for t in targets)
        return f.flavor is not None and not (reclaiming and f.borrowing)

    targets: list[Admitted] = []
    for v in cands:
        if v.queue != queue.name and not _over_nominal(tree, use, v.queue, flavor, wanted):
            continue  # that queue is back within its nominal quota: nothing more to reclaim there
        quota.add(use, v.queue, v.flavor, v.request, -1.0)
        targets.append(v)
        if fits(targets):
            break
    else:
        return None
    # Minimise: in reverse, put back every task the fit does not need.
    for v in reversed(list(targets)):
        quota.add(use, v.queue, v.flavor, v.request, 1.0)
        rest = [t for t in targets if t is not v]
        if fits(rest):
            targets = rest
        else:
            quota.add(use, v.queue, v.flavor, v.request, -1.0)
    reason = (f"preempted by {p.task_id} (priority {prio}) in {queue.name}: "
              + ("reclaiming its nominal quota" if any(t.queue != queue.name for t in targets)
                 else "a higher-priority task of the same queue"))
    return Preemption(flavor, tuple(targets), reason)
