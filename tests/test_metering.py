"""Metering: intervals tile a node's lifetime exactly across meter restarts, and the integer
costs of the intervals add up to the cost of the whole lifetime."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from skypurza.services.ledger.metering import (
    MeteredNode,
    MeterInterval,
    accrued_cost_micros,
    advance,
    cumulative_cost_micros,
    instance_tres,
    interval_billing_seconds,
    interval_cost_micros,
    next_boundary,
    next_intervals,
)

T0 = datetime(2026, 11, 30, 23, 58, 30, 250_000, tzinfo=UTC)
H100_PRICE = 98_320_000  # $98.32/h in micro-dollars


def node(start: datetime = T0, price: int = H100_PRICE, **kw) -> MeteredNode:
    return MeteredNode(
        cluster="c1",
        rank=0,
        instance_type="p5.48xlarge",
        region="us-east-1",
        market="spot",
        hourly_price_micros=price,
        tres=instance_tres(192, 2048, "H100", 8),
        start=start,
        **kw,
    )


def run_meter(
    n: MeteredNode, wakeups: list[datetime], stop: datetime, tick: timedelta, limit: int | None
) -> list[MeterInterval]:
    """A meter that wakes at each time in ``wakeups`` (restarting from the log each time),
    then sees the stop; returns everything it recorded."""
    log: list[MeterInterval] = []
    state = n
    for now in wakeups:
        got = next_intervals(state, now, tick=tick, limit=limit)
        log += got
        state = advance(state, got)  # what a restarted meter reads back from the event log
    while not state.finalized:
        got = next_intervals(state, stop, stop=stop, tick=tick, limit=limit)
        assert got, "a stopped node must make progress until finalized"
        log += got
        state = advance(state, got)
    assert next_intervals(state, stop + timedelta(hours=1), stop=stop, tick=tick) == []
    return log


# ---------------------------------------------------------------------------------------------


def test_cumulative_cost_is_floor_of_price_times_time() -> None:
    assert cumulative_cost_micros(H100_PRICE, timedelta(hours=1)) == 98_320_000
    assert cumulative_cost_micros(H100_PRICE, timedelta(seconds=1)) == 27_311  # 27311.1
    assert cumulative_cost_micros(H100_PRICE, timedelta(microseconds=1)) == 0
    assert cumulative_cost_micros(0, timedelta(days=3)) == 0


def test_boundaries_are_epoch_aligned_ticks_and_utc_midnights() -> None:
    t = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    assert next_boundary(t) == t + timedelta(minutes=1)
    assert next_boundary(t + timedelta(seconds=30)) == t + timedelta(minutes=1)
    # 7 s does not divide a day: midnight is still a boundary.
    before_midnight = datetime(2026, 11, 30, 23, 59, 58, tzinfo=UTC)
    assert next_boundary(before_midnight, 7) == datetime(2026, 12, 1, tzinfo=UTC)
    # A timezone-aware non-UTC time means the same instant.
    cet = datetime(2026, 12, 1, 0, 59, 58, tzinfo=__import__("zoneinfo").ZoneInfo("Europe/Paris"))
    assert next_boundary(cet, 7) == datetime(2026, 12, 1, tzinfo=UTC)


def test_running_node_gets_whole_ticks_only_and_crosses_midnight_cleanly() -> None:
    n = node()
    got = next_intervals(n, datetime(2026, 12, 1, 0, 1, 10, tzinfo=UTC))
    assert [(i.start.time().isoformat(), i.end.time().isoformat()) for i in got] == [
        ("23:58:30.250000", "23:59:00"),
        ("23:59:00", "00:00:00"),
        ("00:00:00", "00:01:00"),
    ]
    assert not any(i.final for i in got)
    assert sum(i.cost_micros for i in got) == cumulative_cost_micros(
        H100_PRICE, got[-1].end - T0
    )
    assert got[0].tres == {"cpu": 192, "mem": 2097152, "node": 1, "gres/gpu": 8, "gres/gpu:h100": 8}
    assert (got[0].cluster, got[0].rank, got[0].market, got[0].region) == ("c1", 0, "spot", "us-east-1")
    # Nothing more until the next boundary has passed.
    assert next_intervals(advance(n, got), datetime(2026, 12, 1, 0, 1, 59, tzinfo=UTC)) == []


def test_stop_gives_a_final_partial_interval() -> None:
    n = advance(node(), next_intervals(node(), datetime(2026, 12, 1, 0, 0, 5, tzinfo=UTC)))
    stop = datetime(2026, 12, 1, 0, 2, 15, tzinfo=UTC)
    got = next_intervals(n, stop, stop=stop)
    assert [(i.end, i.final) for i in got] == [
        (datetime(2026, 12, 1, 0, 1, tzinfo=UTC), False),
        (datetime(2026, 12, 1, 0, 2, tzinfo=UTC), False),
        (stop, True),
    ]
    done = advance(n, got)
    assert done.finalized and done.metered_until == stop
    assert next_intervals(done, stop, stop=stop) == []


def test_stop_exactly_at_the_metered_end_gives_an_empty_final_interval() -> None:
    n = node(metered_until=datetime(2026, 12, 1, 0, 2, tzinfo=UTC))
    got = next_intervals(n, n.metered_until, stop=n.metered_until)
    assert len(got) == 1 and got[0].final and got[0].start == got[0].end and got[0].cost_micros == 0


def test_late_known_stop_is_corrected_by_a_negative_interval() -> None:
    # The meter ran to 00:05 before learning the node had terminated at 00:03:30.
    n = node()
    log = next_intervals(n, datetime(2026, 12, 1, 0, 5, tzinfo=UTC))
    n = advance(n, log)
    stop = datetime(2026, 12, 1, 0, 3, 30, tzinfo=UTC)
    fix = next_intervals(n, datetime(2026, 12, 1, 0, 6, tzinfo=UTC), stop=stop)
    assert len(fix) == 1 and fix[0].correction and fix[0].final
    assert (fix[0].start, fix[0].end) == (stop, datetime(2026, 12, 1, 0, 5, tzinfo=UTC))
    assert fix[0].cost_micros < 0
    total = sum(i.cost_micros for i in log + fix)
    assert total == cumulative_cost_micros(H100_PRICE, stop - T0)
    assert advance(n, fix).finalized


def test_limit_pages_through_a_long_outage() -> None:
    n = node()
    now = T0 + timedelta(minutes=10)
    first = next_intervals(n, now, limit=4)
    rest = next_intervals(advance(n, first), now)
    assert len(first) == 4
    assert first + rest == next_intervals(n, now)


def test_interval_cost_and_accrued_cost() -> None:
    a, b = T0 + timedelta(seconds=10), T0 + timedelta(seconds=70)
    assert interval_cost_micros(H100_PRICE, T0, a, b) == cumulative_cost_micros(
        H100_PRICE, b - T0
    ) - cumulative_cost_micros(H100_PRICE, a - T0)
    assert accrued_cost_micros(H100_PRICE, T0, T0 + timedelta(minutes=30)) == 49_160_000
    assert accrued_cost_micros(H100_PRICE, T0, T0 - timedelta(minutes=1)) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": datetime(2026, 11, 30, 12, 0)}, "timezone-aware"),
        ({"metered_until": T0 - timedelta(seconds=1)}, "before the node's start"),
        ({"price": -1}, "non-negative int of micro-dollars"),
    ],
)
def test_bad_state_is_refused(kwargs: dict, message: str) -> None:
    price = kwargs.pop("price", H100_PRICE)
    with pytest.raises(ValueError, match=message):
        next_intervals(node(price=price, **kwargs), T0 + timedelta(minutes=5))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="before the node's start"):
        next_intervals(node(), T0, stop=T0 - timedelta(seconds=1))
    with pytest.raises(ValueError, match="tick must be positive"):
        next_intervals(node(), T0 + timedelta(minutes=5), tick=0)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        next_intervals(node(), T0 + timedelta(minutes=5), limit=0)


# ---------------------------------------------------------------------------------------------
# instance TRES


def test_instance_tres() -> None:
    assert instance_tres(2, "0.5") == {"cpu": 2, "mem": 512, "node": 1}
    assert instance_tres(2, 3.75) == {"cpu": 2, "mem": 3840, "node": 1}
    assert instance_tres(1, "0.613") == {"cpu": 1, "mem": 627, "node": 1}  # whole MiB, rounded down
    assert instance_tres(4, 16, "A10G", 1) == {
        "cpu": 4, "mem": 16384, "node": 1, "gres/gpu": 1, "gres/gpu:a10g": 1,
    }  # fmt: skip
    assert instance_tres(8, 61, None, 1.0) == {"cpu": 8, "mem": 62464, "node": 1, "gres/gpu": 1}
    for bad, message in [
        (lambda: instance_tres(0, 1), "positive whole number"),
        (lambda: instance_tres(2.5, 1), "positive whole number"),
        (lambda: instance_tres(2, 1, "T4", 0.5), "GPU count must be a non-negative whole number"),
        (lambda: instance_tres(2, 1, "Tesla T4", 1), "cannot be a gres type name"),
    ]:
        with pytest.raises(ValueError, match=message):
            bad()


# ---------------------------------------------------------------------------------------------
# The tiling property


@settings(max_examples=300, deadline=None)
@example(start_us=0, tick_s=1, life_ticks=1.0, price=0, wake_fracs=[1.0], limit=None)
@given(
    start_us=st.integers(0, 3 * 86_400_000_000),
    tick_s=st.sampled_from([1, 7, 60, 90, 300, 3600, 5 * 3600]),
    life_ticks=st.floats(0, 120),
    price=st.integers(0, 200_000_000),
    wake_fracs=st.lists(st.floats(0, 1.3), max_size=8),
    limit=st.one_of(st.none(), st.integers(1, 7)),
)
def test_intervals_tile_the_lifetime_and_costs_sum_exactly(
    start_us, tick_s, life_ticks, price, wake_fracs, limit
) -> None:
    start = datetime(2026, 11, 29, tzinfo=UTC) + timedelta(microseconds=start_us)
    tick = timedelta(seconds=tick_s)
    life = timedelta(microseconds=int(life_ticks * tick_s * 1_000_000))
    stop = start + life
    # Meter wake-ups (restarts included) anywhere in the lifetime, in order; some after stop
    # happen before the meter learns of the stop.
    wakeups = sorted(start + life * f for f in wake_fracs)
    wakeups = [w for w in wakeups if w <= stop]
    n = node(start=start, price=price)

    log = run_meter(n, wakeups, stop, tick, limit)

    # Contiguous, non-overlapping, from start to stop; only the last is final.
    assert log[0].start == start
    assert log[-1].end == stop
    for a, b in zip(log, log[1:], strict=False):
        assert a.end == b.start
    assert all(i.start <= i.end for i in log)
    assert all(i.start < i.end for i in log[:-1])
    assert [i.final for i in log] == [False] * (len(log) - 1) + [True]
    assert not any(i.correction for i in log)
    # Every inner boundary is a tick multiple or a midnight; no interval crosses a UTC day.
    for i in log[:-1]:
        assert i.end == next_boundary(i.start, tick)
    for i in log:
        assert i.start.date() == (i.end - timedelta(microseconds=1)).date() or i.start == i.end
    # Integer costs add up to the lifetime's cost exactly.
    assert sum(i.cost_micros for i in log) == cumulative_cost_micros(price, life)
    units = [interval_billing_seconds(13, start, i.start, i.end) for i in log]
    assert sum(units) == 13 * (life // timedelta(microseconds=1)) // 1_000_000
    # Restarts change nothing: an uninterrupted meter records the very same intervals, except
    # that a meter which woke exactly at the stop (a tick boundary) before it learnt of the stop
    # closes with a zero-length final interval (metering.next_intervals documents it) where the
    # uninterrupted one marks its last interval final.
    assert _closed(log) == _closed(run_meter(n, [], stop, tick, None))


def _closed(log: list[MeterInterval]) -> list[MeterInterval]:
    """The log with a zero-length closing marker folded into the interval before it."""
    if len(log) > 1 and log[-1].final and log[-1].start == log[-1].end:
        return log[:-2] + [replace(log[-2], final=True)]
    return log


def test_a_wake_up_exactly_at_the_stop_closes_with_a_zero_length_final_interval() -> None:
    """Hypothesis's counterexample (start_us=0, tick_s=1, life_ticks=1.0, price=0, wake_fracs=[1.0]),
    kept as an explicit case: the meter recorded [start, stop) as an ordinary tick before it
    learnt of the stop, so the stop adds only the zero-length final marker."""
    start = datetime(2026, 11, 29, tzinfo=UTC)
    tick = timedelta(seconds=1)
    stop = start + tick
    n = node(start=start, price=0)
    woke = run_meter(n, [stop], stop, tick, None)
    assert [(i.start, i.end, i.final) for i in woke] == [(start, stop, False), (stop, stop, True)]
    assert sum(i.cost_micros for i in woke) == 0
    straight = run_meter(n, [], stop, tick, None)
    assert [(i.start, i.end, i.final) for i in straight] == [(start, stop, True)]
    assert _closed(woke) == straight


@settings(max_examples=100, deadline=None)
@given(
    life_s=st.integers(1, 1800),
    over_s=st.integers(1, 600),
    price=st.integers(1, 200_000_000),
)
def test_late_stop_correction_restores_the_lifetime_cost(life_s, over_s, price) -> None:
    n = node(price=price)
    stop = T0 + timedelta(seconds=life_s)
    log = next_intervals(n, stop + timedelta(seconds=over_s))
    n = advance(n, log)
    log += next_intervals(n, stop + timedelta(seconds=over_s), stop=stop)
    assert sum(i.cost_micros for i in log) == cumulative_cost_micros(price, stop - T0)
