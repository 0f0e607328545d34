"""The live dashboard: batching and load controls, streaming charts, a status line.

It watches a method wherever it runs, through a ``labserve.MethodSource``: a runner in this
process, a labserve server by URL, or a Ray application's replicas (merged, with each
replica's own numbers in a small table). It composes the parts:
:class:`~labserve.widgets.controls.BatchingControls`,
:class:`~labserve.widgets.loadpanel.LoadControls`, :class:`~labserve.widgets.charts.Charts`
shown through :class:`~labserve.widgets.chartwidget.ChartWidget`, and one
:class:`~labserve.widgets.pump.Pump`, the only writer of the charts, on
:class:`~labserve.widgets.dashboard_base.DashboardBase` (what it shares with the generation
dashboard).
"""

from __future__ import annotations

import html
import math
import time
from collections import deque
from typing import Any

import ipywidgets as w

import labserve

from .charts import Charts
from .controls import BatchingControls
from .dashboard_base import DashboardBase, rows_per_replica
from .loadpanel import LoadControls
from .pump import Pump
from .series import Recent
from .tokencontrols import TokenControls
from .tokens import has_ragged_axis

__all__ = ["Dashboard"]

_FLOW_SPAN_S = 3.0
"""The status line says the page is behind if it merged updates in this many seconds."""


def _methods(target: Any, token: str | None) -> tuple[dict[str, labserve.MethodSource], str]:
    """The methods a dashboard target offers, by ``runner.method``; the first shown."""
    try:
        # A method: its runner's methods, that one shown first.
        whole = target.runner if isinstance(target, labserve.RunnerMethod) else target
        sources = labserve.method_sources(whole, token=token)
    except ValueError as exc:
        hint = ""
        if getattr(whole, "generators", None):  # generative methods have their own
            hint = "; for a generative method use labserve.widgets.GenerationDashboard"
        raise ValueError(f"Dashboard found no batchable method to show: {exc}{hint}") from None
    methods = {s.name: s for s in sources}
    first = sources[0].name
    if isinstance(target, labserve.RunnerMethod):
        first = f"{target.runner.name}.{target.name}"
    return methods, first


