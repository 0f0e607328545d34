"""The lesson charts headless: their data sources hold the results' own values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from bokeh.models import ColumnDataSource, GlyphRenderer, Legend, Plot, Span
from jupyter_bokeh import BokehModel
from labserve.widgets import (
    compare_figure,
    compare_series,
    cost_curve_figure,
    plot_compare,
    plot_cost_curve,
    plot_sweep,
    sweep_figure,
)

import labserve


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return labserve.sweep(rates=[500, 2000, 4000], max_batch_size=[8, 64], duration_s=0.5, seed=3)


def sources(layout) -> dict[str, ColumnDataSource]:
    return {s.name: s for s in layout.select({"type": ColumnDataSource})}


def test_sweep_figure_has_one_source_per_group_holding_the_sweeps_values(rows):
    fig = sweep_figure(rows, x="served_rps", y="latency_p99_ms", group_by="max_batch_size")
    by_name = sources(fig)
    assert set(by_name) == {"max_batch_size=8", "max_batch_size=64"}
    for cap in (8, 64):
        mine = sorted(
            (r for r in rows if r["max_batch_size"] == cap), key=lambda r: r["served_rps"]
        )
        data = by_name[f"max_batch_size={cap}"].data
        assert data["x"] == [r["served_rps"] for r in mine]
        assert data["y"] == [r["latency_p99_ms"] for r in mine]
        assert data["col_rate"] == [r["rate"] for r in mine]


def test_sweep_figure_draws_one_line_per_group_and_a_legend_entry_each(rows):
    fig = sweep_figure(rows, x="rate", y="mean_batch", group_by=("strategy", "max_batch_size"))
    lines = [r for r in fig.select({"type": GlyphRenderer}) if type(r.glyph).__name__ == "Line"]
    assert len(lines) == 2
    (legend,) = fig.select({"type": Legend})
    labels = [item.label["value"] for item in legend.items]
    assert labels == ["strategy=adaptive, max_batch_size=8", "strategy=adaptive, max_batch_size=64"]


def test_sweep_figure_without_groups_draws_a_single_line(rows):
    fig = sweep_figure(rows, x="rate", y="served_rps", group_by=None)
    (source,) = sources(fig).values()
    assert len(source.data["x"]) == len(rows)
    assert source.data["x"] == sorted(source.data["x"])


def test_sweep_figure_axes_and_reference_line(rows):
    fig = sweep_figure(rows, x="max_batch_size", y="latency_p50_ms", x_log=True, y_line=20)
    assert type(fig.x_scale).__name__ == "LogScale"
    assert type(fig.y_scale).__name__ == "LinearScale"
    (span,) = fig.select({"type": Span})
    assert span.location == 20


@pytest.mark.parametrize(
    ("kwargs", "role", "bad"),
    [
        ({"x": "throughput"}, "x", "throughput"),
        ({"y": "p99"}, "y", "p99"),
        ({"group_by": ("strategy", "cap")}, "group_by", "cap"),
    ],
)
def test_unknown_column_is_a_clear_error_naming_the_choices(rows, kwargs, role, bad):
    with pytest.raises(ValueError) as info:
        sweep_figure(rows, **kwargs)
    message = str(info.value)
    assert message.startswith(f"{role} must be one of the table's columns")
    assert f"got {bad!r}" in message
    for choice in ("served_rps", "latency_p99_ms", "max_batch_size", "rate"):
        assert choice in message


def test_sweep_rejects_empty_rows_and_a_single_row_dict(rows):
    with pytest.raises(ValueError, match="at least one row"):
        sweep_figure([])
    with pytest.raises(TypeError, match="list of dicts"):
        sweep_figure(rows[0])


class FakeFrame:
    """What plot_sweep uses of a pandas DataFrame (pandas is not a test dependency)."""

    def __init__(self, rows):
        self.rows = rows
        self.columns = list(rows[0])

    def to_dict(self, orient):
        assert orient == "records"
        return [dict(r) for r in self.rows]


def test_sweep_takes_a_dataframe_too(rows):
    fig = sweep_figure(FakeFrame(rows), x="rate", y="served_rps", group_by="max_batch_size")
    assert sorted(sources(fig)) == ["max_batch_size=64", "max_batch_size=8"]


def test_plot_sweep_wraps_the_figure_in_a_bokeh_widget(rows):
    widget = plot_sweep(rows, x="rate", y="latency_p99_ms", group_by="max_batch_size")
    assert isinstance(widget, BokehModel)
    # The data travels in the widget's state (no BokehJS): the sweep's values are in it.
    state = str(widget.render_bundle["docs_json"])
    assert str(rows[0]["latency_p99_ms"]) in state
    assert "BokehJS" not in state and "<script" not in state


def fake_curve() -> labserve.CostCurve:
    model = labserve.LinearCost(2.0, 0.5)
    sizes = (1, 4, 16)
    return labserve.CostCurve(sizes, tuple(model.seconds(n) for n in sizes), (0, 0, 0), model)


def test_cost_curve_figure_holds_per_item_cost_and_throughput():
    curve = fake_curve()
    (source,) = sources(cost_curve_figure(curve)).values()
    assert source.data["batch"] == [1.0, 4.0, 16.0]
    assert source.data["ms_per_item"] == pytest.approx([2.5, 1.0, 0.625])
    assert source.data["items_ps"] == pytest.approx([400.0, 1000.0, 1600.0])
    assert isinstance(plot_cost_curve(curve), BokehModel)


def test_cost_curve_from_a_real_profile():
    curve = labserve.profile(lambda x: x * 2, example=np.ones((1, 3)), sizes=[1, 8], repeats=1)
    (source,) = sources(cost_curve_figure(curve)).values()
    assert source.data["batch"] == [1.0, 8.0]
    assert source.data["ms_per_item"] == pytest.approx(curve.per_item_ms())


@pytest.fixture(scope="module")
def step_runs() -> dict[str, labserve.RunResult]:
    times = labserve.arrivals("step", rates=[(0, 100), (1, 3000)]).times(2.0, seed=2)
    return {
        s: labserve.simulate(times, duration_s=2.0, strategy=s, label=s, max_latency_ms=10)
        for s in ("fixed", "adaptive")
    }


def test_compare_series_bins_the_runs_own_arrays(step_runs):
    series = compare_series(step_runs, bin_s=0.5)
    assert list(series) == ["fixed", "adaptive"]
    fixed, r = series["fixed"], step_runs["fixed"]
    # Four bins over the 2 s of load, and one for the batches that drained it after the end.
    assert fixed["t"] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert fixed["offered_rps"][4] == 0
    counts, _ = np.histogram(r.arrival_s, bins=[0, 0.5, 1.0, 1.5, 2.0])
    assert fixed["offered_rps"][:4] == pytest.approx(list(counts / 0.5))
    late = r.arrival_s[r.served] >= 1.5
    expected = np.percentile(r.latency_s[late], 99) * 1000
    assert fixed["p99_ms"][3] == pytest.approx(expected)
    started = (r.batch_start_s >= 1.5) & (r.batch_start_s < 2.0)
    assert fixed["mean_batch"][3] == pytest.approx(r.batch_items[started].mean())
    # Batching grows with the load: the heavy second half has bigger batches than the first.
    assert fixed["mean_batch"][3] > fixed["mean_batch"][0]


def test_compare_series_marks_an_empty_bin_nan_and_counts_rejections():
    times = [0.0, 0.0001, 0.0002, 0.0003, 0.35]
    r = labserve.simulate(times, strategy="off", max_queue_size=1, label="off")
    series = compare_series([r], bin_s=0.1)["off"]
    assert [math.isnan(v) for v in series["p99_ms"]] == [False, True, True, False]
    rejected = r.summary()["rejected_pct"] * len(times) / 100
    assert rejected >= 1
    assert sum(series["rejected_rps"]) * 0.1 == pytest.approx(rejected)


def test_compare_figure_draws_one_line_per_run_on_a_shared_time_axis(step_runs):
    layout = compare_figure(step_runs, latency_line_ms=10)
    names = {s.name for s in layout.select({"type": ColumnDataSource})}
    assert names == {"load", "fixed", "adaptive"}
    legends = list(layout.select({"type": Legend}))
    assert [[i.label["value"] for i in leg.items] for leg in legends] == [["fixed", "adaptive"]] * 2
    figs = list(layout.select({"type": Plot}))
    assert len(figs) == 3
    assert len({id(f.x_range) for f in figs}) == 1
    (span,) = layout.select({"type": Span})
    assert span.location == 10
    assert isinstance(plot_compare(step_runs), BokehModel)


def test_compare_names_runs_by_label_and_rejects_what_is_not_a_run(step_runs):
    series = compare_series(list(step_runs.values()), bin_s=1.0)
    assert list(series) == ["fixed", "adaptive"]
    with pytest.raises(TypeError, match=r"must be a labserve\.RunResult"):
        compare_series({"x": object()})
    with pytest.raises(ValueError, match="at least one RunResult"):
        compare_series({})
    with pytest.raises(ValueError, match="bin_s must be a finite number > 0"):
        compare_series(step_runs, bin_s=0)


@pytest.mark.parametrize(
    ("plot", "build"),
    [
        (plot_sweep, sweep_figure),
        (plot_cost_curve, cost_curve_figure),
        (plot_compare, compare_figure),
    ],
)
def test_plot_takes_its_figures_parameters_declared_once(plot, build):
    import inspect

    shown = inspect.signature(plot)
    assert shown.parameters == inspect.signature(build).parameters  # what help() shows
    assert shown.return_annotation == "ChartWidget"
    assert plot.__name__.startswith("plot_") and plot.__doc__
    with pytest.raises(TypeError, match="widht"):
        plot(None, widht=300)  # a typo is refused, not ignored
