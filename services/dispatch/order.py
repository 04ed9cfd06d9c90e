"""Admission order, pure: Slurm's multifactor priority of every pending task (`sprio -l`), over
the policy's `priority:` section, the fairshare tree of its teams and users and their decayed
usage (usage.py). The pending set is admitted highest priority first, then by submission
(Slurm: "then submit time, then job id").

The fairshare tree is root -> team -> user: a team's RawShares from `priority.shares` (1 when
not given), a user's from that team's `users` (1 when not given). Its members are every
(team, user) the policy names, that has usage, or that has a task pending; Fair Tree ranks
users, so one new user changes every rank, and the tree is computed once per pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from skypurza.events.dispatch_policy import PriorityConfig

from . import fairshare, priority
from .demand import Pending
from .usage import Assoc

NO_TEAM = "-"  # the tree's account for a task with no team (fairshare needs a name)


@dataclass(frozen=True)
class Ranked:
    """One pending task's priority and what it is made of (the unweighted factors too)."""

    task_id: str
    priority: int
    weighted: dict[str, float]
    weighted_tres: dict[str, float]
    factors: dict[str, float]
    nice: int


def share_tree(cfg: PriorityConfig, members: Iterable[Assoc], usage: Mapping[Assoc, float]) -> fairshare.Node:
    """root -> teams -> users, with the policy's shares and the decayed usage."""
    shares = {s.team: s for s in cfg.shares}
    teams: dict[str, set[str]] = {}
    for s in cfg.shares:
        teams.setdefault(s.team, set()).update(s.users)
    for team, user in list(members) + list(usage):
        teams.setdefault(team, set()).add(user)
    children = []
    for team in sorted(teams):
        ts = shares.get(team)
        users = tuple(fairshare.Node(name=u, shares=(ts.users.get(u, 1) if ts else 1), user=True,
                                     usage=usage.get((team, u), 0.0))
                      for u in sorted(teams[team]))
        children.append(fairshare.Node(name=team, shares=ts.shares if ts else 1, children=users))
    return fairshare.Node(name="root", children=tuple(children))


def fairshare_factors(cfg: PriorityConfig, tree: fairshare.Node) -> dict[Assoc, float]:
    """(team, user) -> the FairShare factor of the user's association."""
    out: dict[Assoc, float] = {}
    for r in fairshare.compute(tree, cfg.algorithm):
        if r.user:
            team = r.path.split("/")[1]
            out[(team, r.name)] = r.fairshare or 0.0
    return out


def rank(cfg: PriorityConfig | None, pending: list[Pending], fs: Mapping[Assoc, float], now: float) -> list[Ranked]:
    """Each pending task's priority, in the order given (no `priority:` section: all 1)."""
    if cfg is None:
        return [Ranked(p.task_id, 1, {}, {}, {}, 0) for p in pending]
    w = cfg.weights
    weights = priority.Weights(age=w.age, fairshare=w.fairshare, jobsize=w.jobsize, qos=w.qos,
                               tres=dict(cfg.tres_weights))
    classes = {c.name: c.value for c in cfg.classes}
    top_class = max(classes.values(), default=0)
    cpus_total = cfg.cpus_total or max((p.request.get("cpu", 0.0) for p in pending), default=0.0) or 1.0
    nodes_total = cfg.nodes_total or max((p.nodes for p in pending), default=1)
    tres_totals = {t: cfg.tres_totals.get(t) or max((p.request.get(t, 0.0) for p in pending), default=0.0)
                   for t in cfg.tres_weights}
    out = []
    for p in pending:
        cpus = p.request.get("cpu", 0.0)
        f = priority.Factors(
            age=priority.age_factor(now - p.submitted_at, cfg.max_age_s) if p.submitted_at else 0.0,
            fairshare=fs.get(assoc_of(p), 0.0),
            jobsize=_jobsize(p.nodes, nodes_total, cpus, cpus_total, cfg.favor_small),
            qos=priority.normalised(classes.get(p.priority_class or "", 0), top_class),
            tres={t: min(1.0, priority.tres_factor(p.request.get(t, 0.0), tot)) for t, tot in tres_totals.items()},
            nice=-p.boost,
        )
        pr = priority.priority(weights, f)
        out.append(Ranked(p.task_id, pr.priority, pr.weighted, pr.weighted_tres,
                          {"age": f.age, "fairshare": f.fairshare, "jobsize": f.jobsize, "qos": f.qos,
                           **{f"tres/{t}": v for t, v in f.tres.items()}}, f.nice))
    return out


def assoc_of(p: Pending) -> Assoc:
    return (p.team or NO_TEAM, p.user or NO_TEAM)


def _jobsize(nodes: int, nodes_total: int, cpus: float, cpus_total: float, favor_small: bool) -> float:
    """priority.jobsize_factor's favour-large / PriorityFavorSmall forms, on fractional CPUs
    (SkyPilot's 0.5) and capped at the totals; the nodes part alone when it asks no CPU."""
    node_part = min(nodes, nodes_total) / float(nodes_total)
    if favor_small:
        node_part = 1.0 - node_part
    if cpus <= 0:
        return node_part
    cpu_part = min(cpus, cpus_total) / float(cpus_total)
    if favor_small:
        cpu_part = 1.0 - cpu_part
    return (node_part + cpu_part) / 2


def ordered(pending: list[Pending], ranked: list[Ranked]) -> list[Pending]:
    """Highest priority first; equal priorities by submission (the stream sequence)."""
    prio = {r.task_id: r.priority for r in ranked}
    return sorted(pending, key=lambda p: (-prio.get(p.task_id, 1), p.seq))


def admission_order(cfg: PriorityConfig, pending: list[Pending], fs: Mapping[Assoc, float],
                    now: float) -> list[Pending]:
    """`ordered(pending, rank(...))` without what only `sprio` shows: the same integer
    priorities (the sum in Slurm's order, clamped), skipping factors whose weight is 0, so a
    pass over 10,000 tasks spends its time deciding, not explaining."""
    w = cfg.weights
    classes = {c.name: c.value for c in cfg.classes}
    top_class = max(classes.values(), default=0)
    cpus_total = cfg.cpus_total or max((p.request.get("cpu", 0.0) for p in pending), default=0.0) or 1.0
    nodes_total = cfg.nodes_total or max((p.nodes for p in pending), default=1)
    tres = [(t, float(wt), cfg.tres_totals.get(t) or max((p.request.get(t, 0.0) for p in pending), default=0.0))
            for t, wt in cfg.tres_weights.items()]
    keys = []
    for p in pending:
        total = 0.0
        if w.age and p.submitted_at:
            total += priority.age_factor(now - p.submitted_at, cfg.max_age_s) * float(w.age)
        if w.fairshare:
            total += fs.get(assoc_of(p), 0.0) * float(w.fairshare)
        if w.jobsize:
            total += _jobsize(p.nodes, nodes_total, p.request.get("cpu", 0.0), cpus_total, cfg.favor_small) \
                * float(w.jobsize)
        if w.qos and top_class:
            total += priority.normalised(classes.get(p.priority_class or "", 0), top_class) * float(w.qos)
        tres_sum = 0.0
        for t, wt, tot in tres:
            tres_sum += min(1.0, priority.tres_factor(p.request.get(t, 0.0), tot)) * wt
        keys.append((-priority.clamp(total + tres_sum + float(p.boost)), p.seq, p))
    keys.sort(key=lambda k: (k[0], k[1]))
    return [k[2] for k in keys]