class Dashboard(DashboardBase[labserve.MethodSource]):
    """Controls and live charts for batchable methods: in this process, by URL, or on Ray.

    ``target``: a Runner, a RunnerMethod, a list of Runners, a Server, the URL of a labserve
    server (``token=`` for changes: ``PATCH /config``) or of Ray's proxy in front of a
    labserve application, a ``labserve.ray.RayApp`` (merged over its replicas, with each
    one's numbers; ``app.method_sources(proxy_url=...)`` if Serve's proxy is not on port
    8000), or ``labserve.MethodSource`` objects. ``example``: one request, for the load
    controls (default: zeros from the method's ``input_spec`` if it declares one).
    ``hz``: views per second. ``tokens``: show tokens per batch and padding (a chart and a
    readout) with controls over padding, ``length_buckets`` and ``max_batch_tokens``
    (default: when a method in this process has a ragged axis, ``pad=``; pass True for a
    URL's). Display it (last line of a cell); each display is a fresh
    view of current data. ``close()`` stops its pump and load.

    >>> from labserve.widgets import Dashboard               # doctest: +SKIP
    >>> Dashboard(runner, example=np.ones((1, 4)))
    >>> Dashboard("http://127.0.0.1:8000", example=np.ones((1, 4)), token=token)
    >>> Dashboard(app, example=np.ones((1, 4)))              # a labserve.ray.RayApp
    """

    def __init__(
        self,
        target: Any,
        *,
        example: Any = None,
        hz: float = 5.0,
        follow_s: float = 60.0,
        token: str | None = None,
        tokens: bool | None = None,
    ) -> None:
        methods, first = _methods(target, token)
        if tokens is None:
            tokens = any(has_ragged_axis(m) for m in methods.values())
        super().__init__(methods, Charts(follow_s=follow_s, hz=hz, tokens=tokens))
        self.charts: Charts
        self._flow_history: deque[tuple[float, int, int]] = deque()
        self._form = self.batching = BatchingControls(
            self.methods, first, on_method=self._on_method, on_reset=self._on_reset
        )
        self.load = LoadControls(
            lambda: self.method, example, input_len="lognormal:16:128" if tokens else None
        )
        self.tokens = TokenControls(lambda: self.method) if tokens else None
        """Padding, length buckets and the token budget (a method with a ragged axis)."""
        token_box = self.tokens.box if self.tokens else w.VBox()
        token_widgets = self.tokens.widgets if self.tokens else {}
        self.controls: dict[str, Any] = {
            **self.batching.widgets,
            **self.load.widgets,
            **token_widgets,
        }
        """Every control by name (the batching ones, the load ones, then the token ones)."""
        token_errors = self.tokens.errors if self.tokens else {}
        self.errors: dict[str, w.HTML] = {
            **self.batching.errors,
            "load": self.load.error,
            **token_errors,
        }
        """Where each group's refusals show."""
        self.panel = w.VBox([w.HBox([w.VBox([self.batching.box, token_box]), self.load.box]),
                             self.batching.export])  # fmt: skip
        pump = Pump(self.charts, self.doc, lambda: self.method, hz=hz, alive=self._alive,
                    on_tick=self._on_tick, start=False)  # fmt: skip
        self._start(pump, labserve.RunnerSource)
        self.pump: Pump

    def save_html(self, path: str) -> None:
        """Write the charts as they are now to a standalone HTML file (BokehJS inline)."""
        from bokeh.embed import file_html
        from bokeh.resources import INLINE

        with self.pump.lock:
            page = file_html(self.charts.layout, INLINE, title=f"labserve · {self.method!r}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)

    def _flow_note(self) -> str:
        """Says so when the page cannot draw every update (the views merge them)."""
        updates = sum(v.updates for v in self._views)
        merged = sum(v.merged for v in self._views)
        now = time.monotonic()
        history = self._flow_history
        history.append((now, updates, merged))
        while len(history) > 2 and now - history[1][0] >= _FLOW_SPAN_S:
            history.popleft()
        then, updates_then, merged_then = history[0]
        return _flow_note_text(updates - updates_then, merged - merged_then, now - then)

    def _on_tick(self, view: labserve.SourceView | None) -> None:
        """On the pump thread: the line of numbers, the load's progress, the pump's errors.

        And the controls follow the method: a config changed elsewhere (a cell, PATCH
        /config, another dashboard) shows in the dropdowns and sliders.
        """
        if view is not None:
            self.batching.follow(view.config)
            if self.tokens is not None:
                self.tokens.follow(view.config)
                self.tokens.show_tokens(self.pump.tokens, view.config)
        snap = None if view is None else view.snapshot
        load = self.load.poll()
        behind = self._flow_note()
        # The line is read, not watched: twice a second, once while the page is behind
        # (each update is one more message the page must handle).
        now = time.monotonic()
        if not self._due(now, 1.0 if behind else 0.5):
            return
        numbers = "" if snap is None else _numbers(snap, self.pump.recent)
        parts = [] if snap is None else [_settings(snap)]
        if load:
            parts.append(html.escape(load))
        if behind:
            parts.append(f"<span style='color:#b60'>{behind}</span>")
        self._show_status(numbers, parts, now)
        self._show_replicas("" if view is None else _replica_table(view))


def _flow_note_text(updates: int, merged: int, span_s: float) -> str:
    if merged <= 0:
        return ""
    return (
        f"page behind: dropping frames ({merged} of {updates} chart updates in the last "
        f"{span_s:.0f} s merged into later ones)"
    )


def _fmt(x: float, spec: str, unit: str = "") -> str:
    return f"{x:{spec}}{unit}" if math.isfinite(x) else "-"


def _share(kind: str, pct: float) -> str:
    """`` · timed out 2.0%``, when some requests ended so (the line stays short otherwise)."""
    return f" · {kind} <b>{pct:.1f}%</b>" if math.isfinite(pct) and pct > 0 else ""


def _numbers(snap: labserve.Snapshot, recent: Recent | None) -> str:
    """The line a tuner reads: each number with the window it covers."""
    lat = snap.latency_ms_window
    cfg = snap.config
    nan = math.nan
    served = recent.served_rps if recent else nan
    mean = recent.mean_batch if recent else nan
    rejected = recent.rejected_pct if recent else nan
    refused = recent.refused_pct if recent else nan
    failed = recent.failed_pct if recent else nan
    timeout = recent.timeout_pct if recent else nan
    busy = recent.busy_pct if recent else nan
    window = f"{recent.span_s:.1f} s" if recent else "1 s"
    return (
        f"<b>{_fmt(served, ',.0f')}</b> req/s served · mean batch <b>{_fmt(mean, '.1f')}</b> "
        f"of {cfg.max_batch_size} · rejected <b>{_fmt(rejected, '.1f', '%')}</b> "
        f"(<span title='never admitted: the queue was full'>refused</span> "
        f"{_fmt(refused, '.1f', '%')})"
        + _share("timed out", timeout)
        + _share("failed", failed)
        + " · model busy "
        f"<b>{_fmt(busy, '.0f', '%')}</b> <i>(last {window})</i> · p50 "
        f"<b>{_fmt(lat.p50, '.1f')}</b> / p99 <b>{_fmt(lat.p99, '.1f')}</b> ms, wait cap "
        f"{cfg.max_latency_ms:g} ms <i>(last {snap.window_s:g} s)</i> · queue "
        f"<b>{snap.queue_requests}</b> <i>(now)</i> · model "
        f"<b>{_fmt(snap.model_ms_per_request, '.2f')}</b> ms/request"
        + (
            f" · target {cfg.latency_slo_ms:g} ms, met "
            f"<b>{_fmt(100.0 * snap.latency_slo_met, '.1f', '%')}</b>"
            if cfg.latency_slo_ms
            else ""
        )
        + f" <i>(last {snap.window_s:g} s)</i>"
    )


def _settings(snap: labserve.Snapshot) -> str:
    cfg = snap.config
    return (
        f"<b>{html.escape(snap.runner)}.{html.escape(snap.method)}</b>: {cfg.strategy}, "
        f"max_batch_size={cfg.max_batch_size}, max_latency_ms={cfg.max_latency_ms:g}, "
        f"on_overload={cfg.on_overload}"
        + (f", latency_slo_ms={cfg.latency_slo_ms:g}" if cfg.latency_slo_ms else "")
    )


_REPLICA_COLUMNS = ("served", "req/s", "mean batch", "largest", "queue", "p99 ms",
                    "max_batch_size", "max_latency_ms")  # fmt: skip


def _replica_row(s: labserve.Snapshot) -> tuple[str, ...]:
    return (
        f"{s.served:,}",
        _fmt(s.served_rate, ",.0f"),
        _fmt(s.mean_batch_size, ".1f"),
        f"{s.max_batch_size_seen}",
        f"{s.queue_requests}",
        _fmt(s.latency_ms_window.p99, ".1f"),
        f"{s.config.max_batch_size}",
        f"{s.config.max_latency_ms:g}",
    )


def _replica_table(view: labserve.SourceView) -> str:
    """Each replica's own numbers, one row each ('' for a method in one process)."""
    note = (
        f"mean batch, req/s, p99: last {view.snapshot.window_s:g} s; served, largest: since start"
    )
    return rows_per_replica(view, _REPLICA_COLUMNS, _replica_row, note)
