import pytest

from labserve.batching.margin import MAX_SPANS, QUANTILE, WINDOW, OverloadMargin

MS = 1e-3


def test_no_batches_seen_means_no_margin():
    assert OverloadMargin().margin_s(0) == 0.0


def test_a_start_further_ahead_keeps_the_errors_of_every_batch_before_it():
    margin = OverloadMargin()
    for _ in range(WINDOW):
        margin.observe(0.1 * MS)
    assert [margin.margin_s(j) for j in range(3)] == pytest.approx([0.1 * MS, 0.2 * MS, 0.3 * MS])
    # Past the longest run kept, the margin grows in proportion.
    assert margin.margin_s(2 * MAX_SPANS - 1) == pytest.approx(2 * MAX_SPANS * 0.1 * MS)
    margin.observe(-0.4 * MS)  # an early batch lowers only the sums it is in
    assert margin.margin_s(0) == pytest.approx(0.1 * MS)


def test_a_rare_stall_is_kept_for_the_window_then_forgotten():
    # A stall is what lets admitted requests through late: one in the window is margin enough.
    assert QUANTILE == 1.0
    margin = OverloadMargin()
    margin.observe(5 * MS)
    for _ in range(WINDOW - 1):
        margin.observe(0.0)
    assert margin.margin_s(0) == pytest.approx(5 * MS)
    assert margin.margin_s(1) == pytest.approx(5 * MS)  # in every sum that holds it
    margin.observe(0.5 * MS)  # the stall leaves the window
    assert margin.margin_s(0) == pytest.approx(0.5 * MS)


def test_batches_that_end_early_need_no_margin():
    margin = OverloadMargin()
    for _ in range(10):
        margin.observe(-1 * MS)
    assert margin.margin_s(0) == margin.margin_s(1) == 0.0
