"""Showback and chargeback: report grouping, money formatting, period settlement and the
compensating lines that late usage of a settled period becomes.

Pure data in, data out. Money is integer micro-dollars; billing is integer billing-seconds
(Slurm's stored integer billing × elapsed seconds, the basis sreport and GrpTRESRaw use).

Periods are UTC calendar months ("2026-11"). A usage row belongs to the period its start lies
in; metering never lets an interval cross a UTC midnight, so it lies wholly in that period.
Once a period is settled its totals never change: usage that arrives for it later is booked in
the next open period as a compensation, and reports show it as a line of its own.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal, get_args

__all__ = [
    "GROUP_BYS",
    "PROJECT_LABEL",
    "TEAM_LABEL",
    "UNASSIGNED",
    "Compensation",
    "GroupBy",
    "ReportLine",
    "Settlement",
    "UsageRow",
    "attribute",
    "book_late_usage",
    "format_dollars",
    "group_key",
    "micros_to_dollars",
    "next_period",
    "parse_period",
    "period_bounds",
    "period_of",
    "report",
    "settle",
]

GroupBy = Literal["user", "team", "project", "cluster", "region", "day"]
GROUP_BYS: tuple[str, ...] = get_args(GroupBy)
UNASSIGNED = "(none)"
TEAM_LABEL = "team"
PROJECT_LABEL = "project"
_PERIOD_RE = re.compile(r"^(\d{4})-(\d{2})$")


@dataclass(frozen=True)
class UsageRow:
    """One recorded usage interval, as the report and settlement need it."""

    event_id: str
    cluster: str
    start: datetime
    end: datetime
    cost_micros: int
    user: str = ""
    team: str | None = None
    project: str | None = None
    region: str | None = None
    billing_seconds: int = 0


@dataclass(frozen=True)
class Compensation:
    """Late usage of a settled period, booked in ``period`` (the next open one)."""

    period: str
    for_period: str
    usage: UsageRow

    @property
    def team(self) -> str:
        return self.usage.team or UNASSIGNED

    @property
    def amount_micros(self) -> int:
        return self.usage.cost_micros

    @property
    def usage_event_id(self) -> str:
        return self.usage.event_id


@dataclass(frozen=True)
class Settlement:
    period: str
    totals_micros: dict[str, int]  # team -> usage of the period + compensations booked in it
    billing_seconds: dict[str, int]
    usage_event_ids: frozenset[str]
    compensation_event_ids: frozenset[str]

    @property
    def total_micros(self) -> int:
        return sum(self.totals_micros.values())


@dataclass(frozen=True)
class ReportLine:
    key: str
    kind: Literal["usage", "compensation"]
    cost_micros: int
    billing_seconds: int
    rows: int
    for_period: str | None = None  # compensation lines: the settled period the usage belonged to

    def as_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "kind": self.kind,
            "cost_micros": self.cost_micros,
            "cost_usd": str(micros_to_dollars(self.cost_micros)),
            "billing_seconds": self.billing_seconds,
            "rows": self.rows,
            "for_period": self.for_period,
        }


# --------------------------------------------------------------------------------------------
# Money


def micros_to_dollars(micros: int) -> Decimal:
    """Exact dollars: 1_234_567 -> Decimal('1.234567')."""
    return Decimal(micros).scaleb(-6)


def format_dollars(micros: int, places: int = 2) -> str:
    """'$1,234.57' (half-up at ``places``); negative amounts as '-$0.01'."""
    if places < 0 or places > 6:
        raise ValueError(f"places must be 0..6 (micro-dollars carry 6), got {places}")
    q = micros_to_dollars(abs(micros)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    sign = "-" if micros < 0 and q != 0 else ""
    return f"{sign}${q:,.{places}f}"


# --------------------------------------------------------------------------------------------
# Periods


def _utc(name: str, t: datetime) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {t.isoformat()}")
    return t.astimezone(UTC)


def parse_period(period: str) -> tuple[int, int]:
    m = _PERIOD_RE.match(period)
    if not m or not 1 <= int(m.group(2)) <= 12:
        raise ValueError(f"period must be YYYY-MM (a UTC calendar month), e.g. 2026-11; got {period!r}")
    return int(m.group(1)), int(m.group(2))


def period_of(t: datetime) -> str:
    u = _utc("time", t)
    return f"{u.year:04d}-{u.month:02d}"


def next_period(period: str) -> str:
    y, m = parse_period(period)
    return f"{y + m // 12:04d}-{m % 12 + 1:02d}"


def period_bounds(period: str) -> tuple[datetime, datetime]:
    """[first instant, first instant of the next period) in UTC."""
    y, m = parse_period(period)
    ny, nm = parse_period(next_period(period))
    return datetime(y, m, 1, tzinfo=UTC), datetime(ny, nm, 1, tzinfo=UTC)


# --------------------------------------------------------------------------------------------
# Attribution and grouping


def attribute(
    user: str,
    labels: Mapping[str, str] | None = None,
    user_teams: Mapping[str, str] | None = None,
    default_team: str | None = None,
) -> tuple[str | None, str | None]:
    """(team, project) for a task: the task's ``team`` label, else the configured team of the
    user, else ``default_team``; the project from the ``project`` label."""
    labels = labels or {}
    team = labels.get(TEAM_LABEL) or (user_teams or {}).get(user) or default_team
    return team, labels.get(PROJECT_LABEL) or None


def group_key(row: UsageRow, by: str) -> str:
    if by == "user":
        return row.user or UNASSIGNED
    if by == "team":
        return row.team or UNASSIGNED
    if by == "project":
        return row.project or UNASSIGNED
    if by == "cluster":
        return row.cluster
    if by == "region":
        return row.region or UNASSIGNED
    if by == "day":
        return _utc("start", row.start).date().isoformat()
    raise ValueError(f"cannot group by {by!r}; accepted: {', '.join(GROUP_BYS)}")


def _in_range(t: datetime, since: datetime | None, until: datetime | None) -> bool:
    return (since is None or t >= since) and (until is None or t < until)


def report(
    rows: Iterable[UsageRow],
    by: str = "team",
    compensations: Iterable[Compensation] = (),
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[ReportLine]:
    """Totals per group: usage lines, then compensation lines (kept apart so a late correction
    shows as such), each sorted by key. Rows count by start in [since, until); compensations
    by the first instant of the period they are booked in. Rows are counted once per event id.
    """
    if by not in GROUP_BYS:
        raise ValueError(f"cannot group by {by!r}; accepted: {', '.join(GROUP_BYS)}")
    since = _utc("since", since) if since else None
    until = _utc("until", until) if until else None

    usage: dict[str, list[int]] = {}
    for row in _unique(rows):
        if not _in_range(_utc("start", row.start), since, until):
            continue
        acc = usage.setdefault(group_key(row, by), [0, 0, 0])
        acc[0] += row.cost_micros
        acc[1] += row.billing_seconds
        acc[2] += 1

    comp: dict[tuple[str, str], list[int]] = {}
    for c in _unique_compensations(compensations):
        booked_at = period_bounds(c.period)[0]
        if not _in_range(booked_at, since, until):
            continue
        key = booked_at.date().isoformat() if by == "day" else group_key(c.usage, by)
        acc = comp.setdefault((key, c.for_period), [0, 0, 0])
        acc[0] += c.amount_micros
        acc[1] += c.usage.billing_seconds
        acc[2] += 1

    lines = [ReportLine(k, "usage", v[0], v[1], v[2]) for k, v in sorted(usage.items())]
    lines += [
        ReportLine(k, "compensation", v[0], v[1], v[2], for_period=fp)
        for (k, fp), v in sorted(comp.items())
    ]
    return lines


def _unique(rows: Iterable[UsageRow]) -> list[UsageRow]:
    seen: dict[str, UsageRow] = {}
    for row in rows:
        prior = seen.get(row.event_id)
        if prior is None:
            seen[row.event_id] = row
        elif prior != row:
            raise ValueError(f"usage event {row.event_id!r} appears twice with different content")
    return list(seen.values())


def _unique_compensations(items: Iterable[Compensation]) -> list[Compensation]:
    seen: dict[str, Compensation] = {}
    for c in items:
        prior = seen.get(c.usage_event_id)
        if prior is None:
            seen[c.usage_event_id] = c
        elif prior != c:
            raise ValueError(f"usage event {c.usage_event_id!r} compensated twice differently")
    return list(seen.values())


# --------------------------------------------------------------------------------------------
# Settlement


def settle(
    period: str,
    rows: Iterable[UsageRow],
    compensations: Iterable[Compensation] = (),
    settled_periods: Collection[str] = (),
) -> Settlement:
    """Close ``period``: per-team totals of its usage plus the compensations booked in it.

    Refuses to settle a period twice, and refuses usage rows or compensations of another period
    (the caller selects them; a mismatch is a bug, not something to skip silently).
    """
    parse_period(period)
    if period in settled_periods:
        raise ValueError(f"period {period} is already settled; late usage is booked in a later period")
    totals: dict[str, int] = {}
    units: dict[str, int] = {}
    usage_ids: set[str] = set()
    for row in _unique(rows):
        row_period = period_of(row.start)
        if row_period != period:
            raise ValueError(f"usage {row.event_id!r} belongs to {row_period}, not {period}")
        team = row.team or UNASSIGNED
        totals[team] = totals.get(team, 0) + row.cost_micros
        units[team] = units.get(team, 0) + row.billing_seconds
        usage_ids.add(row.event_id)
    comp_ids: set[str] = set()
    for c in _unique_compensations(compensations):
        if c.period != period:
            raise ValueError(
                f"compensation for usage {c.usage_event_id!r} is booked in {c.period}, not {period}"
            )
        if c.usage_event_id in usage_ids:
            raise ValueError(f"usage {c.usage_event_id!r} is both usage and compensation of {period}")
        totals[c.team] = totals.get(c.team, 0) + c.amount_micros
        units[c.team] = units.get(c.team, 0) + c.usage.billing_seconds
        comp_ids.add(c.usage_event_id)
    return Settlement(
        period=period,
        totals_micros=dict(sorted(totals.items())),
        billing_seconds=dict(sorted(units.items())),
        usage_event_ids=frozenset(usage_ids),
        compensation_event_ids=frozenset(comp_ids),
    )


def book_late_usage(row: UsageRow, settled_periods: Collection[str]) -> Compensation | None:
    """None when the row's period is open (book it as usual); otherwise the compensation that
    books it in the first later period that is not settled."""
    own = period_of(row.start)
    if own not in settled_periods:
        return None
    target = next_period(own)
    while target in settled_periods:
        target = next_period(target)
    return Compensation(period=target, for_period=own, usage=row)
