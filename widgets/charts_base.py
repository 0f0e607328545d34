"""What both dashboards' chart grids share: one source of tick rows, time figures, the grid.

:class:`ChartsBase` owns the ColumnDataSource of rows (one per pump tick), the stepped time
axes that follow the last ``follow_s`` seconds, how many rows are kept for them, streaming
and clearing; :meth:`~ChartsBase._figure` makes a time chart in the house style and
:meth:`~ChartsBase._grid` lays the charts out with their keys under them. The charts
themselves (:class:`~labserve.widgets.charts.Charts`,
:class:`~labserve.widgets.generation.charts.GenerationCharts`) differ and stay in their
modules. Not thread-safe: one writer (the dashboard's pump) streams into them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from bokeh.layouts import column as stack
from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, FixedTicker, LayoutDOM
from bokeh.models.annotations import Legend  # mypy: not via bokeh.models (the same class)
from bokeh.models.widgets import Div
from bokeh.plotting import figure

from .axes import SteppedAxes, tick_log_axis
from .chartwidget import ACK_NAME

__all__ = ["KEY_STYLE", "ChartsBase", "Rows", "legend_key"]

Rows = dict[str, list[float]]
"""Chart rows by column, each list one value a row."""

KEY_STYLE: dict[str, str | None] = {
    "font-size": "11px",
    "padding-left": "50px",
    "white-space": "nowrap",
}


def legend_key(fig: Any) -> str:
    """The figure's legend as one line of HTML (a coloured mark and a label per item)."""
    parts = []
    for legend in list(fig.select(type=Legend)):
        for item in legend.items:
            glyph = item.renderers[0].glyph
            color = getattr(glyph, "line_color", None) or getattr(glyph, "fill_color", "gray")
            if "Area" in type(glyph).__name__ or "Bar" in type(glyph).__name__:
                color = glyph.fill_color
                mark = "&#9608;"  # a block: a filled band
            else:
                mark = "&#8943;&#8943;" if getattr(glyph, "line_dash", []) else "&#9473;&#9473;"
            label = html.escape(str(item.label.value))
            parts.append(f"<span style='color:{color}'>{mark}</span>&nbsp;{label}")
        fig.center.remove(legend)
    return " &nbsp; ".join(parts)


class ChartsBase:
    """Rows of ``columns`` in one source, time charts over them, laid out in a grid.

    ``follow_s``: the time charts show the last that many seconds, on axes the kernel moves
    in steps (see ``axes.py``); ``None`` shows everything (a finished run's charts keep
    ``rollover`` rows then). ``hz``: rows a second, live. A subclass makes its
    :attr:`figures` and lays them out in :attr:`layout` with :meth:`_grid`.
    """

    layout: LayoutDOM
    """The charts, what a ChartWidget shows."""

    def __init__(
        self,
        columns: tuple[str, ...],
        *,
        follow_s: float | None,
        hz: float,
        width: int,
        height: int,
        rollover: int = 0,
    ) -> None:
        self.columns = columns
        """The columns of each row streamed."""
        self.ticks = ColumnDataSource({c: [] for c in columns})
        self.axes = SteppedAxes(follow_s) if follow_s is not None else None
        # Live, the source keeps only the rows the window shows (each row kept is drawn on
        # every frame): the window and the two steps the axis may lag behind it.
        self._rollover = (
            rollover
            if self.axes is None
            else math.ceil((self.axes.follow_s + 2 * self.axes.step_s) * hz)
        )
        self._size: dict[str, Any] = {"width": width, "height": height}
        self.figures: dict[str, Any] = {}

    def _figure(
        self,
        title: str,
        y_label: str,
        x_range: Any,
        y_range: Any,
        ticker: FixedTicker | None = None,
    ) -> Any:
        """A time chart: ``y_label`` against time, a log axis if it has a ``ticker``."""
        fig = figure(title=title, x_range=x_range, y_range=y_range,
                     y_axis_type="log" if ticker is not None else "linear",
                     tools="pan,wheel_zoom,reset,save", **self._size)  # fmt: skip
        if ticker is not None:
            tick_log_axis(fig, ticker)
        fig.xaxis.axis_label = "time (s)"
        fig.yaxis.axis_label = y_label
        fig.toolbar.logo = None
        return fig

    def _grid(self, rows: Sequence[Sequence[str | None]]) -> LayoutDOM:
        """:attr:`figures` by name in ``rows``, each with its key under it, one toolbar.

        The keys are HTML under each plot, not Bokeh legends: a legend is redrawn (on a
        fresh canvas layer) with every frame, a key is drawn once. And they hide no data.
        Under, not above: above, a second-row key sat under the first row's axis and read
        as that chart's. Vertical grid lines would move with the window at every tick: none.
        """
        cells = {}
        for name, fig in self.figures.items():
            fig.xgrid.visible = False
            cells[name] = stack(fig, Div(text=legend_key(fig), styles=dict(KEY_STYLE)),
                                spacing=0)  # fmt: skip
        layout: LayoutDOM = gridplot(
            [[None if name is None else cells[name] for name in row] for row in rows],
            toolbar_location="right",
            merge_tools=True,
        )
        # The model a ChartWidget's patches number themselves on (flow control); no view.
        layout.tags = [ColumnDataSource(name=ACK_NAME)]
        return layout

    def stream(self, tick: Rows) -> None:
        """Append rows, dropping the oldest past the rollover; move the axes if they must."""
        if tick["t"]:
            rows: dict[str, Any] = {c: tick[c] for c in self.columns}
            self.ticks.stream(rows, rollover=self._rollover)
            if self.axes is not None:
                data: dict[str, Any] = dict(self.ticks.data)
                self.axes.update(data, len(tick["t"]))

    def clear(self) -> None:
        """Empty every chart (another method was chosen, or the stats were reset)."""
        self.ticks.data = {c: [] for c in self.columns}
        if self.axes is not None:
            self.axes.reset()
