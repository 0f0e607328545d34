import pytest

from labserve.batching.margin import QUANTILE, WINDOW, OverloadMargin

MS = 1e-3


def test_no_batches_seen_means_no_margin():
    assert OverloadMargin().margin_s == 0.0


def test_the_margin_is_a_high_quantile_of_the_errors_summed_over_the_spans():
    margin = OverloadMargin()
    for _ in range(WINDOW):
        margin.observe(0.1 * MS, spans=3)
    assert margin.margin_s == pytest.approx(0.3 * MS)  # three batches, each 0.1 ms late
    margin.observe(-0.4 * MS, spans=3)  # an early batch pulls its sums down, not the margin
    assert margin.margin_s == pytest.approx(0.3 * MS)


def test_the_rarest_errors_are_left_out_and_old_ones_forgotten():
    margin = OverloadMargin()
    for _ in range(WINDOW - 1):
        margin.observe(0.0, spans=1)
    margin.observe(5 * MS, spans=1)  # one stall in the window: above the quantile
    assert 1 < (1 - QUANTILE) * WINDOW and margin.margin_s == 0.0
    for _ in range(4):
        margin.observe(2 * MS, spans=1)
    assert margin.margin_s == pytest.approx(2 * MS)
    for _ in range(WINDOW):
        margin.observe(0.5 * MS, spans=1)
    assert margin.margin_s == pytest.approx(0.5 * MS)  # the window moved on


def test_batches_that_end_early_need_no_margin():
    margin = OverloadMargin()
    for _ in range(10):
        margin.observe(-1 * MS, spans=2)
    assert margin.margin_s == 0.0
