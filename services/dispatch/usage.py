"""Fairshare RawUsage per (team, user), folded one metered interval at a time, pure.

Each `UsageRecorded` adds `billing × seconds` (the untruncated billing: fairshare's RawUsage,
not sreport's integer) decayed as Slurm's source decays it (decay.py). Keeping every interval
to recompute `decay.raw_usage` would grow with the log; instead each association keeps its
usage as of one instant, `as_of`, and since decay is a product (`f^a × f^b = f^(a+b)`) moving
that instant forward is one multiplication. The result equals `raw_usage` over all the
intervals (tests/test_dispatch_order.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import decay

Assoc = tuple[str, str]  # (team, user); a task with no team is under the team ""


@dataclass
class DecayedUsage:
    half_life_s: float = decay.DEFAULT_HALF_LIFE_S
    calc_period_s: float = decay.DEFAULT_CALC_PERIOD_S
    as_of: float = 0.0  # epoch seconds every value below is decayed to
    values: dict[Assoc, float] = field(default_factory=dict)
    version: int = 0  # bumped on every change: what the priority cache keys on

    def configure(self, half_life_s: float, calc_period_s: float) -> None:
        """A policy with another half-life: usage decayed so far stays as it is (as in Slurm)."""
        if (half_life_s, calc_period_s) != (self.half_life_s, self.calc_period_s):
            self.half_life_s, self.calc_period_s = half_life_s, calc_period_s
            self.version += 1

    def add(self, team: str, user: str, start: float, end: float, billing: float) -> None:
        """One interval [start, end) at `billing` units; end < start takes that stretch back
        (the ledger's correction of an over-metered stop)."""
        if billing <= 0 or start == end:
            return
        sign = 1.0
        if end < start:
            start, end, sign = end, start, -1.0
        if end > self.as_of:
            self._advance(end)
        run = decay.Run(start=start, end=end, billing=billing)
        added = decay.raw_usage([run], self.as_of, self.half_life_s, self.calc_period_s)
        key = (team, user)
        self.values[key] = max(0.0, self.values.get(key, 0.0) + sign * added)
        self.version += 1

    def _advance(self, t: float) -> None:
        m = decay.multiplier(t - self.as_of, self.half_life_s) if self.as_of else 1.0
        if m != 1.0:
            for k in self.values:
                self.values[k] *= m
        self.as_of = t

    def at(self, now: float) -> dict[Assoc, float]:
        """Every association's RawUsage at `now` (not before `as_of`: usage is never un-decayed)."""
        m = decay.multiplier(max(0.0, now - self.as_of), self.half_life_s) if self.as_of else 1.0
        return {k: v * m for k, v in self.values.items()}
