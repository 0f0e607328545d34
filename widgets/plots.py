"""Static charts for the lessons: sweep trade-off curves, cost curves, strategies side by side.

Each ``*_figure`` function builds a plain Bokeh layout from labserve's public results (sweep
rows, :class:`labserve.CostCurve`, :class:`labserve.RunResult`); each ``plot_*`` function wraps
that layout in a jupyter_bokeh widget. Displaying one loads BokehJS into the page inline, once
per kernel (see :func:`labserve.widgets.load_bokehjs`): nothing is fetched from a CDN.

>>> from labserve import sweep
>>> from labserve.widgets import plot_sweep
>>> rows = sweep(rates=[500, 2000], max_batch_size=[8, 64], duration_s=1)
>>> chart = plot_sweep(rows, x="served_rps", y="latency_p99_ms", group_by="max_batch_size")
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.models.annotations import Legend, LegendItem, Span  # mypy: not via bokeh.models
from bokeh.models.renderers import GlyphRenderer
from bokeh.palettes import Category10
from bokeh.plotting import figure

import labserve

from .chartwidget import in_a_widget

__all__ = [
    "compare_figure",
    "compare_series",
    "cost_curve_figure",
    "plot_compare",
    "plot_cost_curve",
    "plot_sweep",
    "sweep_figure",
]

_WIDTH = 720
_HEIGHT = 300
_COLORS: tuple[str, ...] = Category10[10]
_TURNED_AWAY = [labserve.OUTCOMES.index("rejected"), labserve.OUTCOMES.index("refused")]
"""Outcome codes of requests that never reached the model for overload."""

# Columns that read better with a short axis label than with their key.
_LABELS = {
    "served_rps": "served requests/s",
    "offered_rps": "offered requests/s",
    "rate": "offered requests/s",
    "latency_p50_ms": "p50 latency (ms)",
    "latency_p95_ms": "p95 latency (ms)",
    "latency_p99_ms": "p99 latency (ms)",
    "queue_wait_p50_ms": "p50 queue wait (ms)",
    "queue_wait_p99_ms": "p99 queue wait (ms)",
    "mean_batch": "mean batch (items)",
    "max_batch_size": "max_batch_size (items)",
    "max_latency_ms": "max_latency_ms",
    "rejected_pct": "rejected (%)",
}


def _label(column: str) -> str:
    return _LABELS.get(column, column)


def _rows_of(table_or_rows: Any) -> list[dict[str, Any]]:
    """Sweep rows as a list of dicts, from a list of mappings or a pandas DataFrame."""
    if hasattr(table_or_rows, "to_dict") and hasattr(table_or_rows, "columns"):
        return [dict(r) for r in table_or_rows.to_dict(orient="records")]
    if isinstance(table_or_rows, Mapping) or not isinstance(table_or_rows, Iterable):
        raise TypeError(
            "plot_sweep() takes the rows labserve.sweep() returns (a list of dicts) or a "
            f"pandas DataFrame of them, got {type(table_or_rows).__name__}"
        )
    rows = [dict(r) for r in table_or_rows]
    if not rows:
        raise ValueError("plot_sweep() needs at least one row, got none")
    return rows


def _check_column(role: str, column: str, columns: Sequence[str]) -> None:
    if column not in columns:
        choices = ", ".join(columns)
        raise ValueError(f"{role} must be one of the table's columns ({choices}), got {column!r}")


def _number(value: Any) -> float:
    """A table cell as a float for plotting; NaN for a missing or non-numeric cell."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        return math.nan
    return float(value)


def sweep_figure(
    table_or_rows: Any,
    *,
    x: str = "served_rps",
    y: str = "latency_p99_ms",
    group_by: str | Sequence[str] | None = "max_batch_size",
    title: str | None = None,
    x_log: bool = False,
    y_log: bool = False,
    y_line: float | None = None,
    width: int = _WIDTH,
    height: int = _HEIGHT,
) -> Any:
    """The Bokeh figure behind :func:`plot_sweep`: one line per group, points sorted by ``x``.

    Raises:
        TypeError: ``table_or_rows`` is not a list of rows or a DataFrame.
        ValueError: no rows, or ``x``, ``y`` or a ``group_by`` column is not in the table
            (the message lists the columns there are).
    """
    rows = _rows_of(table_or_rows)
    columns = list(rows[0])
    _check_column("x", x, columns)
    _check_column("y", y, columns)
    keys = [group_by] if isinstance(group_by, str) else list(group_by or [])
    for key in keys:
        _check_column("group_by", key, columns)

    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)

    fig = figure(
        width=width,
        height=height,
        title=title or f"{_label(y)} against {_label(x)}",
        x_axis_label=_label(x),
        y_axis_label=_label(y),
        x_axis_type="log" if x_log else "linear",
        y_axis_type="log" if y_log else "linear",
        tools="pan,wheel_zoom,box_zoom,reset,save",
    )
    items = []
    for i, (group, members) in enumerate(groups.items()):
        members = sorted(members, key=lambda r: _number(r[x]))
        name = ", ".join(f"{k}={v}" for k, v in zip(keys, group, strict=True)) or y
        data: dict[str, list[Any]] = {
            "x": [_number(r[x]) for r in members],
            "y": [_number(r[y]) for r in members],
            "group": [name] * len(members),
        }
        for column in columns:
            data.setdefault(f"col_{column}", [r.get(column) for r in members])
        source = ColumnDataSource(data, name=name)
        color = _COLORS[i % len(_COLORS)]
        line = fig.line("x", "y", source=source, color=color, line_width=2)
        dots = fig.scatter("x", "y", source=source, color=color, size=6)
        # Any: Bokeh types GlyphRenderer invariant in its glyph (a Line's is no Glyph's).
        renderers: list[GlyphRenderer[Any]] = [line, dots]
        items.append(LegendItem(label=name, renderers=renderers))
    fig.add_tools(
        HoverTool(
            tooltips=[("", "@group"), (_label(x), "@x{0,0.[00]}"), (_label(y), "@y{0,0.[00]}")]
        )
    )
    if y_line is not None:
        fig.add_layout(Span(location=y_line, dimension="width", line_dash="dashed"))
    if keys:
        legend = Legend(items=items, click_policy="hide", title=", ".join(keys))
        fig.add_layout(legend, "right")
    return fig


