"""The dashboard's six Bokeh charts over two ColumnDataSources, for live runs and finished ones.

:class:`Charts` owns the sources and figures; whoever streams into them must be the only
writer of their document (the dashboard's pump). :func:`plot` draws the same charts from a
finished :class:`labserve.RunResult`, real or simulated.
"""

from __future__ import annotations

import math
from typing import Any

from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, DataRange1d, HoverTool, LayoutDOM, Legend
from bokeh.palettes import Category10
from bokeh.plotting import figure

import labserve

from .chartwidget import ACK_NAME, ChartWidget
from .series import BATCH_COLUMNS, REASONS, ROLLING, TICK_COLUMNS, Rows, fit_cost, result_rows

__all__ = ["Charts", "charts_for_result", "plot"]

_TICK_ROLLOVER = 1500
"""Ticks kept: 5 minutes at 5 Hz."""
_BATCH_ROLLOVER = 5000
"""Batches kept in the batch-size chart."""
_FIT_POINTS = 256
"""Recent batches shown against the fitted cost line."""
_COLORS = Category10[10]
_REASON_COLORS = {
    "full": _COLORS[2],
    "timeout": _COLORS[3],
    "adaptive": _COLORS[0],
    "idle": _COLORS[7],
    "drain": _COLORS[4],
}


