"""Static charts of generation runs, step by step: occupancy, waiting, tokens, KV blocks.

A generation run (the simulator's or a live run's result) carries per-step columns in its
``steps`` (``start_s``, ``num_seqs``, ``num_running``, ``num_waiting``,
``num_prefill_tokens``, ``num_decode_tokens``, ``kv_blocks_used``, ``num_preempted``).
:func:`plot_generation_steps` draws one of them against time for several runs, so a lesson
shows ``static`` and continuous batching side by side. Only attributes are read (duck
typing): the widgets layer uses labserve's public API only.

>>> from labserve.widgets.generation.plots import plot_generation_steps           # doctest: +SKIP
>>> plot_generation_steps({"static": a, "continuous": b}, y="num_seqs")   # doctest: +SKIP

:func:`plot_fidelity` draws what ``labserve.compare_generation`` reports: each figure's
error, simulated against live, as bars in the band of the target.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.models.annotations import BoxAnnotation, Legend, LegendItem  # mypy: not via bokeh.models
from bokeh.models.renderers import GlyphRenderer
from bokeh.palettes import Category10
from bokeh.plotting import figure
from bokeh.transform import dodge

from ..chartwidget import in_a_widget

__all__ = ["STEP_COLUMNS", "generation_steps_figure", "plot_generation_steps"]

STEP_COLUMNS: dict[str, str] = {
    "num_seqs": "sequences in the step",
    "num_running": "sequences running",
    "num_waiting": "sequences waiting",
    "num_prefill_tokens": "prompt tokens in the step",
    "num_decode_tokens": "decode tokens in the step",
    "num_batched_tokens": "tokens in the step",
    "kv_blocks_used": "KV blocks used",
    "num_preempted": "preemptions in the step",
}
"""The per-step columns a chart can show, and their axis labels."""

_COLORS: tuple[str, ...] = Category10[10]


def _column(steps: Any, y: str) -> np.ndarray:
    column: np.ndarray  # steps is Any here: the column typed on its way out
    if y == "num_batched_tokens":
        column = np.asarray(steps.num_prefill_tokens) + np.asarray(steps.num_decode_tokens)
    else:
        column = np.asarray(getattr(steps, y), dtype=float)
    return column


def _thin(x: np.ndarray, y: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``most`` points: means over runs of consecutive steps (the shape survives)."""
    if len(x) <= most:
        return x, y
    edges = np.linspace(0, len(x), most + 1).astype(int)
    starts = edges[:-1]
    counts = np.diff(edges)
    return x[starts], np.add.reduceat(y, starts) / counts


def generation_steps_figure(
    results: Mapping[str, Any],
    *,
    y: str = "num_seqs",
    title: str | None = None,
    max_points: int = 2000,
    width: int = 720,
    height: int = 300,
) -> Any:
    """The Bokeh figure behind :func:`plot_generation_steps`.

    Raises:
        ValueError: no results, or ``y`` is not one of :data:`STEP_COLUMNS`.
        TypeError: a result has no per-step ``steps``.
    """
    if y not in STEP_COLUMNS:
        raise ValueError(f"y must be one of {', '.join(STEP_COLUMNS)}, got {y!r}")
    if not results:
        raise ValueError("results must hold at least one named run, got none")
    fig = figure(
        width=width,
        height=height,
        title=title or f"{STEP_COLUMNS[y]}, step by step",
        x_axis_label="time (s)",
        y_axis_label=STEP_COLUMNS[y],
        tools="pan,wheel_zoom,box_zoom,reset,save",
    )
    sources = []
    for name, result in results.items():
        steps = getattr(result, "steps", None)
        if steps is None or not hasattr(steps, "start_s"):
            raise TypeError(f"{name!r} has no per-step records (a generation run's .steps)")
        x, values = _thin(np.asarray(steps.start_s, float), _column(steps, y), max_points)
        data = {"x": x.tolist(), "y": values.tolist(), "run": [name] * len(x)}
        sources.append((name, ColumnDataSource(data, name=name)))
    # The first run on top, as the legend lists them: drawn last. Dense step lines of two
    # runs overlap most of the time, and the one drawn later hid the other (lesson 09's
    # chunked run vanished under the unchunked one); slightly translucent, both show.
    lines: dict[str, GlyphRenderer[Any]] = {}  # Any: Bokeh's GlyphRenderer is invariant
    for i in reversed(range(len(sources))):
        name, source = sources[i]
        lines[name] = fig.step("x", "y", source=source, mode="after", color=_COLORS[i % 10],
                               line_width=1.5, line_alpha=0.85)  # fmt: skip
    items = [LegendItem(label=name, renderers=[lines[name]]) for name, _ in sources]
    fig.add_tools(HoverTool(tooltips=[("", "@run"), ("t (s)", "@x{0.000}"), ("", "@y{0.[0]}")]))
    # Above the plot, in a row: on the right, long run names took a third of its width.
    legend = Legend(items=items, click_policy="hide", orientation="horizontal")
    fig.add_layout(legend, "above")
    return fig


