"""Slurm's fairshare over a tree of accounts and users: Fair Tree (the default since 19.05) and
classic (`PriorityFlags=NO_FAIR_TREE`). Pure: a tree in, one row per association out, the
numbers `sshare -l` shows (docs/dispatch.md, *Fairshare*).

Where Slurm's documentation and its source disagree, this follows the source
(src/plugins/priority/multifactor/fair_tree.c, priority_multifactor.c, assoc_mgr.c):
- Fair Tree never merges the children of tied sibling accounts (the doc says it does; the
  source's `_count_tied_accounts` stops at the first account it meets, and users sort before
  accounts on ties, so it always counts 0). A tied account passes the tie to its first child.
- Classic divides the exponent by FairShareDampeningFactor, which the doc's refined formula
  leaves out.
Sorting is stable: siblings with equal LevelFS keep their order in the tree (Slurm's qsort
gives no order; glibc's merge sort keeps the list's, which is what this reproduces).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Literal

Algorithm = Literal["fair_tree", "classic"]
ALGORITHMS: tuple[Algorithm, ...] = ("fair_tree", "classic")

# Slurm's NO_VAL, as the long double it starts `prev_level_fs` at: kept so a first sibling whose
# LevelFS happened to equal it would be "tied" exactly as in Slurm.
_NO_VAL = float(0xFFFFFFFE)


@dataclass(frozen=True)
class Node:
    """One association as given: an account (with children) or a user (a leaf).

    `usage` is RawUsage (decayed billing-seconds). An account's RawUsage is the sum of its
    children's, as Slurm accrues every job's usage up the tree; the caller checks that an
    account's given usage agrees (whatif.py)."""

    name: str
    shares: int = 1
    usage: float = 0.0
    user: bool = False
    children: tuple["Node", ...] = ()


@dataclass
class Row:
    """What `sshare -l` shows for one association. `level_fs` is None where Slurm computes
    none (classic); `fairshare` is None for a Fair Tree account (Slurm ranks users only)."""

    path: str
    name: str
    user: bool
    depth: int
    raw_shares: int
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effectv_usage: float
    level_fs: float | None
    fairshare: float | None


@dataclass
class _Assoc:
    node: Node
    path: str
    depth: int
    parent: "_Assoc | None"
    raw_usage: float
    children: list["_Assoc"] = field(default_factory=list)
    level_shares: int = 0  # Σ RawShares of this association and its siblings
    norm_shares: float = 0.0
    norm_usage: float = 0.0
    effectv_usage: float = 0.0
    level_fs: float | None = None
    fairshare: float | None = None


