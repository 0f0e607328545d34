"""The generation dashboard: scheduler and load controls, streaming charts, a status line.

It watches a generative method (continuous batching) wherever it runs, through a
``labserve.GenerationSource``: a runner in this process or a labserve server by URL. It
composes :class:`~labserve.widgets.generation.controls.GenerationControls`,
:class:`~labserve.widgets.generation.loadpanel.GenerationLoadControls`,
:class:`~labserve.widgets.generation.charts.GenerationCharts` shown through
:class:`~labserve.widgets.chartwidget.ChartWidget`, and one
:class:`~labserve.widgets.generation.pump.GenerationPump`, the only writer of the charts. It shares
the request dashboard's machinery, so the same guarantees hold: BokehJS travels in a
hidden widget (a reloaded page gets it back), a new view or a reloaded page draws the
document as it is now, patches wait for the page's acknowledgements.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any

import ipywidgets as w
from bokeh.document import Document

import labserve

from ..bokehjs import display_bokehjs
from ..chartwidget import ChartWidget
from .charts import GenerationCharts
from .controls import GenerationControls
from .loadpanel import GenerationLoadControls
from .pump import GenerationPump

__all__ = ["GenerationDashboard"]


class GenerationDashboard:
    """Controls and live charts for a generative method: in this process or by URL.

    ``target``: a Runner, a generative method (``runner.generate``), a Server, the URL of
    a labserve server (``token=`` for changes: ``PATCH /config``), or
    ``labserve.GenerationSource`` objects. ``hz``: views per second; ``follow_s``: the
    seconds the charts show. ``rate``, ``input_len``, ``output_len``: the load column's
    first values. Display it (last line of a cell); each display is a fresh view of
    current data. ``close()`` stops its pump and load.

    >>> from labserve.widgets import GenerationDashboard            # doctest: +SKIP
    >>> GenerationDashboard(runner)                     # runner = labserve.Runner(TinyLM)
    >>> GenerationDashboard("http://127.0.0.1:8000", token=token)
    """

    def __init__(
        self,
        target: Any,
        *,
        hz: float = 5.0,
        follow_s: float = 60.0,
        token: str | None = None,
        rate: float = 4.0,
        input_len: str = "lognormal:32:256",
        output_len: str = "lognormal:64:256",
    ) -> None:
        target = target.runner if _is_method_of_runner(target) else target
        sources = labserve.generation_sources(target, token=token)
        self.methods = {s.name: s for s in sources}
        first = sources[0].name
        self._views: list[ChartWidget] = []
        self._boxes: list[w.VBox] = []
        self._carriers: list[Any] = []
        self._status_at = -math.inf
        self.charts = GenerationCharts(follow_s=follow_s, hz=hz)
        self.doc = Document()
        self.doc.add_root(self.charts.layout)
        self.scheduling = GenerationControls(
            self.methods, first, on_method=self._on_method, on_reset=self._on_reset
        )
        self.load = GenerationLoadControls(
            lambda: self.method, rate=rate, input_len=input_len, output_len=output_len
        )
        self.controls: dict[str, Any] = {**self.scheduling.widgets, **self.load.widgets}
        """Every control by name (the scheduler's, then the load's)."""
        self.errors: dict[str, w.HTML] = {**self.scheduling.errors, "load": self.load.error}
        """Where each group's refusals show."""
        # Room for three lines (as the request dashboard's); more when a narrow page wraps them.
        self.status = w.HTML(
            value="<code>starting…</code>",
            layout=w.Layout(min_height="6.4em", margin="4px 0"),
        )
        self.panel = w.HBox([self.scheduling.box, self.load.box])
        self.pump = GenerationPump(
            self.charts,
            self.doc,
            lambda: self.method,
            hz=hz,
            alive=self._alive,
            on_tick=self._on_tick,
            start=False,  # _on_tick reads self.pump
        )
        self.pump.start()
        # A re-run cell's dashboard on the same methods replaces this one (its pump and load
        # do not live on unseen); a new runner of the name it watches in this process ends
        # it too. labserve.stop_all() closes it.
        needs = [
            ("runner", m.runner)
            for m in self.methods.values()
            if isinstance(m, labserve.RunnerGenerationSource)
        ]
        self._untrack = labserve.track(
            self, "generation dashboard", ",".join(self.methods), self.close, needs=needs
        )

    @property
    def method(self) -> labserve.GenerationSource:
        """The source of the method the controls and charts follow."""
        return self.scheduling.method

    def _alive(self) -> bool:
        """On the pump thread: whether to go on; if not, the status line says why."""
        if self.method.alive:
            return True
        self.load.stop()
        self.status.value = (
            f"<code><span style='color:#b60'>{html.escape(self.method.name)} stopped (its "
            "runner or server stopped): the charts show its last figures, and nothing "
            "moves any more.</span></code>"
        )
        return False

    def _on_method(self) -> None:
        self.load.stop()
        self.pump.clear()

    def _on_reset(self) -> None:
        self.pump.clear()

    def view(self) -> w.VBox:
        """A new view: the controls and a chart widget rendered from the data as it is now."""
        with self.pump.lock:
            charts = ChartWidget(self.charts.layout, lock=self.pump.lock)
        self._views.append(charts)
        box = w.VBox([self.panel, self.status, charts])
        self._boxes.append(box)
        return box

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # BokehJS first, in a widget of its own: a reloaded page gets it from the kernel.
        self._carriers.append(display_bokehjs())
        bundle = self.view()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):  # the VBox's own text holds live numbers
            # What a saved notebook shows where widgets do not draw: no state (a saved
            # "(live)" said so before anything ran).
            name = self.method.name
            bundle["text/plain"] = f"<GenerationDashboard {name}: live charts when its cell runs>"
        return bundle

    def close(self) -> None:
        """Stop the load and the pump; each view says it is closed. Idempotent.

        A new dashboard on the same methods (a re-run cell) closes this one. A view left on
        the page reads as closed, with no control that looks alive but does nothing.
        """
        self.load.stop()
        self.pump.stop()
        self._untrack()
        note = w.HTML(
            f"<code>generation dashboard on {html.escape(', '.join(self.methods))} closed: "
            "its controls and charts stopped. Create a new GenerationDashboard to watch "
            "again.</code>"
        )
        for box in self._boxes:
            box.children = (note,)
        self._boxes.clear()
        for view in self._views:
            view.close()
        self._views.clear()
        for carrier in self._carriers:  # BokehJS stays in the pages that ran it
            carrier.close()
        self._carriers.clear()

    def __repr__(self) -> str:
        state = "live" if self.pump.running else "stopped"
        return f"<GenerationDashboard {self.method.name} ({state})>"

    def _on_tick(self, view: labserve.GenerationView | None) -> None:
        """On the pump thread: the controls follow the config, the status line the figures."""
        if view is not None:
            self.scheduling.follow(view.config)
        load = self.load.poll()
        now = time.monotonic()
        if now - self._status_at < 0.5:  # read, not watched
            return
        self._status_at = now
        snap = None if view is None else view.snapshot
        parts = [] if snap is None else [_settings(snap, view.config if view else None)]
        if load:
            parts.append(html.escape(load))
        error = self.pump.last_error
        if error is not None:
            ago = now - self.pump.last_error_at
            parts.append(
                f"<span style='color:#c00'>chart update failed {self.pump.errors:,} times "
                f"(last {ago:.0f} s ago: {html.escape(type(error).__name__)}: "
                f"{html.escape(str(error))})</span>"
            )
        numbers = "" if snap is None else _numbers(snap, self.pump.series.preempted_recent)
        self.status.value = f"<code>{numbers}<br>{' · '.join(parts)}</code>"