@in_a_widget(generation_steps_figure)
def plot_generation_steps() -> None:
    """One per-step column of several generation runs against time, a line per run.

    ``results`` maps a name to a run (what ``simulate_generation`` returns); ``y`` is one
    of :data:`STEP_COLUMNS`. Long runs are thinned to ``max_points`` (means over
    consecutive steps). Click a legend entry to hide its line.
    """


def fidelity_figure(
    reports: Mapping[str, Any],
    *,
    title: str = "Simulated against live: error per figure",
    width: int = 720,
    height: int = 320,
) -> Any:
    """The Bokeh figure behind :func:`plot_fidelity`.

    Raises:
        ValueError: no reports.
    """
    if not reports:
        raise ValueError("reports must hold at least one named comparison, got none")
    first = next(iter(reports.values()))
    keys = [(m, q) for m, qs in first.live_ms.items() for q in qs]
    labels = [f"{m} {q}" for m, q in keys]
    fig = figure(
        width=width,
        height=height,
        title=title,
        x_range=FactorRange(factors=labels),
        x_axis_label="figure",
        y_axis_label="simulated / live - 1 (%)",
        tools="save,reset",
    )
    tolerance = float(first.tolerance_pct)
    # The band a figure must fall in to count as a hit (issue 35: 10%).
    band = BoxAnnotation(bottom=-tolerance, top=tolerance, fill_alpha=0.12, fill_color="green")
    band.level = "underlay"  # under the bars, not over them
    fig.add_layout(band)
    n = len(reports)
    width_each = 0.8 / n
    for i, (name, report) in enumerate(reports.items()):
        errors = [report.error_pct(m, q) for m, q in keys]
        offset = -0.4 + width_each * (i + 0.5)
        data = {
            "x": labels,
            "error": [e if np.isfinite(e) else 0.0 for e in errors],
            "live": [report.live_ms[m][q] for m, q in keys],
            "sim": [report.sim_ms[m][q] for m, q in keys],
            "run": [name] * len(keys),
        }
        source = ColumnDataSource(data, name=name)
        fig.vbar(x=dodge("x", offset, range=fig.x_range), top="error", source=source,
                 width=width_each * 0.9,
                 color=_COLORS[i % 10], legend_label=name)  # fmt: skip
    fig.add_tools(
        HoverTool(
            tooltips=[
                ("", "@run"),
                ("error", "@error{+0.0}%"),
                ("live ms", "@live{0.00}"),
                ("sim ms", "@sim{0.00}"),
            ]
        )
    )
    fig.legend.click_policy = "hide"
    return fig


@in_a_widget(fidelity_figure)
def plot_fidelity() -> None:
    """Each comparison's error per figure (p50 and p99 of TTFT, ITL, TPOT, e2e) as bars.

    ``reports`` maps a name (a rate, a cost) to what ``labserve.compare_generation``
    returns; the band is the first report's tolerance.
    """