@in_a_widget(sweep_figure)
def plot_sweep() -> None:
    """Trade-off curves from :func:`labserve.sweep` rows: ``y`` against ``x``, a line per group.

    ``group_by`` is a column, several columns, or None (one line). ``y_line`` draws a dashed
    horizontal reference (a latency target, say). Click a legend entry to hide its line.

    >>> plot_sweep(rows, x="rate", y="latency_p50_ms", group_by=("strategy", "max_batch_size"))
    ... # doctest: +SKIP
    """


def cost_curve_figure(
    curve: labserve.CostCurve, *, width: int = _WIDTH, height: int = _HEIGHT
) -> Any:
    """The Bokeh layout behind :func:`plot_cost_curve`: ms per item, and items/s, by batch size."""
    sizes = [float(n) for n in curve.sizes]
    per_item = curve.per_item_ms()
    items_ps = [n / m for n, m in zip(curve.sizes, curve.median_s, strict=True)]
    fit_items = [curve.fit.seconds(int(n)) * 1000.0 / n for n in curve.sizes]
    source = ColumnDataSource(
        {
            "batch": sizes,
            "ms_per_call": [m * 1000.0 for m in curve.median_s],
            "ms_per_item": per_item,
            "fit_ms_per_item": fit_items,
            "items_ps": items_ps,
        },
        name="cost_curve",
    )
    common: dict[str, Any] = {
        "width": width // 2,
        "height": height,
        "x_axis_type": "log",
        "x_axis_label": "batch size (items)",
        "tools": "pan,wheel_zoom,reset,save",
    }
    cost = figure(title="cost per item", y_axis_label="ms per item", **common)
    cost.line("batch", "ms_per_item", source=source, line_width=2, legend_label="measured")
    cost.scatter("batch", "ms_per_item", source=source, size=6)
    cost.line(
        "batch",
        "fit_ms_per_item",
        source=source,
        line_dash="dashed",
        color=_COLORS[1],
        legend_label=f"fit {curve.fit.a_ms:.2f} ms + {curve.fit.b_ms:.3f} ms x items",
    )
    rate = figure(title="model throughput", y_axis_label="items per second", **common)
    rate.x_range = cost.x_range
    rate.line("batch", "items_ps", source=source, line_width=2, color=_COLORS[2])
    rate.scatter("batch", "items_ps", source=source, size=6, color=_COLORS[2])
    for fig in (cost, rate):
        fig.add_tools(
            HoverTool(
                tooltips=[
                    ("batch", "@batch"),
                    ("ms/call", "@ms_per_call{0.000}"),
                    ("ms/item", "@ms_per_item{0.000}"),
                    ("items/s", "@items_ps{0,0}"),
                ]
            )
        )
    return gridplot([[cost, rate]], toolbar_location="right")


@in_a_widget(cost_curve_figure)
def plot_cost_curve() -> None:
    """A profiled model's cost per item and throughput against batch size, side by side.

    ``curve`` is what :func:`labserve.profile` returns; the dashed line is its linear fit.
    """


def _results_of(results: Any) -> list[tuple[str, labserve.RunResult]]:
    """(name, RunResult) pairs from a mapping or a sequence of labelled results."""
    if isinstance(results, labserve.RunResult):
        results = [results]
    if isinstance(results, Mapping):
        pairs = [(str(k), v) for k, v in results.items()]
    else:
        pairs = [(r.label or f"run {i + 1}", r) for i, r in enumerate(results)]
    if not pairs:
        raise ValueError("plot_compare() needs at least one RunResult, got none")
    for name, result in pairs:
        if not isinstance(result, labserve.RunResult):
            raise TypeError(f"{name!r} must be a labserve.RunResult, got {type(result).__name__}")
    return pairs


