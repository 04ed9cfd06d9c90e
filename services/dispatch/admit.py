"""Admission, pure: the policy, the pending submissions (in order), what admitted work holds
and the spend so far -> for each pending task, admit (with its queue and flavor) or hold (with
a reason a person can act on). No bus, no clock: `now` is an argument.

Order: pending tasks are taken in the order given (the service gives the multifactor priority
order, order.py, then submission: the stream sequence). Within one pass over them, as Kueue does in a cohort, work that fits in its
queue's nominal quota goes first; work that must borrow goes in a second pass, so a team
using its own quota is never starved by another team's borrowing. `BestEffortFIFO`: a task
that does not fit does not hold back the ones behind it; `StrictFIFO`: it does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from skypurza.events.dispatch_events import HoldKind
from skypurza.events.dispatch_policy import DispatchPolicy, Flavor, Queue
from skypurza.events.types import ReservationRef

from . import budgets, quota, reserve
from .demand import Pending

UserUsage = dict[tuple[str, str], dict[str, float]]  # (team, user) -> resource -> in use


@dataclass(frozen=True)
class Admit:
    task_id: str
    queue: str | None
    flavor: str | None
    infra: str | None
    borrowing: bool
    reason: str
    reservation: ReservationRef | None = None  # the flavor's: placement goes only there


@dataclass(frozen=True)
class Hold:
    task_id: str
    queue: str | None
    kind: HoldKind
    reason: str


Decision = Admit | Hold


@dataclass(frozen=True)
class Book:
    """What admitted work holds, to charge and release: the queue, flavor and request."""

    queue: str | None
    flavor: str | None
    team: str | None
    user: str
    request: dict[str, float]
    priority: int = 0  # static (preempt.static_priority): what preemption compares
    submitted_seq: int = 0
    order: int = 0  # admission order: "most recently admitted" is the highest
    managed_job_id: int | None = None  # a managed job's launch: recovery relaunches it when preempted


def charge(usage: dict[str, dict[quota.Key, float]], users: UserUsage, book: Book, sign: float = 1.0) -> None:
    """Charge (sign -1: release) what one admitted task holds, in place."""
    if book.queue is None or book.flavor is None:
        return
    quota.add(usage, book.queue, book.flavor, book.request, sign)
    if book.team and book.user:
        row = users.setdefault((book.team, book.user), {})
        for res, amt in book.request.items():
            row[res] = row.get(res, 0.0) + sign * amt


_BY_TEAM: dict[int, tuple[DispatchPolicy, dict[str, Queue]]] = {}


def queue_of(policy: DispatchPolicy, team: str | None) -> Queue | None:
    """The team's queue (a dict per policy, kept while the policy is: a pass asks 10,000 times)."""
    if not team:
        return None
    got = _BY_TEAM.get(id(policy))
    if got is None or got[0] is not policy:
        by_team: dict[str, Queue] = {}
        for q in policy.queues:
            by_team.setdefault(q.team, q)
        _BY_TEAM.clear()  # one policy is active at a time; the last one asked is the one kept
        got = _BY_TEAM[id(policy)] = (policy, by_team)
    return got[1].get(team)


def _compatible(flavor: Flavor | None, p: Pending) -> bool:
    if flavor is None:
        return True
    if flavor.infra and p.infra and flavor.infra != p.infra:
        return False
    if not reserve.compatible(flavor, p):
        return False
    return flavor.market is None or (flavor.market == "spot") == p.spot


def decide(policy: DispatchPolicy, pending: list[Pending], usage: quota.Usage, users: UserUsage,
           spend: Mapping[budgets.SpendKey, int], now: datetime,
           tree: quota.Tree | None = None, base: quota.Walk | None = None) -> list[Decision]:
    """A decision for every task of `pending`, in its order. `base`: a walk over `usage` as it
    is (the state's, kept across passes; only read and filled here)."""
    tree = tree or quota.build_tree(policy)
    flavors = {f.name: f for f in policy.flavors}
    # Copies on write: a pass over 10,000 tasks admits a few; copying every row up front would
    # cost more than the decisions (bench/dispatch.py).
    use: dict[str, dict[quota.Key, float]] = dict(usage)  # type: ignore[arg-type]
    user_use: UserUsage = dict(users)
    walk = quota.Walk(tree, use, base=base if base is not None and base.tree is tree else None)
    out: dict[str, Decision] = {}
    strict_heads: dict[str, str] = {}  # StrictFIFO queue -> the held task every later one waits behind
    for borrowing_pass in (False, True):
        deferred_heads: dict[str, str] = {}
        for p in pending:
            if p.task_id in out:
                continue
            d = _one(policy, tree, flavors, p, use, user_use, spend, now, strict_heads, deferred_heads,
                     borrowing_pass, walk)
            if d is None:
                continue
            out[p.task_id] = d
            if isinstance(d, Admit):
                if d.queue is not None:
                    use[d.queue] = dict(use.get(d.queue, {}))
                if p.team:
                    user_use[(p.team, p.user)] = dict(user_use.get((p.team, p.user), {}))
                booked = reserve.booked(flavors.get(d.flavor or ""), p)
                charge(use, user_use, Book(d.queue, d.flavor, p.team, p.user, booked))
                if d.queue is not None and d.flavor is not None:
                    walk.charged(d.queue, [(d.flavor, r) for r in booked])
    return [out[p.task_id] for p in pending if p.task_id in out]


