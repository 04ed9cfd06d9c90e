"""Events of the `ledger` aggregate (keyed by billing period, e.g. 2026-11): settlement.

Emitted by: `spz ledger settle` (PeriodSettled), the ledger when usage arrives for a closed
period (CompensationRecorded: the late amount is booked in the next open period).
"""

from __future__ import annotations

from datetime import datetime

from .registry import Event, register


class _LedgerEvent(Event):
    AGGREGATE = "ledger"
    AGGREGATE_KEY = "period"
    period: str  # YYYY-MM


@register
class PeriodSettled(_LedgerEvent):
    EVENT_NAME = "period_settled"
    settled_at: datetime
    totals_micros: dict[str, int]  # team -> micro-dollars
    billing_seconds: dict[str, int] = {}  # team -> billing units x seconds (integers: exact sums)
    through_seq: int = 0


@register
class CompensationRecorded(_LedgerEvent):
    EVENT_NAME = "compensation_recorded"
    for_period: str  # the settled period the late usage belonged to
    team: str
    amount_micros: int
    usage_event_id: str
