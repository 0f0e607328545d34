from __future__ import annotations

import math

import numpy as np
import pytest
from bokeh.document import Document
from bokeh.models import Range1d
from labserve.widgets.axes import SteppedAxes, log_ticks, nice_ceil, nice_floor
from labserve.widgets.charts import Charts, charts_for_result
from labserve.widgets.series import TICK_COLUMNS, result_rows

import labserve


@pytest.mark.parametrize(
    ("x", "up", "down"),
    [(1.0, 1.0, 1.0), (1.1, 1.2, 1.0), (3.3, 4.0, 3.0), (7.0, 8.0, 6.0), (0.035, 0.04, 0.03),
     (2420.0, 2500.0, 2000.0), (9.0, 10.0, 8.0)],
)  # fmt: skip
def test_nice_numbers_are_round_and_close(x, up, down):
    assert nice_ceil(x) == pytest.approx(up) and nice_floor(x) == pytest.approx(down)


def _changes(charts: Charts) -> list[str]:
    """Every change the kernel's document makes to a range: what a page would have to redo."""
    doc = Document()
    doc.add_root(charts.layout)
    seen: list[str] = []

    def on_change(event):
        model = getattr(event, "model", None)
        if type(model).__name__ == "Range1d":
            seen.append(f"{model.id}.{event.attr}")

    doc.on_change(on_change)
    return seen


def _row(t: float, **values: float) -> dict[str, list[float]]:
    row = {c: [math.nan] for c in TICK_COLUMNS}
    row.update({"t": [t]}, **{k: [v] for k, v in values.items()})
    return row


def test_the_time_axis_moves_in_steps_not_on_every_tick():
    charts = Charts(follow_s=60.0, hz=5.0)
    seen = _changes(charts)
    for k in range(5 * 120):  # two minutes at 5 Hz, a steady queue of 3
        charts.stream(_row(k / 5, queue_requests=3.0))
    x = charts.x_range
    assert seen.count(f"{x.id}.end") == 120 / 5 - 1  # once a 5 s step (the first: as made)
    assert x.end == 120.0 and x.start == 120.0 - 65.0  # the last 60 s, and the step ahead
    assert charts.ticks.data["t"][0] <= x.start  # the rows kept cover the window
    queue_y = charts.figures["queue"].y_range
    assert (queue_y.start, queue_y.end) == (0.0, 4.0)  # 3 (+10%) rounded up, set once
    assert seen.count(f"{queue_y.id}.end") == 1


def test_a_y_axis_grows_at_once_and_shrinks_only_at_a_step():
    charts = Charts(follow_s=10.0, hz=5.0)  # steps of 1 s
    y = charts.figures["throughput"].y_range
    charts.stream(_row(0.0, served_rps=400.0))
    assert y.end == 500.0
    charts.stream(_row(0.2, served_rps=900.0))  # past the end: grows on this tick
    assert y.end == 1000.0
    t = 0.4
    for _ in range(5 * 20):  # the load drops to 50 req/s: once 900 leaves the window
        charts.stream(_row(t, served_rps=50.0))
        t += 0.2
    assert y.end == 60.0
    charts.stream(_row(t, served_rps=58.0))  # within the range: no change
    assert y.end == 60.0
    charts.stream(_row(t + 0.2, served_rps=80.0))
    assert y.end == 100.0


def test_log_axes_hold_the_data_and_the_cap_and_stacked_axes_the_sum():
    charts = Charts(follow_s=60.0)
    charts.stream(_row(0.0, batch_min=2.0, batch_max=30.0, batch_mean=10.0, max_batch_size=64.0,
                       full=3.0, idle=4.0, adaptive=0.0, timeout=0.0, drain=0.0))  # fmt: skip
    sizes = charts.figures["batch_size"].y_range
    assert (sizes.start, sizes.end) == (1.0, 100.0)  # whole decades; the cap not on the edge
    charts.stream(_row(0.2, p50=3.0, p99=70.0))
    latency = charts.figures["latency"].y_range
    assert (latency.start, latency.end) == (1.0, 100.0)
    charts.stream(_row(0.4, p50=3.0, p99=90.0))  # within: no change
    assert latency.end == 100.0
    charts.stream(_row(0.6, p50=3.0, p99=120.0))  # past the end: the next decade
    assert (latency.start, latency.end) == (1.0, 1000.0)
    assert charts.figures["reasons"].y_range.end == 8.0  # 3 + 4 (+10%), rounded up
    charts.clear()
    assert (sizes.start, sizes.end) == (1.0, 100.0) and charts.x_range.start == 0.0