def allowed_flavors(queue: Queue, flavors: dict[str, Flavor], p: Pending) -> list[str]:
    """The queue's flavors, in its order, that the task may use (infra, market)."""
    return [fq.flavor for fq in queue.quotas if _compatible(flavors.get(fq.flavor), p)]


def _one(policy: DispatchPolicy, tree: quota.Tree, flavors: dict[str, Flavor], p: Pending,
         use: dict[str, dict[quota.Key, float]], user_use: UserUsage, spend: Mapping[budgets.SpendKey, int],
         now: datetime, strict_heads: dict[str, str], deferred_heads: dict[str, str],
         borrowing_pass: bool, walk: quota.Walk | None = None) -> Decision | None:
    """One task's decision; None: decided in the borrowing pass."""
    held = budgets.first_hold(policy.budgets, p.team, p.user, spend, now)
    queue = queue_of(policy, p.team)
    qname = queue.name if queue else None
    if held is not None:
        return Hold(p.task_id, qname, "budget", held.reason())
    if queue is None:
        if policy.unqueued == "hold":
            return Hold(p.task_id, None, "no_queue",
                        f"no dispatch queue for team {p.team or '(none)'}; an admin adds one to the policy")
        return Admit(p.task_id, None, None, None, False, "no queue for its team: admitted without quota")
    strict = queue.strategy == "StrictFIFO"
    if strict and queue.name in strict_heads:
        return Hold(p.task_id, queue.name, "order",
                    f"{queue.name}: waiting behind {strict_heads[queue.name]}, the head of a StrictFIFO queue")
    if strict and queue.name in deferred_heads:
        return None  # behind a head that must borrow: decided after it, in the borrowing pass
    for lim in queue.users:
        if lim.user != p.user:
            continue
        row = user_use.get((queue.team, p.user), {})
        for res, cap in sorted(lim.resources.items()):
            want = p.request.get(res, 0.0)
            if want > 0 and row.get(res, 0.0) + want > cap + quota.EPS:
                return Hold(p.task_id, queue.name, "user_limit",
                            f"{queue.name}/{p.user}: {row.get(res, 0.0):g}/{cap:g} {res} in use (user limit); "
                            f"needs {want:g}")
    allowed = allowed_flavors(queue, flavors, p)
    if not allowed and quota.covered(tree, queue.name):
        return Hold(p.task_id, queue.name, "no_flavor",
                    f"{queue.name}: no flavor of the queue allows this task (infra {p.infra or 'any'}, "
                    f"{'spot' if p.spot else 'on-demand'})")
    if not allowed:  # the queue limits nothing at all
        return Admit(p.task_id, queue.name, None, None, False, f"{queue.name}: no quota applies")
    # A full reservation is skipped, so the task goes on to the queue's next flavor.
    full = {name: why for name in allowed if name in flavors and (why := reserve.room(flavors[name], p, use))}
    open_ = [name for name in allowed if name not in full]
    f = quota.fit(tree, queue.name, open_, p.request, use, walk,
                  open_flavors=frozenset(n for n in open_ if flavors[n].reservation is not None)) if open_ \
        else quota.Fit(None)
    if f.flavor is None:
        if strict:
            strict_heads[queue.name] = p.task_id
        reason = f.reason if open_ else f"{queue.name}: " + "; ".join(full.values())
        if open_ and full and allowed[0] in full:  # the first flavor tried was a full reservation
            reason = f"{queue.name}: {full[allowed[0]]}; then {f.reason}"
        return Hold(p.task_id, queue.name, "quota", reason)
    if f.borrowing and not borrowing_pass:
        if strict:
            deferred_heads.setdefault(queue.name, p.task_id)
        return None
    fl = flavors.get(f.flavor)
    note = _budget_note(policy, p, spend, now)
    ref = reserve.ref_of(fl) if fl is not None and fl.reservation is not None else None
    return Admit(p.task_id, queue.name, f.flavor, reserve.infra_of(fl) if fl else None, f.borrowing,
                 f.reason + note, ref)


def _budget_note(policy: DispatchPolicy, p: Pending, spend: Mapping[budgets.SpendKey, int],
                 now: datetime) -> str:
    for b in budgets.applicable(policy.budgets, p.team, p.user):
        st = budgets.status(b, spend, now)
        if st.state != "ok":
            return f"; budget {b.team}{'/' + b.user if b.user else ''} {b.period} at {st.fraction:.0%}"
    return ""
