"""The dashboard's six Bokeh charts over one ColumnDataSource of ticks, live or for a finished run.

:class:`Charts` owns the sources and figures; whoever streams into them must be the only
writer of their document (the dashboard's pump). :func:`plot` draws the same charts from a
finished :class:`labserve.RunResult`, real or simulated.

Every time chart shares one x range (one time window) and one source (one row per tick). The
axes follow the data; the legends sit beside the plots, never over the lines.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
from bokeh.models import ColumnDataSource, DataRange1d, FixedTicker, HoverTool, LayoutDOM, Range1d
from bokeh.palettes import Category10
from bokeh.plotting import figure

import labserve

from .axes import YAxis
from .charts_base import ChartsBase
from .chartwidget import ChartWidget
from .series import RATE_WINDOW_S, REASONS, TICK_COLUMNS, Rows, fit_cost, result_rows
from .tokens import TOKEN_COLUMNS, token_figure

__all__ = ["Charts", "charts_for_result", "plot"]

_TICK_ROLLOVER = 1500
"""Ticks kept without a time window (a finished run's charts)."""
_FIT_POINTS = 256
"""Recent batches shown against the fitted cost line."""
_COLORS = Category10[10]
_THROUGHPUT = (
    ("served_rps", _COLORS[2], "served"),
    # Each kind of request that got no result, as RunResult.summary() and /metrics count them.
    ("refused_rps", _COLORS[1], "refused (queue full)"),
    ("rejected_rps", _COLORS[3], "rejected (deadline)"),
    ("timeout_rps", _COLORS[5], "timed out"),
    ("failed_rps", _COLORS[4], "failed"),
)
_REASON_COLORS = {
    "full": _COLORS[2],
    "timeout": _COLORS[3],
    "adaptive": _COLORS[0],
    "idle": _COLORS[7],
    "drain": _COLORS[4],
}
_COST_TITLE = "Batch time vs items"
_TITLE_CHARS = 60
"""About the most title characters a chart of the default width (470 px) shows whole, at
Bokeh's 13 px bold title font; the old 75-character fit title was cut off."""


class Charts(ChartsBase):
    """Queue depth, batch sizes, latency percentiles, throughput, fire reasons, cost model.

    ``follow_s``: the time charts show the last that many seconds (live); ``None`` shows
    everything (a finished run: its log axes are fitted by :meth:`fit_log_axes`).
    ``tokens``: a seventh chart, tokens per batch and padding (a method with a ragged axis;
    its rows then carry :data:`~.tokens.TOKEN_COLUMNS`).
    Not thread-safe: one writer streams into it.
    """

    def __init__(
        self,
        *,
        follow_s: float | None = 60.0,
        hz: float = 5.0,
        width: int = 470,
        height: int = 220,
        tokens: bool = False,
    ):
        super().__init__(TICK_COLUMNS + (TOKEN_COLUMNS if tokens else ()), follow_s=follow_s,
                         hz=hz, width=width, height=height,
                         rollover=_TICK_ROLLOVER)  # fmt: skip
        self.fit_points = ColumnDataSource({"items": [], "duration_ms": []})
        self.fit_line = ColumnDataSource({"items": [], "duration_ms": []})
        x_range = self.axes.x if self.axes is not None else DataRange1d(range_padding=0.02)
        self._log_axes: list[YAxis] = []
        self.x_range = x_range
        size: dict[str, Any] = {"width": width, "height": height}
        window = f"{RATE_WINDOW_S:g} s"

        def timeline(
            title: str,
            y_label: str,
            columns: list[str],
            *,
            log: bool = False,
            stacked: bool = False,
        ) -> Any:
            # Counts and rates start at 0; a log axis (batch sizes, latencies) keeps a cap far
            # above the data readable without squashing the data.
            y_range, ticker = self._y_range(columns, log=log, stacked=stacked)
            return self._figure(title, y_label, x_range, y_range, ticker)

        queue = timeline("Queue depth (now)", "waiting (requests, items)",
                         ["queue_requests", "queue_items"])  # fmt: skip
        queue.step("t", "queue_requests", source=self.ticks, color=_COLORS[0],
                   legend_label="requests", mode="after")  # fmt: skip
        queue.step("t", "queue_items", source=self.ticks, color=_COLORS[1],
                   legend_label="items", mode="after", line_dash="dashed")  # fmt: skip

        sizes = timeline("Batch size (each tick's batches)", "items per batch",
                         ["batch_min", "batch_max", "batch_mean", "max_batch_size"],
                         log=True)  # fmt: skip
        # A bar per tick, not a varea: BokehJS draws a varea as one polygon through every
        # finite row, so it bridged the ticks without batches (NaN) that an idle gap leaves.
        self.band = sizes.vbar("t", width=1.0 / hz, bottom="batch_min", top="batch_max",
                               source=self.ticks, fill_color=_COLORS[0], fill_alpha=0.25,
                               line_color=None, legend_label="min-max")  # fmt: skip
        sizes.line("t", "batch_mean", source=self.ticks, color=_COLORS[0], line_width=2,
                   legend_label="mean")  # fmt: skip
        sizes.step("t", "max_batch_size", source=self.ticks, color=_COLORS[3], line_dash="dashed",
                   legend_label="max_batch_size", mode="after", line_width=2)  # fmt: skip

        latency = timeline("Latency of served requests (recorder window)", "ms",
                           ["p50", "p95", "p99", "max_latency_ms", "latency_bound",
                            "latency_slo_ms"], log=True)  # fmt: skip
        for column, color in (("p50", _COLORS[2]), ("p95", _COLORS[1]), ("p99", _COLORS[3])):
            latency.line("t", column, source=self.ticks, color=color, legend_label=column,
                         line_width=2)  # fmt: skip
        latency.step("t", "max_latency_ms", source=self.ticks, color="gray", line_dash="dotted",
                     legend_label="wait cap", mode="after")  # fmt: skip
        latency.line("t", "latency_bound", source=self.ticks, color="gray", line_dash="dashed",
                     legend_label="cap + full batch")  # fmt: skip
        latency.step("t", "latency_slo_ms", source=self.ticks, color=_COLORS[2], line_width=2,
                     line_dash="dashed", legend_label="target", mode="after")  # fmt: skip

        throughput = timeline(f"Throughput (last {window})", "requests / s",
                              [c for c, _, _ in _THROUGHPUT])  # fmt: skip
        for column, color, name in _THROUGHPUT:
            throughput.line("t", column, source=self.ticks, color=color, legend_label=name,
                            line_width=2)  # fmt: skip

        reasons = timeline(f"Why batches fired (last {window})", "batches / s", list(REASONS),
                           stacked=True)  # fmt: skip
        reasons.varea_stack(
            list(REASONS),
            x="t",
            source=self.ticks,
            color=[_REASON_COLORS[r] for r in REASONS],
            legend_label=list(REASONS),
        )

        self.cost_y = Range1d(start=0, end=1)
        cost = figure(title=f"{_COST_TITLE}: no batches yet", y_range=self.cost_y,
                      tools="pan,wheel_zoom,reset,save", **size)  # fmt: skip
        cost.toolbar.logo = None
        cost.xaxis.axis_label = "items in batch"
        cost.yaxis.axis_label = "batch time (ms)"
        cost.scatter("items", "duration_ms", source=self.fit_points, size=4, alpha=0.4,
                     color=_COLORS[0], legend_label="recent batches")  # fmt: skip
        cost.line("items", "duration_ms", source=self.fit_line, color=_COLORS[3], line_width=2,
                  legend_label="adaptive strategy's fit")  # fmt: skip
        cost.add_tools(HoverTool(tooltips=[("items", "@items"), ("ms", "@duration_ms{0.00}")]))

        self.figures = {
            "queue": queue,
            "batch_size": sizes,
            "latency": latency,
            "throughput": throughput,
            "reasons": reasons,
            "cost": cost,
            **({"tokens": token_figure(timeline, self.ticks, _COLORS)} if tokens else {}),
        }
        self.layout: LayoutDOM = self._grid([
            ["queue", "batch_size"],
            ["latency", "throughput"],
            ["reasons", "cost"],
            *([["tokens", None]] if tokens else []),
        ])  # fmt: skip

    def _y_range(
        self, columns: list[str], *, log: bool, stacked: bool
    ) -> tuple[Range1d | DataRange1d, FixedTicker | None]:
        """A time chart's y range, and a log axis's ticker (which moves with the range)."""
        ticker = FixedTicker() if log else None
        if self.axes is not None:
            return self.axes.y(columns, log=log, stacked=stacked, ticker=ticker), ticker
        if log:
            # Without a time window, log axes still follow the data in whole decades (a
            # DataRange1d over a constant, or over no data, gave heaped labels).
            self._log_axes.append(YAxis.empty(columns, log=True, ticker=ticker))
            return self._log_axes[-1].range, ticker
        return DataRange1d(start=0), None

    def fit_log_axes(self) -> None:
        """Without a time window (a finished run): fit the log axes to the rows, in decades."""
        data = cast("Rows", self.ticks.data)
        for axis in self._log_axes:
            axis.fit(*axis.extent(data, 0), shrink=True)

    def set_latency_window(self, window_s: float) -> None:
        """Say in the latency chart's title which window its percentiles cover."""
        title = f"Latency of served requests (last {window_s:g} s)"
        if self.figures["latency"].title.text != title:
            self.figures["latency"].title.text = title

    def show_fit(self, items: list[float], duration_ms: list[float], a_ms: float, b_ms: float,
                 cap: float, c_ms: float = 0.0, width: float = 0.0) -> None:  # fmt: skip
        """Replace the cost chart's points and fitted line (drawn only where there is data).

        The fit is ``a_ms + b_ms * items + c_ms * tokens``; for a padded method (``c_ms``
        and ``width``, its batches' mean padded tokens per item, not 0) the line is drawn at
        that mean width, ``a_ms + (b_ms + c_ms * width) * items``, which is what an item
        costs in the batches it saw. The y axis covers the bulk of the points and the line,
        not a stray stall: points far above are counted in the title. With a single batch
        size the line is not identifiable, and the title says so. ``cap`` (max_batch_size)
        is kept for callers.
        """
        items, duration_ms = items[-_FIT_POINTS:], duration_ms[-_FIT_POINTS:]
        self.fit_points.data = {"items": items, "duration_ms": duration_ms}
        title = self.figures["cost"].title
        if not items:
            self.fit_line.data = {"items": [], "duration_ms": []}
            title.text = f"{_COST_TITLE}: no batches yet"
            return
        lo, hi = min(items), max(items)
        if lo == hi or not (math.isfinite(a_ms) and math.isfinite(b_ms)):
            self.fit_line.data = {"items": [], "duration_ms": []}
            text = f"Batch time: all {lo:g} items, fit not identifiable"
            top_line = 0.0
        else:
            tokens = c_ms != 0.0 and width > 0.0 and math.isfinite(c_ms * width)
            item_ms = b_ms + c_ms * width if tokens else b_ms
            ends = [a_ms + item_ms * lo, a_ms + item_ms * hi]
            self.fit_line.data = {"items": [lo, hi], "duration_ms": ends}
            # Short enough for the chart's width (the longer title was cut off); a negative
            # fixed part is no real cost: the line is only good over the sizes it saw.
            # A padded method's line is at its mean width: the title says which.
            fit = f"Batch ms ≈ {a_ms:.2f} + {item_ms:.3f} * items"
            at = [f" at {width:.0f} tokens/item", f" at {width:.0f} tok/item"] if tokens else [""]
            below = [f" (a < 0: for {lo:g}-{hi:g} only)", " (a < 0)"] if a_ms < 0 else [""]
            forms = [fit + x + y for x in at for y in below]
            text = next((f for f in forms if len(f) <= _TITLE_CHARS), forms[-1])
            top_line = max(ends)
        ms = np.asarray(duration_ms, dtype=float)
        bulk = float(np.percentile(ms, 95)) if len(ms) >= 20 else float(ms.max())
        top = max(bulk, top_line) * 1.25 or 1.0
        above = int((ms > top).sum())
        if above:
            # As much of the note as fits the width (the fit, and a < 0, come first).
            for note in (f" · {above} off-axis (max {ms.max():.0f} ms)", f" · {above} off-axis"):
                if len(text + note) <= _TITLE_CHARS:
                    text += note
                    break
        title.text = text
        end = cast(float, self.cost_y.end)  # Bokeh: a number, datetime or timedelta
        if not math.isclose(end, top, rel_tol=0.1):  # no event for a small change
            self.cost_y.end = top

    def clear(self) -> None:
        """Empty every chart (another method was chosen, or the stats were reset)."""
        super().clear()
        for axis in self._log_axes:
            axis.reset()
        self.show_fit([], [], math.nan, math.nan, math.nan)


def charts_for_result(result: labserve.RunResult, bin_s: float | None = None) -> Charts:
    """The dashboard's charts filled from a finished run (no widget)."""
    charts = Charts(follow_s=None)
    rows = result_rows(result, bin_s)
    charts.ticks.data = rows
    charts.fit_log_axes()
    t = rows["t"]
    charts.band.glyph.width = t[1] - t[0] if len(t) > 1 else t[0]  # each bin's bar
    items = result.batch_items.astype(float)
    a_ms, b_ms = fit_cost(items, result.batch_duration_s)
    cap = float(result.config.get("max_batch_size", max(items, default=1.0)))
    charts.show_fit(items.tolist(), (result.batch_duration_s * 1000.0).tolist(), a_ms, b_ms, cap)
    title = result.label or "run"
    charts.figures["queue"].title.text = f"Queue depth · {title}"
    return charts


def plot(result: labserve.RunResult, bin_s: float | None = None) -> Any:
    """The dashboard's charts for a finished run, as a notebook widget (jupyter_bokeh).

    >>> from labserve.widgets import plot                      # doctest: +SKIP
    >>> plot(labserve.simulate(labserve.arrivals("poisson", rate_rps=2000), duration_s=10))
    """
    return ChartWidget(charts_for_result(result, bin_s).layout)