def test_an_axis_whose_top_is_a_cap_ends_just_above_it():
    # max_num_seqs 256 with 4-20 sequences running: the axis ended at 300.
    axes = SteppedAxes(follow_s=10.0, step_s=1.0)
    columns = ["num_running", "num_waiting", "max_num_seqs"]
    y = axes.y(columns, caps=["max_num_seqs"])
    data: dict[str, list[float]] = {"t": [], **{c: [] for c in columns}}

    def tick(t: float, running: float, waiting: float, cap: float) -> None:
        for column, value in zip(["t", *columns], [t, running, waiting, cap], strict=True):
            data[column].append(value)
        axes.update(data, 1)

    tick(0.0, 20.0, 0.0, 256.0)
    assert y.end == pytest.approx(256 * 1.04)  # the cap's line inside, nothing wasted above
    tick(0.2, 200.0, 300.0, 256.0)  # waiting past the cap: the usual round end
    assert y.end == 400.0
    plain = axes.y(["num_running"])  # no cap: 10% above the data, rounded up
    tick(0.4, 256.0, 0.0, 256.0)
    assert plain.end == 300.0


def test_no_rows_no_change():
    axes = SteppedAxes(60.0)
    axes.update({"t": []}, 0)
    assert (axes.x.start, axes.x.end) == (0.0, 5.0)


@pytest.mark.parametrize(
    ("start", "end", "major", "minor"),
    [(10.0, 100.0, [10.0, 20.0, 50.0, 100.0], []),  # BokehJS's own: 10, 20, 30, ... 100
     (0.1, 10.0, [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0], []),
     (1.0, 1e4, [1.0, 10.0, 100.0, 1e3, 1e4],
      [m * 10.0**k for k in range(4) for m in range(2, 10)])],
)  # fmt: skip
def test_log_ticks_are_round_and_sparse_over_any_span(start, end, major, minor):
    got_major, got_minor = log_ticks(start, end)
    assert got_major == pytest.approx(major) and got_minor == pytest.approx(minor)


def _ticks(fig) -> tuple[float, float, list[float]]:
    r = fig.y_range
    return r.start, r.end, list(fig.yaxis[0].ticker.ticks)


def test_a_log_axis_carries_ticks_that_follow_its_range():
    charts = Charts(follow_s=60.0)
    sizes, latency = charts.figures["batch_size"], charts.figures["latency"]
    assert _ticks(sizes) == (1.0, 100.0, [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0])  # empty
    # Before any batch only the cap is drawn: one decade, labelled 10, 20, 50, 100.
    charts.stream(_row(0.0, max_batch_size=64.0, max_latency_ms=10.0, latency_bound=12.0))
    assert _ticks(sizes) == (10.0, 100.0, [10.0, 20.0, 50.0, 100.0])
    charts.stream(_row(0.2, p50=0.5, p99=3000.0, max_latency_ms=0.0))  # a 0 ms cap: not drawn
    assert _ticks(latency) == (0.1, 1e4, [0.1, 1.0, 10.0, 100.0, 1e3, 1e4])
    charts.clear()
    assert _ticks(latency) == (1.0, 100.0, [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0])


def test_a_finished_runs_log_axes_are_fitted_in_whole_decades():
    # Every batch of 1 item under a cap of 4: a DataRange1d spanned 0.95-4.2 (heaped labels).
    run = labserve.simulate(np.arange(0.0, 2.0, 0.01), duration_s=2.0, cost=(1.0, 0.1),
                            strategy="fixed", max_batch_size=4, max_latency_ms=1)  # fmt: skip
    charts = charts_for_result(run)
    sizes = charts.figures["batch_size"]
    assert isinstance(sizes.y_range, Range1d)
    assert _ticks(sizes) == (0.1, 10.0, [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0])
    start, end, _ = _ticks(charts.figures["latency"])
    p99 = np.nanmax(result_rows(run)["p99"])
    assert start < p99 < end and math.log10(start) % 1 == 0 and math.log10(end) % 1 == 0
    # A run with no batch at all: the cap's decade (the default 32), and no latency at all.
    empty = charts_for_result(labserve.simulate([], duration_s=1.0))
    assert _ticks(empty.figures["batch_size"]) == (10.0, 100.0, [10.0, 20.0, 50.0, 100.0])


def test_the_batch_size_band_is_drawn_per_row_so_an_idle_tick_breaks_it():
    charts = Charts(follow_s=60.0, hz=5.0)
    # Each row its own bar from min to max (a varea is one polygon through every finite row).
    glyph = charts.band.glyph
    assert (glyph.bottom, glyph.top, glyph.width) == ("batch_min", "batch_max", 0.2)
    assert type(glyph).__name__ in ("VBar", "Quad")
    # A tick without batches leaves NaN there, live and for a finished run's empty bins.
    run = labserve.simulate(np.r_[np.arange(0.0, 1.0, 0.01), np.arange(2.0, 3.0, 0.01)],
                            duration_s=3.0, cost=(1.0, 0.1))  # fmt: skip
    rows = result_rows(run, bin_s=0.1)
    idle = [k for k, t in enumerate(rows["t"]) if 1.2 < t < 2.0]
    assert idle and all(math.isnan(rows[c][k]) for k in idle for c in ("batch_min", "batch_max"))
    finished = charts_for_result(run, bin_s=0.1)
    assert finished.band.glyph.width == pytest.approx(0.1)  # a bar per bin
