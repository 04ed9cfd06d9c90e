"""Slurm's multifactor job priority (`sprio -l`): each factor in [0, 1] times its weight, summed,
truncated to an integer and clamped to [1, 2^32 − 1] (0 means held). Pure.

The order of the sum and the clamping are the source's (`_get_priority_internal` in
src/plugins/priority/multifactor/priority_multifactor.c):
    site + age + assoc + fairshare + jobsize + partition + qos + Σ tres − nice
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

UINT32_MAX = 0xFFFFFFFF
DEFAULT_MAX_AGE_S = 7 * 86400  # PriorityMaxAge=7-0
FACTORS = ("age", "assoc", "fairshare", "jobsize", "partition", "qos")


@dataclass(frozen=True)
class Weights:
    """PriorityWeight* (unsigned 32-bit integers) and PriorityWeightTRES (doubles, per TRES)."""

    age: int = 0
    assoc: int = 0
    fairshare: int = 0
    jobsize: int = 0
    partition: int = 0
    qos: int = 0
    tres: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Factors:
    """A job's factors, each in [0, 1]; `nice` (−2147483645..2147483645) and `site` are added
    as they are (site_factor, nice adjust the sum, they are not weighted)."""

    age: float = 0.0
    assoc: float = 0.0
    fairshare: float = 0.0
    jobsize: float = 0.0
    partition: float = 0.0
    qos: float = 0.0
    tres: Mapping[str, float] = field(default_factory=dict)
    site: int = 0
    nice: int = 0


@dataclass(frozen=True)
class Priority:
    """The integer Slurm shows and each weighted term (as `sprio -l` lists them)."""

    priority: int
    weighted: dict[str, float]
    weighted_tres: dict[str, float]
    site: int
    nice: int


def priority(w: Weights, f: Factors) -> Priority:
    weighted = {name: getattr(f, name) * float(getattr(w, name)) for name in FACTORS}
    weighted_tres = {t: f.tres.get(t, 0.0) * float(wt) for t, wt in w.tres.items()}
    tres_sum = 0.0
    for value in weighted_tres.values():  # Slurm adds them in TRES order, one double at a time
        tres_sum += value
    total = (float(f.site) + weighted["age"] + weighted["assoc"] + weighted["fairshare"] + weighted["jobsize"]
             + weighted["partition"] + weighted["qos"] + tres_sum - float(f.nice))
    return Priority(priority=clamp(total), weighted=weighted, weighted_tres=weighted_tres, site=f.site, nice=f.nice)


def clamp(total: float) -> int:
    """Below 1 is 1 (0 is reserved for held jobs); above 2^32 − 1 is 2^32 − 1; else truncated."""
    if math.isnan(total) or total < 1:
        return 1
    if total >= UINT32_MAX:
        return UINT32_MAX
    return int(total)


def age_factor(waited_s: float, max_age_s: float = DEFAULT_MAX_AGE_S) -> float:
    """min(1, eligible time waited / PriorityMaxAge); Slurm counts whole seconds."""
    if max_age_s <= 0:
        raise ValueError(f"PriorityMaxAge must be > 0 seconds, got {max_age_s}")
    diff = max(0, int(waited_s))
    return 1.0 if diff >= max_age_s else diff / float(max_age_s)


def jobsize_factor(min_nodes: int, nodes_total: int, cpus: int, cpus_total: int, *, favor_small: bool = False,
                   relative_to_time: bool = False, time_limit_min: int | None = None) -> float:
    """The job size factor, clamped to [0, 1].

    - favor large (default): (min_nodes/N + cpus/C)/2, or min_nodes/N alone when cpus is 0;
    - PriorityFavorSmall=YES: ((N − min_nodes)/N + (C − cpus)/C)/2, or (N − min_nodes)/N;
    - SMALL_RELATIVE_TO_TIME: max(cpus, min_nodes × C/N) / time limit (minutes) / C, and
      1 − that when favouring small jobs.
    """
    if nodes_total <= 0 or cpus_total <= 0:
        raise ValueError("nodes_total and cpus_total must be > 0")
    n, c = float(nodes_total), float(cpus_total)
    if relative_to_time:
        limit = float(time_limit_min) if time_limit_min else 1.0
        js = max(float(min_nodes) * c / n, float(cpus)) / limit / c
        if favor_small:
            js = 1.0 - js
    elif favor_small:
        js = (n - min_nodes) / n
        if cpus:
            js = (js + (c - cpus) / c) / 2
    else:
        js = min_nodes / n
        if cpus:
            js = (js + cpus / c) / 2
    return min(1.0, max(0.0, js))


def normalised(value: float, highest: float) -> float:
    """Partition, QOS and association factors: the value over the highest configured one
    (the doc's partitions 20 and 10 with weight 5000 give 5000 and 2500); 0 when none is set."""
    return value / highest if highest > 0 else 0.0


def tres_factor(count: float, total: float) -> float:
    """A TRES factor: the job's count over the partition's total of that TRES."""
    return count / total if total > 0 else 0.0
