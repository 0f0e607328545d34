"""The notebook progress bar for sweep(progress=...)."""

from __future__ import annotations

import concurrent.futures

import pytest
from labserve.widgets import ProgressBar

import labserve


def test_a_sweep_fills_the_bar_and_says_how_long_it_took():
    bar = ProgressBar("simulating", display=False)
    rows = labserve.sweep(rates=[500, 1000], max_batch_size=[8, 16], duration_s=0.2, progress=bar)
    assert len(rows) == 4
    assert (bar.done, bar.total) == (4, 4)
    assert bar.bar.value == bar.bar.max == 4
    assert bar.bar.bar_style == "success"
    assert "4 points in" in bar.label.value


def test_a_fanned_out_sweep_reports_from_other_threads():
    bar = ProgressBar(display=False)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        labserve.sweep(rates=[500, 1000, 2000], duration_s=0.2, progress=bar, executor=pool)
    assert bar.bar.value == bar.bar.max == 3 and bar.bar.bar_style == "success"


def test_midway_it_shows_the_count_and_the_time_left():
    bar = ProgressBar("grid", unit="run", display=False)
    bar(1, 3)
    assert bar.bar.value == 1 and bar.bar.max == 3 and bar.bar.bar_style == "info"
    assert "1 / 3 runs" in bar.label.value and "left" in bar.label.value
    bar(2, 3)  # within a tenth of a second: not redrawn, but counted
    assert bar.done == 2
    bar(3, 3)  # the last is always drawn
    assert bar.bar.value == 3 and "3 runs in" in bar.label.value


@pytest.mark.parametrize(("done", "total"), [(4, 3), (-1, 3), (1, 0), (1.5, 3)])
def test_a_bad_report_is_refused(done, total):
    with pytest.raises(ValueError, match="must be an integer"):
        ProgressBar(display=False)(done, total)


def test_its_text_is_the_same_every_run():
    bar = ProgressBar("simulating", display=False)
    bundle = bar._repr_mimebundle_()
    assert bundle["text/plain"] == "<ProgressBar simulating>"
    assert "application/vnd.jupyter.widget-view+json" in bundle
