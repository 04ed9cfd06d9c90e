"""Showback: grouping, money formatting, settlement, and late usage as a compensating line."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from skypurza.services.ledger.billing import billing
from skypurza.services.ledger.metering import (
    MeteredNode,
    advance,
    instance_tres,
    interval_billing_seconds,
    next_intervals,
)
from skypurza.services.ledger.showback import (
    GROUP_BYS,
    UNASSIGNED,
    Compensation,
    UsageRow,
    attribute,
    book_late_usage,
    format_dollars,
    group_key,
    micros_to_dollars,
    next_period,
    parse_period,
    period_bounds,
    period_of,
    report,
    settle,
)


def at(day: int, hour: int = 0, month: int = 11) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


def row(eid: str, team: str | None, cost: int, start: datetime, **kw) -> UsageRow:
    return UsageRow(
        event_id=eid,
        cluster=kw.pop("cluster", "c1"),
        start=start,
        end=start + timedelta(minutes=1),
        cost_micros=cost,
        team=team,
        **kw,
    )


# ---------------------------------------------------------------------------------------------
# Money and periods


def test_money() -> None:
    assert micros_to_dollars(1_234_567) == Decimal("1.234567")
    assert format_dollars(1_234_567_890) == "$1,234.57"
    assert format_dollars(5_000) == "$0.01"  # half-up
    assert format_dollars(4_999) == "$0.00"
    assert format_dollars(-5_000) == "-$0.01"
    assert format_dollars(-4_999) == "$0.00"  # no "-$0.00"
    assert format_dollars(1_234_567, places=6) == "$1.234567"
    with pytest.raises(ValueError, match="places must be 0..6"):
        format_dollars(1, places=7)


def test_periods() -> None:
    assert period_of(datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC)) == "2026-11"
    assert period_of(datetime(2026, 12, 1, tzinfo=UTC)) == "2026-12"
    assert next_period("2026-11") == "2026-12"
    assert next_period("2026-12") == "2027-01"
    assert period_bounds("2026-12") == (at(1, month=12), datetime(2027, 1, 1, tzinfo=UTC))
    for bad in ("2026-13", "2026-1", "26-11", "2026/11"):
        with pytest.raises(ValueError, match="YYYY-MM"):
            parse_period(bad)
    with pytest.raises(ValueError, match="timezone-aware"):
        period_of(datetime(2026, 11, 1))


# ---------------------------------------------------------------------------------------------
# Attribution and grouping


def test_attribution_label_wins_over_config() -> None:
    teams = {"alice": "vision"}
    assert attribute("alice", {}, teams) == ("vision", None)
    assert attribute("alice", {"team": "nlp", "project": "llm"}, teams) == ("nlp", "llm")
    assert attribute("bob", None, teams, default_team="misc") == ("misc", None)
    assert attribute("bob", None, teams) == (None, None)


def test_group_keys() -> None:
    r = row("e1", "vision", 10, at(3, 5), user="alice", project="p", region="us-east-1", cluster="c9")
    assert {by: group_key(r, by) for by in GROUP_BYS} == {
        "user": "alice",
        "team": "vision",
        "project": "p",
        "cluster": "c9",
        "region": "us-east-1",
        "day": "2026-11-03",
    }
    bare = row("e2", None, 10, at(3))
    assert group_key(bare, "team") == group_key(bare, "user") == UNASSIGNED
    with pytest.raises(ValueError, match="cannot group by 'zone'; accepted: user, team"):
        group_key(bare, "zone")


def test_report_groups_filters_and_counts_each_event_once() -> None:
    rows = [
        row("e1", "vision", 100, at(1, 1), billing_seconds=60),
        row("e2", "vision", 50, at(2, 1), billing_seconds=30),
        row("e3", "nlp", 7, at(2, 2)),
        row("e1", "vision", 100, at(1, 1), billing_seconds=60),  # redelivered
    ]
    lines = report(rows, by="team")
    assert [(l.key, l.kind, l.cost_micros, l.billing_seconds, l.rows) for l in lines] == [
        ("nlp", "usage", 7, 0, 1),
        ("vision", "usage", 150, 90, 2),
    ]
    by_day = report(rows, by="day", since=at(2), until=at(3))
    assert [(l.key, l.cost_micros) for l in by_day] == [("2026-11-02", 57)]
    assert lines[1].as_dict()["cost_usd"] == "0.000150"
    with pytest.raises(ValueError, match="appears twice with different content"):
        report([row("e1", "vision", 1, at(1)), row("e1", "vision", 2, at(1))])


# ---------------------------------------------------------------------------------------------
# Settlement and compensation


def test_settle_totals_per_team() -> None:
    rows = [row("a", "vision", 300, at(1)), row("b", "vision", 200, at(30, 23)), row("c", None, 5, at(9))]
    s = settle("2026-11", rows)
    assert s.totals_micros == {UNASSIGNED: 5, "vision": 500}
    assert s.total_micros == 505
    assert s.usage_event_ids == {"a", "b", "c"}
    with pytest.raises(ValueError, match="already settled"):
        settle("2026-11", rows, settled_periods={"2026-11"})
    with pytest.raises(ValueError, match="belongs to 2026-12, not 2026-11"):
        settle("2026-11", [row("d", "vision", 1, at(1, month=12))])


def test_late_usage_becomes_a_compensating_line_in_the_next_period() -> None:
    nov = [row("a", "vision", 300, at(1)), row("b", "nlp", 200, at(2))]
    settled_nov = settle("2026-11", nov)
    settled = {"2026-11"}

    # Usage for November that arrives after settlement, and December's own usage.
    late = row("late", "vision", 40, at(30, 22))
    assert book_late_usage(nov[0], set()) is None  # open period: booked normally
    comp = book_late_usage(late, settled)
    assert comp == Compensation(period="2026-12", for_period="2026-11", usage=late)
    assert (comp.team, comp.amount_micros, comp.usage_event_id) == ("vision", 40, "late")

    dec = [row("d", "vision", 1000, at(3, month=12))]
    settled_dec = settle("2026-12", dec, compensations=[comp], settled_periods=settled)
    assert settled_dec.totals_micros == {"vision": 1040}
    assert settled_dec.compensation_event_ids == {"late"}
    # November's settlement is not touched by the late event.
    assert settled_nov.totals_micros == {"nlp": 200, "vision": 300}

    # The report shows the correction as a line of its own, against the period it fixes.
    lines = report(nov + dec + [late], by="team", compensations=[comp], since=at(1, month=12))
    assert [(l.key, l.kind, l.cost_micros, l.for_period) for l in lines] == [
        ("vision", "usage", 1000, None),
        ("vision", "compensation", 40, "2026-11"),
    ]
    day_lines = report([], by="day", compensations=[comp])
    assert [(l.key, l.kind) for l in day_lines] == [("2026-12-01", "compensation")]


def test_compensation_skips_settled_periods_and_can_be_negative() -> None:
    credit = row("fix", "vision", -2_458_000, at(30, 23))  # a metering correction
    comp = book_late_usage(credit, {"2026-11", "2026-12"})
    assert comp is not None and comp.period == "2027-01" and comp.amount_micros == -2_458_000
    s = settle("2027-01", [], compensations=[comp], settled_periods={"2026-11", "2026-12"})
    assert s.totals_micros == {"vision": -2_458_000}
    with pytest.raises(ValueError, match="booked in 2027-01, not 2026-12"):
        settle("2026-12", [], compensations=[comp])


# ---------------------------------------------------------------------------------------------
# A small simulated month through metering: the showback equals price × time, independently


def test_metered_month_report_equals_price_times_time() -> None:
    rng = random.Random(7)
    weights = "CPU=1.0,Mem=0.25G,GRES/gpu:h100=4.0"
    teams = ["vision", "nlp", "infra"]
    rows: list[UsageRow] = []
    expected: dict[str, int] = {}
    expected_units: dict[str, int] = {}
    for i in range(12):
        team = teams[i % 3]
        price = rng.randrange(100_000, 100_000_000)
        start = at(1) + timedelta(seconds=rng.randrange(0, 27 * 86_400), microseconds=rng.randrange(10**6))
        life = timedelta(seconds=rng.randrange(1, 6 * 3600))
        gpus = rng.choice([0, 1, 8])
        tres = instance_tres(8 * max(gpus, 1), 32 * max(gpus, 1), "H100" if gpus else None, gpus)
        unit = billing(weights, tres)
        n = MeteredNode(f"c{i}", 0, "x", "us-east-1", "on-demand", price, tres, start)
        # wake up every ~17 minutes (meter restarts in between), then stop
        now = start
        while not n.finalized:
            now += timedelta(minutes=17)
            stop = start + life if now >= start + life else None
            got = next_intervals(n, now, stop=stop)
            n = advance(n, got)
            rows += [
                UsageRow(
                    event_id=f"c{i}-{iv.start.isoformat()}",
                    cluster=iv.cluster,
                    start=iv.start,
                    end=iv.end,
                    cost_micros=iv.cost_micros,
                    team=team,
                    region=iv.region,
                    billing_seconds=interval_billing_seconds(unit.billing_int, start, iv.start, iv.end),
                )
                for iv in got
            ]
        # independent: the price for the whole lifetime, floor(price × µs / 1 h)
        us = life // timedelta(microseconds=1)
        expected[team] = expected.get(team, 0) + price * us // 3_600_000_000
        expected_units[team] = expected_units.get(team, 0) + unit.billing_int * us // 1_000_000

    lines = report(rows, by="team")
    assert {l.key: l.cost_micros for l in lines} == expected
    assert {l.key: l.billing_seconds for l in lines} == expected_units
    assert settle("2026-11", [r for r in rows if period_of(r.start) == "2026-11"]).total_micros + sum(
        r.cost_micros for r in rows if period_of(r.start) != "2026-11"
    ) == sum(expected.values())
