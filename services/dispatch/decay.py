"""Slurm's half-life decay of fairshare usage (RawUsage), as its source does it. Pure.

Slurm does not decay by 2^(-t/HL). Its decay thread takes the first-order series of
e^(ln(1/2)/HL), `decay_factor = 1 - 0.693/HL` per second, and every PriorityCalcPeriod multiplies
the usage by `decay_factor ** Δt`; a running job adds `Δt × decay_factor ** Δt × billing ×
UsageFactor` on each pass (src/plugins/priority/multifactor/priority_multifactor.c,
`_decay_thread`, `_apply_new_usage`). After exactly one half-life the multiplier is 0.500073,
not 0.5; after one day with HL = 7 days it is 0.905743 (exactly: 0.905724).

The usage a run adds, undecayed, is the *untruncated* billing × seconds × UsageFactor (the
ledger's `billing.fairshare_usage`); `sreport` and GrpTRESRaw use the truncated integer billing
instead, which is not what fairshare sees (docs/billing.md).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Iterable

DEFAULT_HALF_LIFE_S = 7 * 86400  # PriorityDecayHalfLife=7-0
DEFAULT_CALC_PERIOD_S = 300  # PriorityCalcPeriod=5 (minutes)
# Slurm clamps the multiplier of one pass at DBL_MIN so that usage never becomes exactly 0.
_DBL_MIN = sys.float_info.min


def decay_factor(half_life_s: float) -> float:
    """The per-second factor; 1 (no decay) when the half-life is 0, as PriorityDecayHalfLife=0."""
    if half_life_s < 0:
        raise ValueError(f"half-life must be >= 0 seconds, got {half_life_s}")
    return 1.0 - 0.693 / half_life_s if half_life_s > 0 else 1.0


def multiplier(seconds: float, half_life_s: float) -> float:
    """What usage is multiplied by over `seconds` (one pass of that length), at least DBL_MIN."""
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds}")
    f = decay_factor(half_life_s)
    if f == 1.0 or seconds == 0:
        return 1.0
    if f <= 0.0:  # a half-life under 0.693 s: Slurm's pow of a negative base; usage is gone
        return _DBL_MIN
    return max(_DBL_MIN, math.pow(f, seconds))


def accrue(usage: float, seconds: float, billing: float, half_life_s: float,
           usage_factor: float = 1.0) -> float:
    """One calc pass of `seconds`: the old usage decayed, plus what a job of `billing` running
    the whole pass adds (`Δt × f^Δt × billing × UsageFactor`)."""
    if billing < 0 or usage_factor < 0:
        raise ValueError("billing and usage factor must be >= 0")
    m = multiplier(seconds, half_life_s)
    return usage * m + seconds * m * billing * usage_factor


@dataclass(frozen=True)
class Run:
    """A stretch of usage: `billing` (untruncated) from `start` to `end`, epoch seconds."""

    start: float
    end: float
    billing: float
    usage_factor: float = 1.0


def raw_usage(runs: Iterable[Run], now: float, half_life_s: float = DEFAULT_HALF_LIFE_S,
              calc_period_s: float = DEFAULT_CALC_PERIOD_S) -> float:
    """RawUsage at `now` of the runs, with Slurm's passes every `calc_period_s` on the epoch's
    grid: each run is cut at the passes; a piece of Δ seconds ending at a pass (or at the run's
    end, or `now`) adds Δ × f^Δ × billing × UsageFactor there, then decays with f^(now − that
    time). Usage after `now` is not counted. With HL = 0 this is the plain Σ billing × seconds ×
    UsageFactor."""
    if calc_period_s <= 0:
        raise ValueError(f"calc period must be > 0 seconds, got {calc_period_s}")
    terms: list[float] = []
    p = float(calc_period_s)
    for r in runs:
        if r.end < r.start:
            raise ValueError(f"a run ends ({r.end}) before it starts ({r.start})")
        if r.billing < 0 or r.usage_factor < 0:
            raise ValueError("billing and usage factor must be >= 0")
        end = min(r.end, now)
        if end <= r.start:
            continue
        rate = r.billing * r.usage_factor
        first_edge = min(end, (math.floor(r.start / p) + 1) * p)
        last_edge = max(first_edge, math.floor(end / p) * p)
        # the piece up to the first pass, and the piece after the last one
        for a, b in ((r.start, first_edge), (last_edge, end)):
            if b > a:
                d = b - a
                terms.append(d * multiplier(d, half_life_s) * rate * multiplier(now - b, half_life_s))
        # whole periods in between: a geometric series (one term per pass; no loop over them)
        n = round((last_edge - first_edge) / p)
        if n > 0:
            g = multiplier(p, half_life_s)
            newest = multiplier(now - last_edge, half_life_s)
            series = float(n) if g == 1.0 else (1.0 - g ** n) / (1.0 - g)
            terms.append(p * g * rate * newest * series)
    return math.fsum(terms)


def shown_raw_usage(usage: float) -> int:
    """sshare prints RawUsage as a whole number, truncated: 5.25 × 15 s = 78.75 shows as 78."""
    return int(usage)
