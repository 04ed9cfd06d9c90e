"""Slurm's half-life decay (services/dispatch/decay.py): the source's per-second factor
1 − 0.693/HL (not 2^(−t/HL)), its passes every PriorityCalcPeriod, RawUsage from the untruncated
billing, with the numbers slurm-accounting measured on a real Slurm 22.05."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skypurza.services.dispatch import decay

DAY = 86400
WEEK = 7 * DAY


def test_the_source_factor_not_the_exact_half_life():
    assert decay.decay_factor(WEEK) == 1 - 0.693 / WEEK
    assert round(decay.multiplier(WEEK, WEEK), 6) == 0.500073  # not 0.5
    assert round(decay.multiplier(DAY, WEEK), 6) == 0.905743  # exact 2^(-1/7) is 0.905724
    assert round(2 ** (-1 / 7), 6) == 0.905724
    assert decay.multiplier(10 ** 9, 60) == pytest.approx(2.2250738585072014e-308)  # Slurm's DBL_MIN floor
    assert decay.decay_factor(0) == 1.0 and decay.multiplier(DAY, 0) == 1.0  # HL = 0: no decay


def test_raw_usage_is_the_untruncated_billing():
    # the run: billing 5.25 for 15 s shows RawUsage 78 (= 78.75 truncated), not 5 x 15 = 75
    u = decay.raw_usage([decay.Run(0, 15, 5.25)], now=15, half_life_s=0)
    assert u == 78.75 and decay.shown_raw_usage(u) == 78
    # QOS UsageFactor 0.5, billing 16 over 22 s added exactly 176; 71 s added 568
    assert decay.raw_usage([decay.Run(0, 22, 16, 0.5)], now=100, half_life_s=0) == 176
    assert decay.raw_usage([decay.Run(0, 71, 16, 0.5)], now=100, half_life_s=0) == 568


def test_passes_follow_the_source():
    hl, period = 3600.0, 300.0
    f = decay.decay_factor(hl)
    # one pass: old usage decayed, then Δt × f^Δt × billing added
    assert decay.accrue(1000.0, period, 2.0, hl) == pytest.approx(1000 * f ** 300 + 300 * f ** 300 * 2)
    # a run over two whole passes, read one pass later
    got = decay.raw_usage([decay.Run(0, 600, 2.0)], now=900, half_life_s=hl, calc_period_s=period)
    pass1 = 300 * f ** 300 * 2 * f ** 600
    pass2 = 300 * f ** 300 * 2 * f ** 300
    assert got == pytest.approx(pass1 + pass2, rel=1e-12)
    # the same thing pass by pass with accrue
    u = decay.accrue(0.0, 300, 2.0, hl)
    u = decay.accrue(u, 300, 2.0, hl)
    u = decay.accrue(u, 300, 0.0, hl)
    assert got == pytest.approx(u, rel=1e-12)
    # usage after now is not counted; a run cut by the grid adds its pieces
    assert decay.raw_usage([decay.Run(100, 10_000, 1.0)], now=400, half_life_s=0, calc_period_s=period) == 300


@settings(max_examples=150, deadline=None)
@given(st.floats(0, 1e6), st.floats(1, 1e6), st.floats(0, 100), st.floats(60, 30 * DAY), st.integers(1, 3600))
def test_decayed_usage_never_exceeds_the_undecayed_and_falls_with_time(start, length, billing, hl, period):
    run = [decay.Run(start, start + length, billing)]
    end = start + length
    plain = decay.raw_usage(run, now=end, half_life_s=0, calc_period_s=period)
    assert plain == pytest.approx(billing * length, rel=1e-9, abs=1e-6)
    now = decay.raw_usage(run, now=end, half_life_s=hl, calc_period_s=period)
    later = decay.raw_usage(run, now=end + DAY, half_life_s=hl, calc_period_s=period)
    assert 0 <= later <= now <= plain * (1 + 1e-12) + 1e-9


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        decay.raw_usage([decay.Run(10, 5, 1.0)], now=20)
    with pytest.raises(ValueError):
        decay.raw_usage([decay.Run(0, 5, -1.0)], now=20)
    with pytest.raises(ValueError):
        decay.decay_factor(-1)
    assert math.isfinite(decay.raw_usage([decay.Run(0, 10 ** 9, 1e6)], now=10 ** 9, half_life_s=1, calc_period_s=1))
