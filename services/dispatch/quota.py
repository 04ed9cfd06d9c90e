"""Kueue's quota semantics, pure: ClusterQueues (one per team), hierarchical cohorts, nominal
quota per flavor and resource, borrowing and lending limits, first fitting flavor.

The arithmetic is Kueue's resource-node walk (pkg/cache/resource_node.go), per (flavor, resource):
- a queue's subtree quota is its nominal; a cohort's is its own nominal plus what each child
  lends (the child's subtree quota less what it keeps: `guaranteed`, set by a lending limit);
- a cohort's usage is the part of each child's usage above what the child keeps;
- what a node may still take is what it keeps and has not used, plus what its parent has
  available, capped by its borrowing limit.
Kueue's walk-through (team-a 9 CPUs, team-b 12, one cohort) gives 21 for team-a with team-b idle,
10 with a borrowing limit of 1, 10 with team-b's lending limit of 1 (tests/test_dispatch_pure.py).

Units are floats (CPUs, GiB, GPUs); a task's request is its first resource alternative times its
nodes (services/dispatch/demand.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skypurza.events.dispatch_policy import DispatchPolicy, FlavorQuota

Key = tuple[str, str]  # (flavor, resource)
Usage = Mapping[str, Mapping[Key, float]]  # queue name -> (flavor, resource) -> in use
EPS = 1e-9


@dataclass(frozen=True)
class Limits:
    nominal: float = 0.0
    borrowing_limit: float | None = None
    lending_limit: float | None = None


@dataclass(frozen=True)
class Node:
    """A queue (`q:<name>`) or a cohort (`c:<name>`) of the quota tree."""

    id: str
    parent: str | None
    quota: Mapping[Key, Limits]


@dataclass(frozen=True)
class Tree:
    nodes: Mapping[str, Node]
    children: Mapping[str, tuple[str, ...]]
    keys: frozenset[Key]
    # Subtree quotas depend on the tree alone: memoised once for every walk over it (a cohort
    # of a hundred queues is summed once, not on every fit).
    static: dict[tuple[str, Key], Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


def queue_id(name: str) -> str:
    return f"q:{name}"


def cohort_id(name: str) -> str:
    return f"c:{name}"


def _limits(quotas: list[FlavorQuota]) -> dict[Key, Limits]:
    return {(fq.flavor, res): Limits(q.nominal, q.borrowing_limit, q.lending_limit)
            for fq in quotas for res, q in fq.resources.items()}


def build_tree(policy: DispatchPolicy) -> Tree:
    """The quota tree of a validated policy (policy.py has checked every name it refers to and
    that cohorts have no cycle)."""
    nodes: dict[str, Node] = {}
    for c in policy.cohorts:
        nodes[cohort_id(c.name)] = Node(cohort_id(c.name), cohort_id(c.parent) if c.parent else None,
                                        _limits(c.quotas))
    for q in policy.queues:
        parent = cohort_id(q.cohort) if q.cohort else None
        if parent and parent not in nodes:  # a cohort named only by its queues (Kueue allows it)
            nodes[parent] = Node(parent, None, {})
        nodes[queue_id(q.name)] = Node(queue_id(q.name), parent, _limits(q.quotas))
    children: dict[str, list[str]] = {}
    for n in nodes.values():
        if n.parent:
            children.setdefault(n.parent, []).append(n.id)
    keys = frozenset(k for n in nodes.values() for k in n.quota)
    return Tree(nodes, {k: tuple(v) for k, v in children.items()}, keys)


@dataclass
class Walk:
    """One evaluation of the tree under one usage: the recursive quantities, memoised."""

    tree: Tree
    usage: Usage
    _used: dict[tuple[str, Key], float] = field(default_factory=dict)
    # A walk over a copy of `base`'s usage (one admission pass) reads `base`'s memo, and fills
    # it, until its own usage first differs; so the dispatch state's long-lived walk sums a
    # cohort's hundred children once per change of usage, not once per decision.
    base: "Walk | None" = None
    _forked: bool = False

    def charged(self, queue: str, keys: list[Key]) -> None:
        """The usage of `queue` changed for `keys`: forget what was memoised on its path up."""
        if self.base is not None and not self._forked:
            self._used, self._forked = dict(self.base._used), True
        node: str | None = queue_id(queue)
        while node is not None:
            for key in keys:
                self._used.pop((node, key), None)
            node = self.tree.nodes[node].parent

    def nominal(self, node: str, key: Key) -> float:
        lim = self.tree.nodes[node].quota.get(key)
        return lim.nominal if lim else 0.0

    def subtree_quota(self, node: str, key: Key) -> float:
        memo = self.tree.static.get((node, key))
        if memo is None:
            memo = self.nominal(node, key) + sum(
                self.subtree_quota(c, key) - self.guaranteed(c, key) for c in self.tree.children.get(node, ()))
            self.tree.static[(node, key)] = memo
        return memo

    def guaranteed(self, node: str, key: Key) -> float:
        """What a node keeps for itself: all but its lending limit (nothing kept without one)."""
        lim = self.tree.nodes[node].quota.get(key)
        if lim is None or lim.lending_limit is None:
            return 0.0
        return max(0.0, self.subtree_quota(node, key) - lim.lending_limit)

    def used(self, node: str, key: Key) -> float:
        memo = self._used.get((node, key))
        if memo is None and self.base is not None and not self._forked:
            return self.base.used(node, key)
        if memo is None:
            if node.startswith("q:"):
                memo = float(self.usage.get(node[2:], {}).get(key, 0.0))
            else:
                memo = sum(max(0.0, self.used(c, key) - self.guaranteed(c, key))
                           for c in self.tree.children.get(node, ()))
            self._used[(node, key)] = memo
        return memo

    def available(self, node: str, key: Key) -> float:
        n = self.tree.nodes[node]
        if n.parent is None:
            return self.subtree_quota(node, key) - self.used(node, key)
        local = max(0.0, self.guaranteed(node, key) - self.used(node, key))
        from_parent = self.available(n.parent, key)
        lim = n.quota.get(key)
        if lim is not None and lim.borrowing_limit is not None:
            stored = self.subtree_quota(node, key) - self.guaranteed(node, key)
            used_in_parent = max(0.0, self.used(node, key) - self.guaranteed(node, key))
            from_parent = min(stored - used_in_parent + lim.borrowing_limit, from_parent)
        return local + from_parent


def capacity(tree: Tree, queue: str, key: Key, usage: Usage) -> float:
    """How much more of `key` the queue may take now (what a request must fit in)."""
    return max(0.0, Walk(tree, usage).available(queue_id(queue), key))


@dataclass(frozen=True)
class Fit:
    flavor: str | None  # None: no flavor fits
    borrowing: bool = False
    reason: str = ""  # why it does not fit (the first flavor's first short resource), or how it fits


def covered(tree: Tree, queue: str) -> frozenset[str]:
    """The resources a queue has quota for (in any flavor): only these are limited."""
    memo = tree.static.get(("covered", queue))  # type: ignore[call-overload]
    if memo is None:
        memo = frozenset(res for (_, res) in tree.nodes[queue_id(queue)].quota)
        tree.static[("covered", queue)] = memo  # type: ignore[index]
    return memo


def fit(tree: Tree, queue: str, flavors: list[str], request: Mapping[str, float], usage: Usage,
        walk: Walk | None = None, open_flavors: frozenset[str] = frozenset()) -> Fit:
    """The first of `flavors` (the queue's, in its order, already filtered to those the task
    may run on) where every covered resource of `request` fits (Kueue's default
    `whenCanBorrow: Borrow`: the first flavor that fits, borrowing or not). `walk`: one over
    `usage` kept across fits (the caller tells it what it charges). `open_flavors`: flavors
    whose missing quota limits nothing (a reservation's: its capacity is the limit, reserve.py)."""
    walk = walk if walk is not None else Walk(tree, usage)
    qid = queue_id(queue)
    node = tree.nodes[qid]
    wanted = {res: amt for res, amt in request.items() if amt > EPS and res in covered(tree, queue)}
    first_short = ""
    for flavor in flavors:
        short = ""
        borrowing = False
        for res, amt in sorted(wanted.items()):
            key = (flavor, res)
            if key not in node.quota:
                if flavor in open_flavors:
                    continue
                short = f"{queue}: flavor {flavor} has no {res} quota"
                break
            avail = walk.available(qid, key)
            if amt > avail + EPS:
                short = _short_reason(walk, queue, key, amt)
                break
            if walk.used(qid, key) + amt > walk.nominal(qid, key) + EPS:
                borrowing = True
        if not short:
            return Fit(flavor, borrowing, f"{queue}: fits on {flavor}" + (" by borrowing from its cohort"
                                                                         if borrowing else ""))
        first_short = first_short or short
    return Fit(None, False, first_short or f"{queue}: no flavor of the queue allows this task")


def _short_reason(walk: Walk, queue: str, key: Key, amount: float) -> str:
    qid = queue_id(queue)
    flavor, res = key
    used, nominal = walk.used(qid, key), walk.nominal(qid, key)
    text = f"{queue}: {used:g}/{nominal:g} {res} in use (flavor {flavor})"
    parent = walk.tree.nodes[qid].parent
    if parent is not None:
        lend = max(0.0, walk.available(qid, key) - max(0.0, nominal - used))
        text += f", cohort {parent[2:]} has {lend:g} to lend"
    return f"{text}; needs {amount:g}"


def add(usage: dict[str, dict[Key, float]], queue: str, flavor: str, request: Mapping[str, float],
        sign: float = 1.0) -> None:
    """Charge (or with sign -1, release) a request to a queue's usage, in place."""
    row = usage.setdefault(queue, {})
    for res, amt in request.items():
        if amt > EPS:
            row[(flavor, res)] = row.get((flavor, res), 0.0) + sign * amt
