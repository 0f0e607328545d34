"""The load presets a dashboard offers: each shape at one rate knob, repeating with a period."""

from __future__ import annotations

import pytest

import labserve


@pytest.mark.parametrize("pattern", ["poisson", "constant", "step", "burst"])
def test_each_arrival_preset_runs_near_its_rate_over_whole_periods(pattern):
    arrivals = labserve.preset_arrivals(pattern, 1000.0, period_s=30.0)
    times = arrivals.times(30.0, seed=1)
    mean = {"poisson": 1000, "constant": 1000, "step": 500, "burst": 1000 / 4 * 0.8 + 2000 * 0.2}
    assert len(times) / 30.0 == pytest.approx(mean[pattern], rel=0.05)


def test_step_climbs_in_the_middle_third():
    times = labserve.preset_arrivals("step", 1200.0, period_s=3.0).times(3.0, seed=2)
    counts = [((times >= k) & (times < k + 1)).sum() for k in range(3)]
    assert counts[1] > 2.5 * counts[0] and counts[1] > 2.5 * counts[2]


@pytest.mark.parametrize(
    ("pattern", "rate", "period", "message"),
    [
        ("closed loop", 100.0, 30.0, "pattern must be one of poisson, constant, step, burst"),
        ("zigzag", 100.0, 30.0, "got 'zigzag'"),
        ("poisson", -5.0, 30.0, "rate_rps must be a finite number > 0, got -5.0"),
        ("step", 100.0, float("inf"), "period_s must be a finite number > 0"),
    ],
)
def test_a_bad_preset_says_what_was_expected(pattern, rate, period, message):
    with pytest.raises(ValueError, match=message):
        labserve.preset_arrivals(pattern, rate, period_s=period)


def test_the_menu_lists_the_closed_loop_last():
    assert labserve.LOAD_PRESETS[-1] == "closed loop"
    assert set(labserve.LOAD_PRESETS[:-1]) <= set(labserve.ARRIVAL_KINDS)
