"""A search's trade-off as a Pareto plot: tokens/s per replica against tokens/s per user.

Each setting ``labserve.search_generation`` tried is a point at its highest rate within the
targets; the frontier (no other setting faster on both axes) is joined by a line and the
best setting (the highest rate; for fleets, the most per replica) ringed. Only attributes
are read (``rows``, ``frontier()``, ``best``): the widgets layer uses labserve's public API
only.

>>> plot_search(labserve.search_generation(...))   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from ..chartwidget import in_a_widget

__all__ = ["plot_search", "search_figure"]

_KNOBS = (
    "replicas",  # a fleet search's rows (replicas, router) come first
    "router",
    "strategy",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
)


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    data: dict[str, list[Any]] = {
        "user": [r["tokens_per_s_per_user"] for r in rows],
        "replica": [r["tokens_per_s"] for r in rows],
        "rate": [r["max_rate"] for r in rows],
    }
    data["setting"] = [
        ", ".join(f"{k}={r[k]}" for k in _KNOBS if k in r).replace("max_num_", "") for r in rows
    ]
    return data


def search_figure(
    result: Any,
    *,
    title: str = "Settings at their highest rate within the targets",
    width: int = 720,
    height: int = 360,
) -> Any:
    """The Bokeh figure behind :func:`plot_search`.

    Raises:
        ValueError: no setting met the targets at any rate.
    """
    rows = [r for r in result.rows if r["max_rate"] > 0]
    if not rows:
        raise ValueError("no setting met the targets at any rate: nothing to plot")
    fig = figure(
        width=width,
        height=height,
        title=title,
        x_axis_label="tokens/s per user (1000 / TPOT p50)",
        y_axis_label="tokens/s per replica",
        tools="pan,wheel_zoom,box_zoom,reset,save",
    )
    every = ColumnDataSource(_columns(rows), name="settings")
    fig.scatter("user", "replica", source=every, size=7, alpha=0.5, color="gray",
                legend_label="setting")  # fmt: skip
    front = sorted(result.frontier(), key=lambda r: r["tokens_per_s_per_user"])
    edge = ColumnDataSource(_columns(front), name="frontier")
    fig.line("user", "replica", source=edge, color="firebrick", line_width=2,
             legend_label="frontier")  # fmt: skip
    fig.scatter("user", "replica", source=edge, size=8, color="firebrick")
    best = ColumnDataSource(_columns([result.best]), name="best")
    fig.scatter("user", "replica", source=best, size=16, fill_alpha=0, line_width=2,
                color="navy", legend_label="best")  # fmt: skip
    fig.add_tools(
        HoverTool(
            tooltips=[
                ("", "@setting"),
                ("rate", "@rate{0.0} req/s"),
                ("per replica", "@replica{0,0} tok/s"),
                ("per user", "@user{0.0} tok/s"),
            ]
        )
    )
    fig.legend.location = "top_right"
    return fig


@in_a_widget(search_figure)
def plot_search() -> None:
    """A search's settings, tokens/s per replica against per user, the frontier marked.

    ``result`` is what ``labserve.search_generation`` returns.
    """