def compute(root: Node, algorithm: Algorithm = "fair_tree", dampening: int = 1) -> list[Row]:
    """Every association of the tree below `root`, depth first in the tree's order."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r}; accepted: {', '.join(ALGORITHMS)}")
    if dampening < 1:
        raise ValueError(f"FairShareDampeningFactor must be at least 1, got {dampening}")
    top = _build(root, "", 0, None)
    for a in _walk(top):
        total = sum(c.node.shares for c in a.children)
        for c in a.children:
            c.level_shares = total
    root_usage = top.raw_usage
    for a in _walk(top):
        if a is not top:
            a.norm_usage = _norm_usage(a.raw_usage, root_usage)
    if algorithm == "fair_tree":
        _fair_tree(top)
    else:
        _classic(top, dampening)
    return [Row(path=a.path, name=a.node.name, user=a.node.user, depth=a.depth, raw_shares=a.node.shares,
                norm_shares=a.norm_shares, raw_usage=a.raw_usage, norm_usage=a.norm_usage,
                effectv_usage=a.effectv_usage, level_fs=a.level_fs, fairshare=a.fairshare)
            for a in _walk(top) if a is not top]


def user_count(root: Node) -> int:
    return sum(1 for n in _nodes(root) if n.user)


# ------------------------------------------------------------------ shared


def _build(node: Node, parent_path: str, depth: int, parent: _Assoc | None) -> _Assoc:
    path = "" if parent is None else f"{parent_path}/{node.name}"
    a = _Assoc(node=node, path=path, depth=depth, parent=parent, raw_usage=float(node.usage))
    a.children = [_build(c, path, depth + 1, a) for c in node.children]
    if a.children:
        # Slurm adds every job's usage to its association and each one above it.
        a.raw_usage = math.fsum(c.raw_usage for c in a.children)
    return a


def _walk(a: _Assoc) -> Iterator[_Assoc]:
    yield a
    for c in a.children:
        yield from _walk(c)


def _nodes(n: Node) -> Iterator[Node]:
    yield n
    for c in n.children:
        yield from _nodes(c)


def _norm_usage(raw: float, root_raw: float) -> float:
    """set_assoc_usage_norm: RawUsage / the root's, 0 when nothing was used anywhere, and at
    most 1 (a half-life changed at run time can leave more usage than the new one allows)."""
    if not root_raw:
        return 0.0
    return min(1.0, raw / root_raw)


# ------------------------------------------------------------------ Fair Tree


def _fair_tree(top: _Assoc) -> None:
    for a in _walk(top):
        if a is top:
            continue
        # Fair Tree: shares and usage both normalised within the level only.
        a.norm_shares = a.node.shares / a.level_shares if a.level_shares else 0.0
        parent_usage = a.parent.raw_usage if a.parent else 0.0
        a.effectv_usage = a.raw_usage / parent_usage if parent_usage else 0.0
        a.level_fs = _level_fs(a.norm_shares, a.effectv_usage)
    users = sum(1 for a in _walk(top) if a.node.user)
    state = _Rank(rank=users, rnt=users, users=users)
    _rank_level(top.children, state, account_tied=False)


def _level_fs(s: float, u: float) -> float:
    """LF = S / U: 0 when S is 0 (whatever U), infinity when U is 0 and S is not."""
    if s == 0.0:
        return 0.0
    if u == 0.0:
        return math.inf
    return s / u


@dataclass
class _Rank:
    rank: int  # the rank the next tied user gets
    rnt: int  # rank, no ties: what the next user's rank is when it is not tied
    users: int  # every user association of the tree


def _rank_level(siblings: list[_Assoc], st: _Rank, account_tied: bool) -> None:
    # Higher LevelFS first; on a tie users before accounts; otherwise the tree's order.
    ordered = sorted(siblings, key=lambda a: (-(a.level_fs or 0.0), 0 if a.node.user else 1))
    prev = _NO_VAL
    for i, a in enumerate(ordered):
        tied = True if (i == 0 and account_tied) else (prev == a.level_fs)
        if a.node.user:
            if not tied:
                st.rank = st.rnt
            a.fairshare = st.rank / st.users
            st.rnt -= 1
        else:
            _rank_level(a.children, st, tied)
        prev = a.level_fs if a.level_fs is not None else _NO_VAL


# ------------------------------------------------------------------ classic


def _classic(top: _Assoc, dampening: int) -> None:
    top.norm_shares = 1.0
    top.effectv_usage = 1.0  # Slurm's init() sets the root's usage_efctv to 1.0
    for a in _walk(top):
        if a is top:
            continue
        parent = a.parent
        assert parent is not None
        share = a.node.shares / a.level_shares if a.level_shares else 0.0
        # NormShares: the product of the share fractions down the tree.
        a.norm_shares = parent.norm_shares * share if parent is not top else share
        if parent is top:
            a.effectv_usage = a.norm_usage  # the tier under root: its actual usage
        elif not a.level_shares:
            a.effectv_usage = parent.effectv_usage  # no sibling has shares: the parent's
        else:
            ua = a.norm_usage
            a.effectv_usage = ua + (parent.effectv_usage - ua) * (a.node.shares / a.level_shares)
        a.fairshare = calc_fs_factor(a.effectv_usage, a.norm_shares, dampening)


def calc_fs_factor(usage_efctv: float, shares_norm: float, dampening: int = 1) -> float:
    """priority_p_calc_fs_factor: F = 2^(-(UE/S)/d); 0 when S is not positive."""
    if shares_norm <= 0:
        return 0.0
    return math.pow(2.0, -((usage_efctv / shares_norm) / dampening))
