"""The usage reducer's fast UTC check (issue 21) never books a time in another zone as if it were
UTC: a usage interval is folded at its UTC instant and in its UTC month, whatever zone its event
wrote, as the full conversion did."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from skypurza.events.envelope import make_envelope
from skypurza.events.models import UsageRecorded
from skypurza.events.projection.records import decode_record
from skypurza.events.projection.state import apply
from skypurza.services.ledger import schema as sc
from skypurza.services.ledger.projector import FOLD, LedgerState

COLS = sc.USAGE.column_names
# 23:00 UTC on 31 October: in +02:00 it is already November.
AT = datetime(2026, 10, 31, 23, 0, tzinfo=UTC)


def _payload(i: int, zone: timezone) -> bytes:
    ev = UsageRecorded(cluster="c", rank=i, instance_id=f"i-{i}", start=AT.astimezone(zone),
                       end=(AT + timedelta(minutes=1)).astimezone(zone), hourly_price_micros=60_000_000,
                       cost_micros=1_000_000, user="u", team="t")
    return make_envelope(ev, source="/t", id=f"u{i}", time=AT).to_json()


def test_usage_in_any_zone_is_folded_at_its_utc_instant_and_month():
    zones = [UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30)), timezone.utc]
    state = LedgerState()
    state.start_batch()
    for i, zone in enumerate(zones):
        apply(state, decode_record(_payload(i, zone), i + 1), FOLD)
    rows = [dict(zip(COLS, r)) for r in state.usage_buffer().rows]
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert r["start_at"] == AT and r["end_at"] == AT + timedelta(minutes=1)
        assert r["start_at"].utcoffset() == timedelta(0) and r["end_at"].utcoffset() == timedelta(0)
        assert (r["start_at"].day, r["start_at"].hour) == (31, 23)  # the UTC wall time, not the zone's
        assert r["period"] == r["booked_period"] == "2026-10"
