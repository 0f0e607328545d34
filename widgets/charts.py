"""The dashboard's six Bokeh charts over two ColumnDataSources, for live runs and finished ones.

:class:`Charts` owns the sources and figures; whoever streams into them must be the only
writer of their document (the dashboard's pump). :func:`plot` draws the same charts from a
finished :class:`labserve.RunResult`, real or simulated.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

from bokeh.core.serialization import Serializer
from bokeh.document.events import ColumnsStreamedEvent
from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, DataRange1d, HoverTool, LayoutDOM, Legend
from bokeh.palettes import Category10
from bokeh.plotting import figure
from bokeh.protocol.messages.patch_doc import patch_doc
from jupyter_bokeh import BokehModel

import labserve

from .bokehjs import load_bokehjs
from .series import BATCH_COLUMNS, REASONS, ROLLING, TICK_COLUMNS, Rows, fit_cost, result_rows

__all__ = ["ChartWidget", "Charts", "charts_for_result", "one_patch_per_widget", "plot"]

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


_batch = threading.local()


@contextlib.contextmanager
def one_patch_per_widget() -> Iterator[None]:
    """Send a ChartWidget's document changes made in this block (on this thread) as one patch.

    A pump tick then costs the page one message instead of four.
    """
    _batch.pending = pending = {}
    try:
        yield
    finally:
        del _batch.pending
        for widget, events in pending.items():
            widget._send_patch(events)


_MAX_UNACKED = 8
"""Changes sent but not yet drawn by the page before more are held back (and merged)."""
_ACK_TIMEOUT_S = 3.0
"""With no word from the page for this long (no view open), send anyway."""


def _merged(events: list[Any]) -> list[Any]:
    """Held changes as few as possible: streams into one source become one stream."""
    out: list[Any] = []
    for event in events:
        last = next((o for o in reversed(out) if getattr(o, "model", None) is event.model), None)
        if (
            isinstance(event, ColumnsStreamedEvent)
            and isinstance(last, ColumnsStreamedEvent)
            and last.rollover == event.rollover
            and set(last.data) == set(event.data)
        ):
            keep = event.rollover or None
            data = {k: (list(last.data[k]) + list(event.data[k]))[-keep if keep else 0 :]
                    for k in event.data}  # fmt: skip
            merged = ColumnsStreamedEvent(
                event.document, event.model, event.attr, data, event.rollover, event.setter
            )
            out[out.index(last)] = merged
        else:
            out.append(event)
    return out


class ChartWidget(BokehModel):  # type: ignore[misc]
    """jupyter_bokeh's widget for display-only charts that a pump thread streams into.

    What it changes, each found in a real browser: a patch reaches the page in a framing no
    view can read out of step; nothing the page sends back changes the document (the pump
    stays its only writer); a tick's changes travel as one patch; a page that draws slower
    than the pump streams gets fewer, merged patches instead of a growing backlog;
    ``close()`` may be called twice (jupyter_bokeh's raises KeyError the second time, and
    ipywidgets calls it again when the widget is collected).
    """

    _closed = False

    def __init__(self, model: Any, **kwargs: Any) -> None:
        self._flow = threading.Lock()
        self._held: list[Any] = []
        self._unacked = 0
        self._last_heard = time.monotonic()
        super().__init__(model, **kwargs)

    def _document_patched(self, event: Any) -> None:
        if event.setter is self:
            return
        pending = getattr(_batch, "pending", None)
        if pending is not None:
            pending.setdefault(self, []).append(event)
        else:
            self._send_patch([event])

    def _send_patch(self, events: list[Any]) -> None:
        # Flow control: BokehJS sends back each change it has applied (see _sync_model), so
        # the changes sent and not yet drawn are known. Past a few, hold the new ones and
        # send them merged once the page catches up: a slow page draws less often instead of
        # falling further and further behind the live numbers.
        with self._flow:
            self._held += events
            now = time.monotonic()
            if self._unacked >= _MAX_UNACKED and now - self._last_heard < _ACK_TIMEOUT_S:
                return
            if self._unacked >= _MAX_UNACKED:  # no word for a while: no view is drawing
                self._unacked = 0
                self._last_heard = now
            events, self._held = _merged(self._held), []
            self._unacked += len(events)
        # jupyter_bokeh sends a patch as three comm messages (header, metadata, content) that
        # BokehJS reassembles in order. A view that starts listening between two of them (a
        # chart displayed, or a page reloaded, while a pump streams) reads every later patch
        # out of step and stops updating for good. Here each message is one JSON object that
        # is all three at once, sent three times: whichever copy lands in the content slot,
        # every patch is applied exactly once. (Arrays would go inline, not as buffers, so a
        # message stays one fragment; the charts stream lists, cheaper here than arrays.)
        doc = events[0].document
        # References: the changed models only (the page has them all already); passing every
        # model of the document costs a dict of ~300 entries per tick.
        touched = {e.model for e in events if getattr(e, "model", None) is not None}
        serializer = Serializer(references=touched, deferred=False)
        content = {"events": serializer.encode(events)}
        doc.models.flush_synced(lambda model: not serializer.has_ref(model))
        whole = json.dumps({**patch_doc.create_header(), "num_buffers": 0, **content})
        for _ in range(3):
            self.send({"msg": "patch", "payload": whole})

    def _sync_model(self, _model: Any, content: dict[str, Any], _buffers: list[Any]) -> None:
        # BokehJS sends back each change it applied (and each view's pans and zooms). Applying
        # that here would make the kernel's main thread a second writer of the document and
        # double every streamed row: views are display-only. It does say the page has drawn.
        if content.get("event") == "jsevent":
            with self._flow:
                self._unacked = max(self._unacked - 1, 0)
                self._last_heard = time.monotonic()

    def __repr__(self) -> str:
        # The default repr holds random document ids: a saved notebook output would change.
        return f"ChartWidget({type(self._model).__name__})"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        load_bokehjs()
        return super()._repr_mimebundle_(**kwargs)

    def close(self) -> None:
        """Close the widget (idempotent)."""
        if not self._closed:
            self._closed = True
            super().close()


def plot(result: labserve.RunResult, bin_s: float | None = None) -> Any:
    """The dashboard's charts for a finished run, as a notebook widget (jupyter_bokeh).

    >>> from labserve.widgets import plot                      # doctest: +SKIP
    >>> plot(labserve.simulate(labserve.arrivals("poisson", rate_rps=2000), duration_s=10))
    """
    return ChartWidget(charts_for_result(result, bin_s).layout)
