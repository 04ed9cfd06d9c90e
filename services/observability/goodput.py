"""Goodput, pure: how much of the GPU time paid for did useful work.

Useful GPU-seconds come from node samples (events/nodesample.py): between two samples of one
node, each GPU whose utilisation is at least `busy_pct` counts the interval (at most `max_gap_s`:
a node that went quiet is not credited for the silence). Paid GPU-seconds are the ledger's
metered node time x the node's GPUs (`spend_summary`'s `gpu_seconds`), never a count of our own.
Both are keyed by the cluster's team and managed job (`(none)` when no managed job launched it),
as the ledger keys its spend, so the ratio and the idle dollars line up with the spend counters.

Samples are not on the log, so useful seconds count from when the endpoint started; `window`
subtracts the paid seconds already metered then, so the ratio compares the same stretch of time.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from skypurza.events.nodesample import NodeSample

UNASSIGNED = "(none)"
DEFAULT_BUSY_PCT = 10.0  # below this a GPU is idle: a loaded model waiting for work shows 0-5 %
DEFAULT_MAX_GAP_S = 60.0  # an agent samples every 10 s by default; a longer silence is not credited
MAX_NODES = 10_000  # nodes whose last sample time is kept (the least recently heard go first)
MAX_OWNERS = 100_000  # clusters whose owner is kept (the oldest provisioned go first)


@dataclass(frozen=True)
class Owner:
    team: str = UNASSIGNED
    job: str = UNASSIGNED  # the managed job id, as text


@dataclass
class GoodputFold:
    busy_pct: float = DEFAULT_BUSY_PCT
    max_gap_s: float = DEFAULT_MAX_GAP_S
    owners: OrderedDict[str, Owner] = field(default_factory=OrderedDict)  # cluster -> owner
    last_ts: OrderedDict[tuple[str, int], datetime] = field(default_factory=OrderedDict)
    useful_s: dict[tuple[str, str], float] = field(default_factory=dict)  # (team, job) -> GPU-seconds
    # The ledger's paid (GPU-seconds, GPU dollars) at the first scrape, per key: the window's start.
    paid_at_start: dict[str, dict[str, tuple[float, float]]] | None = None


def own(fold: GoodputFold, cluster: str, team: str | None, managed_job_id: int | None) -> None:
    """A cluster provisioned (ClusterProvisioned): whose its GPU time is."""
    fold.owners.pop(cluster, None)
    fold.owners[cluster] = Owner(team or UNASSIGNED, UNASSIGNED if managed_job_id is None else str(managed_job_id))
    while len(fold.owners) > MAX_OWNERS:
        fold.owners.popitem(last=False)


def busy_gpus(sample: NodeSample, busy_pct: float) -> int:
    return sum(1 for g in sample.gpus if g.utilization_pct is not None and g.utilization_pct >= busy_pct)


def observe(fold: GoodputFold, sample: NodeSample) -> float:
    """Credit the interval since the node's previous sample; the GPU-seconds credited."""
    try:
        ts = datetime.fromisoformat(sample.ts.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    node = (sample.cluster, sample.rank)
    prev = fold.last_ts.pop(node, None)
    fold.last_ts[node] = ts if prev is None else max(prev, ts)
    while len(fold.last_ts) > MAX_NODES:
        fold.last_ts.popitem(last=False)
    if prev is None or ts <= prev:  # the first sample, or one out of order: no interval
        return 0.0
    seconds = min((ts - prev).total_seconds(), fold.max_gap_s) * busy_gpus(sample, fold.busy_pct)
    if seconds <= 0:
        return 0.0
    owner = fold.owners.get(sample.cluster, Owner())
    key = (owner.team, owner.job)
    fold.useful_s[key] = fold.useful_s.get(key, 0.0) + seconds
    return seconds


@dataclass(frozen=True)
class Goodput:
    useful_s: float
    paid_s: float  # within the window
    ratio: float | None  # None: nothing paid in the window
    idle_dollars: float  # the window's cost of the GPU time that did no useful work


def ratio(useful_s: float, paid_s: float) -> float | None:
    """useful / paid in [0, 1]; None when nothing was paid (a ratio of nothing is no signal)."""
    if paid_s <= 0:
        return None
    return max(0.0, min(1.0, useful_s / paid_s))


def goodput(useful_s: float, paid_s: float, dollars: float) -> Goodput:
    """A key's goodput over the window and the idle cost it implies: the dollars paid for its
    GPU nodes in the window x the share of their GPU time that was idle."""
    r = ratio(useful_s, paid_s)
    return Goodput(useful_s, paid_s, r, 0.0 if r is None else max(0.0, dollars) * (1.0 - r))


def by(fold: GoodputFold, dim: str) -> dict[str, float]:
    """Useful GPU-seconds summed by `team` or `job`."""
    pos = 0 if dim == "team" else 1
    out: dict[str, float] = {}
    for key, s in fold.useful_s.items():
        out[key[pos]] = out.get(key[pos], 0.0) + s
    return out


Paid = dict[str, dict[str, tuple[float, float]]]  # dim -> key -> (GPU-seconds, dollars of GPU nodes)


def window(fold: GoodputFold, paid_now: Paid) -> Paid:
    """Paid GPU-seconds and GPU dollars since the first scrape, per dimension and key (the first
    call sets the start; a key first seen later starts at zero: all of it is in the window)."""
    if fold.paid_at_start is None:
        fold.paid_at_start = {d: dict(v) for d, v in paid_now.items()}
    start = fold.paid_at_start
    out: Paid = {}
    for d, keys in paid_now.items():
        out[d] = {}
        for k, (s, c) in keys.items():
            s0, c0 = start.get(d, {}).get(k, (0.0, 0.0))
            out[d][k] = (max(0.0, s - s0), max(0.0, c - c0))
    return out


def report(fold: GoodputFold, paid_now: Paid) -> dict[str, dict[str, Goodput]]:
    """Each team's and job's goodput over the window: useful (samples) over paid (ledger)."""
    win = window(fold, paid_now)
    out: dict[str, dict[str, Goodput]] = {}
    for dim in ("team", "job"):
        useful = by(fold, dim)
        paid = win.get(dim, {})
        out[dim] = {k: goodput(useful.get(k, 0.0), *paid.get(k, (0.0, 0.0))) for k in sorted(set(useful) | set(paid))}
    return out
