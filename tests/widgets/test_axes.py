from __future__ import annotations

import math

import pytest
from bokeh.document import Document
from labserve.widgets.axes import SteppedAxes, nice_ceil, nice_floor
from labserve.widgets.charts import Charts
from labserve.widgets.series import TICK_COLUMNS


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


def test_no_rows_no_change():
    axes = SteppedAxes(60.0)
    axes.update({"t": []}, 0)
    assert (axes.x.start, axes.x.end) == (0.0, 5.0)