def _per_second(times: np.ndarray, edges: np.ndarray) -> list[float]:
    """Events per second in each time bin."""
    counts, _ = np.histogram(times, bins=edges)
    return [float(c) / float(edges[1] - edges[0]) for c in counts]


def _binned(times: np.ndarray, values: np.ndarray, edges: np.ndarray, how: str) -> list[float]:
    """``how`` ("p99" or "mean") of ``values`` in each time bin; NaN for an empty bin."""
    which = np.searchsorted(edges, times, side="right") - 1
    out = []
    for k in range(len(edges) - 1):
        v = values[which == k]
        if not len(v):
            out.append(math.nan)
        elif how == "mean":
            out.append(float(v.mean()))
        else:
            out.append(float(np.percentile(v, 99)))
    return out


def compare_series(
    results: Mapping[str, labserve.RunResult] | Sequence[labserve.RunResult],
    *,
    bin_s: float = 0.05,
) -> dict[str, dict[str, list[float]]]:
    """Per-run time series in ``bin_s`` bins, by arrival (latency) or batch start (batches).

    Columns: ``t`` (bin start, s), ``offered_rps``, ``p99_ms`` (served requests that arrived in
    the bin), ``mean_batch`` (items per batch started in the bin), ``rejected_rps`` (requests
    turned away without starting a batch).
    """
    if not (isinstance(bin_s, (int, float)) and math.isfinite(bin_s) and bin_s > 0):
        raise ValueError(f"bin_s must be a finite number > 0, got {bin_s!r}")
    pairs = _results_of(results)
    # Bins cover the offered load and the batches that drained it after the run's end.
    span = max(
        max(
            r.duration_s,
            float(r.arrival_s.max(initial=0.0)),
            float(r.batch_start_s.max(initial=0.0)),
        )
        for _, r in pairs
    )
    edges = np.arange(math.floor(span / bin_s) + 2) * bin_s
    out = {}
    for name, r in pairs:
        served = r.served
        latency_ms = (r.finish_s - r.arrival_s)[served] * 1000.0
        refused = np.isin(r.outcome, _TURNED_AWAY)
        out[name] = {
            "t": [float(t) for t in edges[:-1]],
            "offered_rps": _per_second(r.arrival_s, edges),
            "p99_ms": _binned(r.arrival_s[served], latency_ms, edges, "p99"),
            "mean_batch": _binned(r.batch_start_s, r.batch_items.astype(float), edges, "mean"),
            "rejected_rps": _per_second(r.arrival_s[refused], edges),
        }
    return out


def compare_figure(
    results: Mapping[str, labserve.RunResult] | Sequence[labserve.RunResult],
    *,
    bin_s: float = 0.05,
    latency_line_ms: float | None = None,
    width: int = _WIDTH,
    height: int = 200,
) -> Any:
    """The Bokeh layout behind :func:`plot_compare`: offered load, p99 latency, batch size."""
    series = compare_series(results, bin_s=bin_s)
    first = next(iter(series.values()))
    common: dict[str, Any] = {"width": width, "height": height,
                              "tools": "xpan,xwheel_zoom,reset,save"}  # fmt: skip
    load = figure(title="offered load", y_axis_label="requests/s", **common)
    load.step("t", "offered_rps", source=ColumnDataSource(first, name="load"), mode="after")
    title = f"p99 latency of the requests arriving in each {bin_s * 1000:g} ms"
    p99 = figure(title=title, y_axis_label="ms", x_range=load.x_range, **common)
    batch = figure(title="mean batch size", y_axis_label="items", x_axis_label="time (s)",
                   x_range=load.x_range, **common)  # fmt: skip
    p99_items: list[tuple[str, list[GlyphRenderer[Any]]]] = []  # Any: as in sweep_figure
    batch_items: list[tuple[str, list[GlyphRenderer[Any]]]] = []
    for i, (name, data) in enumerate(series.items()):
        source = ColumnDataSource(data, name=name)
        color = _COLORS[i % len(_COLORS)]
        p99_items.append(
            (name, [p99.line("t", "p99_ms", source=source, color=color, line_width=2)])
        )
        batch_items.append(
            (name, [batch.line("t", "mean_batch", source=source, color=color, line_width=2)])
        )
    if latency_line_ms is not None:
        p99.add_layout(Span(location=latency_line_ms, dimension="width", line_dash="dashed"))
    for fig, items in ((p99, p99_items), (batch, batch_items)):
        fig.add_layout(Legend(items=items, click_policy="hide", location="top_left"))
    return gridplot([[load], [p99], [batch]], toolbar_location="right")


@in_a_widget(compare_figure)
def plot_compare() -> None:
    """The same trace through several runs, side by side over time, one line per run.

    ``results`` maps a name (the strategy, say) to a :class:`labserve.RunResult`, or is a
    sequence of results named by their labels. Three charts share the time axis: the offered
    load (of the first run), the p99 latency of the requests arriving in each ``bin_s``, and
    the mean batch size of the batches started in it. ``latency_line_ms`` draws a dashed
    reference (``max_latency_ms``, say). Each chart holds one point per bin, so a long trace
    stays small in the notebook.
    """