class Charts:
    """Queue depth, batch sizes, latency percentiles, throughput, fire reasons, cost model.

    ``follow_s``: the time charts show the last that many seconds (live); ``None`` shows
    everything (a finished run). Not thread-safe: one writer streams into it.
    """

    def __init__(self, *, follow_s: float | None = 60.0, width: int = 430, height: int = 210):
        self.ticks = ColumnDataSource({c: [] for c in TICK_COLUMNS})
        self.batches = ColumnDataSource({c: [] for c in BATCH_COLUMNS})
        self.fit_points = ColumnDataSource({"items": [], "duration_ms": []})
        self.fit_line = ColumnDataSource({"items": [], "duration_ms": []})
        if follow_s is not None:
            x_range = DataRange1d(follow="end", follow_interval=follow_s, range_padding=0)
        else:
            x_range = DataRange1d(range_padding=0.02)
        self.x_range = x_range
        size = {"width": width, "height": height}

        def timeline(title: str, y_label: str) -> Any:
            fig = figure(title=title, x_range=x_range, tools="pan,wheel_zoom,reset,save", **size)
            fig.xaxis.axis_label = "time (s)"
            fig.yaxis.axis_label = y_label
            fig.toolbar.logo = None
            return fig

        queue = timeline("Queue depth", "waiting")
        queue.step("t", "queue_requests", source=self.ticks, color=_COLORS[0],
                   legend_label="requests", mode="after")  # fmt: skip
        queue.step("t", "queue_items", source=self.ticks, color=_COLORS[1],
                   legend_label="items", mode="after", line_dash="dashed")  # fmt: skip

        sizes = timeline("Batch size as batches fire", "items per batch")
        sizes.scatter("t", "items", source=self.batches, size=3, alpha=0.35, color=_COLORS[0],
                      legend_label="batch")  # fmt: skip
        sizes.line("t", "rolling_mean", source=self.batches, color=_COLORS[1], line_width=2,
                   legend_label=f"rolling mean ({ROLLING})")  # fmt: skip
        sizes.step("t", "max_batch_size", source=self.ticks, color=_COLORS[3], line_dash="dashed",
                   legend_label="max_batch_size", mode="after")  # fmt: skip

        latency = timeline("Latency (window)", "ms")
        for column, color in (("p50", _COLORS[2]), ("p95", _COLORS[1]), ("p99", _COLORS[3])):
            latency.line("t", column, source=self.ticks, color=color, legend_label=column,
                         line_width=2)  # fmt: skip
        latency.line("t", "latency_bound", source=self.ticks, color="gray", line_dash="dashed",
                     legend_label="wait cap + full batch")  # fmt: skip

        throughput = timeline("Throughput", "requests / s")
        for column, color, name in (
            ("served_rps", _COLORS[2], "served"),
            ("rejected_rps", _COLORS[3], "rejected"),
            ("failed_rps", _COLORS[4], "failed"),
        ):
            throughput.line("t", column, source=self.ticks, color=color, legend_label=name,
                            line_width=2)  # fmt: skip

        reasons = timeline("Why batches fired", "batches / s")
        reasons.varea_stack(
            list(REASONS),
            x="t",
            source=self.ticks,
            color=[_REASON_COLORS[r] for r in REASONS],
            legend_label=list(REASONS),
        )

        cost = figure(title="Adaptive cost model: batch time vs items",
                      tools="pan,wheel_zoom,reset,save", **size)  # fmt: skip
        cost.toolbar.logo = None
        cost.xaxis.axis_label = "items in batch"
        cost.yaxis.axis_label = "batch time (ms)"
        cost.scatter("items", "duration_ms", source=self.fit_points, size=4, alpha=0.4,
                     color=_COLORS[0], legend_label="recent batches")  # fmt: skip
        cost.line("items", "duration_ms", source=self.fit_line, color=_COLORS[3], line_width=2,
                  legend_label="fitted a + b·items")  # fmt: skip
        cost.add_tools(HoverTool(tooltips=[("items", "@items"), ("ms", "@duration_ms{0.00}")]))

        self.figures = {
            "queue": queue,
            "batch_size": sizes,
            "latency": latency,
            "throughput": throughput,
            "reasons": reasons,
            "cost": cost,
        }
        for fig in self.figures.values():
            for legend in fig.select(type=Legend):
                legend.location = "top_left"
                legend.label_text_font_size = "8pt"
                legend.background_fill_alpha = 0.6
                legend.click_policy = "hide"
        self.layout: LayoutDOM = gridplot(
            [[queue, sizes], [latency, throughput], [reasons, cost]],
            toolbar_location="right",
            merge_tools=True,
        )
        # The model a ChartWidget's patches number themselves on (flow control); no view.
        self.layout.tags = [ColumnDataSource(name=ACK_NAME)]

    def stream(self, tick: Rows, batches: Rows) -> None:
        """Append rows, dropping the oldest past the rollover."""
        if tick["t"]:
            self.ticks.stream(tick, rollover=_TICK_ROLLOVER)
        if batches["t"]:
            self.batches.stream(batches, rollover=_BATCH_ROLLOVER)

    def show_fit(self, items: list[float], duration_ms: list[float], a_ms: float, b_ms: float,
                 cap: float) -> None:  # fmt: skip
        """Replace the cost chart's points and fitted line."""
        self.fit_points.data = {
            "items": items[-_FIT_POINTS:],
            "duration_ms": duration_ms[-_FIT_POINTS:],
        }
        if math.isfinite(a_ms) and math.isfinite(b_ms):
            top = max([cap, *items]) if items else cap
            self.fit_line.data = {"items": [0.0, top], "duration_ms": [a_ms, a_ms + b_ms * top]}
        else:
            self.fit_line.data = {"items": [], "duration_ms": []}

    def clear(self) -> None:
        """Empty every chart (another method was chosen, or the stats were reset)."""
        self.ticks.data = {c: [] for c in TICK_COLUMNS}
        self.batches.data = {c: [] for c in BATCH_COLUMNS}
        self.fit_points.data = {"items": [], "duration_ms": []}
        self.fit_line.data = {"items": [], "duration_ms": []}


def charts_for_result(result: labserve.RunResult, bin_s: float | None = None) -> Charts:
    """The dashboard's charts filled from a finished run (no widget)."""
    tick, batches = result_rows(result, bin_s)
    charts = Charts(follow_s=None)
    charts.ticks.data = tick
    charts.batches.data = batches
    a_ms, b_ms = fit_cost(result.batch_items, result.batch_duration_s)
    cap = float(result.config.get("max_batch_size", max(batches["items"], default=1.0)))
    charts.show_fit(batches["items"], batches["duration_ms"], a_ms, b_ms, cap)
    title = result.label or "run"
    charts.figures["queue"].title.text = f"Queue depth · {title}"
    return charts


def plot(result: labserve.RunResult, bin_s: float | None = None) -> Any:
    """The dashboard's charts for a finished run, as a notebook widget (jupyter_bokeh).

    >>> from labserve.widgets import plot                      # doctest: +SKIP
    >>> plot(labserve.simulate(labserve.arrivals("poisson", rate_rps=2000), duration_s=10))
    """
    return ChartWidget(charts_for_result(result, bin_s).layout)
