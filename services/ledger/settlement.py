"""Closing a period: the PeriodSettled event from the projection, and compensations for late usage.

A period is settled at a position of the log (`through_seq`, the ledger's checkpoint when it
settles): its totals per team are the usage booked in the period up to that position, through
`showback.settle`. Usage of the period that reaches the ledger after that position (even before
PeriodSettled itself is applied) is booked in the next open period, never in the settled one,
and the ledger records each such row as a CompensationRecorded event.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from skypurza.events.envelope import derive_id
from skypurza.events.models import CompensationRecorded, PeriodSettled

from .showback import UNASSIGNED, Compensation, UsageRow, parse_period, period_bounds, settle

HANDLER = "ledger-settlement"

_ROW_SQL = """
    SELECT event_id, cluster, start_at, end_at, cost_micros, "user", team, project, region,
           billing_seconds, period, booked_period
    FROM usage WHERE booked_period = ? AND seq <= ? ORDER BY seq"""


def _row(r: tuple[Any, ...]) -> UsageRow:
    return UsageRow(event_id=r[0], cluster=r[1], start=r[2].replace(tzinfo=UTC), end=r[3].replace(tzinfo=UTC),
                    cost_micros=r[4], user=r[5] or "", team=r[6], project=r[7], region=r[8],
                    billing_seconds=r[9])


def check_can_settle(period: str, now: datetime, settled: dict[str, int] | set[str]) -> None:
    parse_period(period)
    if period in settled:
        raise ValueError(f"period {period} is already settled; late usage is booked in a later period")
    end = period_bounds(period)[1]
    if now < end:
        raise ValueError(f"period {period} is not over until {end.isoformat()}; settle it after that")


def build_settlement(cur: Any, period: str, through_seq: int, settled: dict[str, int] | set[str],
                     now: datetime) -> PeriodSettled:
    """PeriodSettled for `period` from the projection as of `through_seq` (read through `cur`)."""
    check_can_settle(period, now, settled)
    rows, comps = [], []
    for r in cur.execute(_ROW_SQL, [period, through_seq]).fetchall():
        row = _row(r)
        if r[10] == period:
            rows.append(row)
        else:
            comps.append(Compensation(period=period, for_period=r[10], usage=row))
    s = settle(period, rows, comps, settled_periods=set(settled))
    return PeriodSettled(period=period, settled_at=now, totals_micros=s.totals_micros,
                         billing_seconds=s.billing_seconds, through_seq=through_seq)


_LATE_SQL = """
    SELECT u.event_id, u.team, u.cost_micros, u.period, u.booked_period
    FROM usage u
    WHERE u.booked_period <> u.period
      AND NOT EXISTS (SELECT 1 FROM compensations c WHERE c.usage_event_id = u.event_id)
    ORDER BY u.seq"""


def pending_compensations(cur: Any, already: set[str]) -> list[tuple[str, CompensationRecorded]]:
    """(event id, event) for each late usage row that has no CompensationRecorded yet."""
    out = []
    for event_id, team, cost, period, booked in cur.execute(_LATE_SQL).fetchall():
        if event_id in already:
            continue
        out.append((derive_id(event_id, HANDLER, "compensation"), CompensationRecorded(
            period=booked, for_period=period, team=team or UNASSIGNED, amount_micros=int(cost),
            usage_event_id=event_id)))
    return out
