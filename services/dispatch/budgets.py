"""Budgets, pure: dollars per day or month per team (or one user of it), from the cost the log
records (UsageRecorded.cost_micros, the ledger's metering), with a soft alert, a hard hold and a
forecast of when the budget runs out at the current burn rate.

An interval's cost counts in the period its end falls in (UTC), as the ledger's showback does.
The burn rate is the period's spend over the time elapsed in it: simple, and it never predicts
a run-out from a single tick's spike after a quiet month.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

from skypurza.events.dispatch_policy import Budget

MICROS = 1_000_000
State = Literal["ok", "alert", "exceeded"]
SpendKey = tuple[str, str | None, str]  # (team, user or None for the whole team, period key)


def period_bounds(period: str, at: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the day or month containing `at`, in UTC."""
    at = at.astimezone(timezone.utc)
    if period == "day":
        start = at.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + timedelta(days=1)
    start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, nxt


def period_key(period: str, at: datetime) -> str:
    start, _ = period_bounds(period, at)
    return start.strftime("%Y-%m-%d" if period == "day" else "%Y-%m")


def charge(spend: dict[SpendKey, int], team: str | None, user: str, end: datetime, cost_micros: int) -> None:
    """Book one interval's cost to its team's and its user's day and month, in place."""
    if not team:
        return
    for period in ("day", "month"):
        key = period_key(period, end)
        spend[(team, None, key)] = spend.get((team, None, key), 0) + cost_micros
        if user:
            spend[(team, user, key)] = spend.get((team, user, key), 0) + cost_micros


@dataclass(frozen=True)
class BudgetStatus:
    team: str
    user: str | None
    period: str
    period_key: str
    spent_usd: float
    limit_usd: float
    fraction: float
    state: State
    hard: bool
    resets_at: datetime
    runs_out_at: datetime | None  # at the current burn rate, within this period; None: it does not

    def holds(self) -> bool:
        return self.hard and self.state == "exceeded"

    def reason(self) -> str:
        who = f"{self.team}/{self.user}" if self.user else self.team
        word = "daily" if self.period == "day" else "monthly"
        return (f"{who}: ${self.spent_usd:,.2f} of ${self.limit_usd:,.2f} {word} budget spent (hard limit); "
                f"new work waits until {self.resets_at:%Y-%m-%d %H:%M} UTC or a higher limit")


def status(budget: Budget, spend: Mapping[SpendKey, int], now: datetime) -> BudgetStatus:
    start, end = period_bounds(budget.period, now)
    key = period_key(budget.period, now)
    spent = spend.get((budget.team, budget.user, key), 0) / MICROS
    fraction = spent / budget.limit_usd
    state: State = "exceeded" if fraction >= 1.0 else "alert" if fraction >= budget.alert_at else "ok"
    return BudgetStatus(budget.team, budget.user, budget.period, key, round(spent, 6), budget.limit_usd,
                        round(fraction, 6), state, budget.hard, end, forecast(spent, budget.limit_usd, start, end, now))


def forecast(spent: float, limit: float, start: datetime, end: datetime, now: datetime) -> datetime | None:
    """When `spent` reaches `limit` at the burn rate so far in [start, now); None if not before `end`."""
    if spent >= limit:
        return now if now < end else None
    elapsed = (now - start).total_seconds()
    if spent <= 0 or elapsed <= 0:
        return None
    left_s = (limit - spent) * elapsed / spent
    # Compared in seconds first: a tiny spend against a large limit would put `at` past year
    # 9999, which datetime cannot hold (the fold raised on such a UsageRecorded).
    if left_s >= (end - now).total_seconds():
        return None
    return now + timedelta(seconds=left_s)


def applicable(budgets: list[Budget], team: str | None, user: str) -> list[Budget]:
    """The budgets a submission of (team, user) is charged against: its team's, and its own."""
    return [b for b in budgets if team and b.team == team and (b.user is None or b.user == user)]


def first_hold(budgets: list[Budget], team: str | None, user: str, spend: Mapping[SpendKey, int],
               now: datetime) -> BudgetStatus | None:
    """The first hard budget of (team, user) that is spent, or None: new work may go."""
    for b in applicable(budgets, team, user):
        st = status(b, spend, now)
        if st.holds():
            return st
    return None