def _is_method_of_runner(target: Any) -> bool:
    """A batchable method given for a runner whose generative methods are wanted."""
    return isinstance(target, labserve.RunnerMethod)


def _fmt(x: float, spec: str, unit: str = "") -> str:
    return f"{x:{spec}}{unit}" if math.isfinite(x) else "-"


def _numbers(snap: labserve.GenerationSnapshot, preempted: float) -> str:
    """The line a tuner reads: each number with the window it covers."""
    p = snap.percentiles_ms
    cfg = snap.config
    window = f"<i>(last {snap.window_s:.0f} s)</i>"
    goodput = (
        f" · goodput <b>{_fmt(snap.goodput, '.2f')}</b> req/s"
        if cfg.ttft_slo_ms or cfg.tpot_slo_ms
        else ""
    )
    return (
        f"<b>{_fmt(snap.output_tokens_per_s, ',.0f')}</b> tokens/s · "
        f"<b>{_fmt(snap.requests_per_s, '.2f')}</b> req/s{goodput} · TTFT p50 "
        f"<b>{_fmt(p['ttft']['p50'], '.0f')}</b> / p99 <b>{_fmt(p['ttft']['p99'], '.0f')}</b> ms"
        f" · ITL p50 <b>{_fmt(p['itl']['p50'], '.1f')}</b> / p99 "
        f"<b>{_fmt(p['itl']['p99'], '.1f')}</b> ms {window} · running "
        f"<b>{snap.num_running}</b>, waiting <b>{snap.num_waiting}</b>, KV blocks "
        f"<b>{snap.kv_blocks_used}</b>{_kv_of(snap)} <i>(now)</i> · preempted "
        f"<b>{_fmt(preempted, '.0f')}</b>"
        " <i>(last 1 s)</i>"
    )


def _kv_of(snap: labserve.GenerationSnapshot) -> str:
    """What follows the blocks used: the pool's size, and the model's bytes when it holds them."""
    if snap.kv_memory == "model":
        return f" of {snap.kv_blocks_total} (the model's {snap.kv_bytes / 1e6:,.1f} MB)"
    return f" of {snap.kv_blocks_total}" if snap.kv_blocks_total else ""


def _settings(snap: labserve.GenerationSnapshot, asked: labserve.GenerationConfig | None) -> str:
    cfg = asked if asked is not None else snap.config
    text = (
        f"<b>{html.escape(snap.runner)}.{html.escape(snap.method)}</b>: {cfg.strategy}, "
        f"{cfg.scheduling_policy}, max_num_seqs={cfg.max_num_seqs}, "
        f"max_num_batched_tokens={cfg.max_num_batched_tokens}, "
        f"chunked prefill {'on' if cfg.enable_chunked_prefill else 'off'}"
    )
    if cfg.ttft_slo_ms or cfg.tpot_slo_ms:
        text += f", targets TTFT {cfg.ttft_slo_ms:g} ms, TPOT {cfg.tpot_slo_ms:g} ms"
    if asked is not None and asked != snap.config:
        text += " <i>(from the next step)</i>"
    return text
