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
document as it is now, patches wait for the page's acknowledgements
(:class:`~labserve.widgets.dashboard_base.DashboardBase` owns what both dashboards share).
"""

from __future__ import annotations

import html
import math
import time
from typing import Any, ClassVar

import ipywidgets as w

import labserve

from ..dashboard_base import DashboardBase, rows_per_replica
from .charts import GenerationCharts
from .controls import GenerationControls
from .loadpanel import GenerationLoadControls
from .pump import GenerationPump

__all__ = ["GenerationDashboard"]


class GenerationDashboard(DashboardBase[labserve.GenerationSource]):
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

    _KIND: ClassVar[str] = "generation dashboard"

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
        super().__init__({s.name: s for s in sources}, GenerationCharts(follow_s=follow_s, hz=hz))
        self.charts: GenerationCharts
        self._form = self.scheduling = GenerationControls(
            self.methods, sources[0].name, on_method=self._on_method, on_reset=self._on_reset
        )
        self.load = GenerationLoadControls(
            lambda: self.method, rate=rate, input_len=input_len, output_len=output_len
        )
        self.controls: dict[str, Any] = {**self.scheduling.widgets, **self.load.widgets}
        """Every control by name (the scheduler's, then the load's)."""
        self.errors: dict[str, w.HTML] = {**self.scheduling.errors, "load": self.load.error}
        """Where each group's refusals show."""
        self.panel = w.HBox([self.scheduling.box, self.load.box])
        pump = GenerationPump(self.charts, self.doc, lambda: self.method, hz=hz,
                              alive=self._alive, on_tick=self._on_tick, start=False)  # fmt: skip
        self._start(pump, labserve.RunnerGenerationSource)
        self.pump: GenerationPump

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

    def _on_tick(self, view: labserve.GenerationView | None) -> None:
        """On the pump thread: the controls follow the config, the status line the figures."""
        if view is not None:
            self.scheduling.follow(view.config)
        load = self.load.poll()
        now = time.monotonic()
        if not self._due(now, 0.5):  # read, not watched
            return
        snap = None if view is None else view.snapshot
        parts = [] if snap is None else [_settings(snap, view.config if view else None)]
        if load:
            parts.append(html.escape(load))
        numbers = "" if snap is None else _numbers(snap, self.pump.series.preempted_recent)
        self._show_status(numbers, parts, now)
        self._show_replicas("" if view is None else replica_table(view))


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
        f" (<b>{_attained(snap)}</b> within the targets)"
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
        f" <i>(last 1 s)</i>{_prefix_cache(snap, window)}"
    )


def _attained(snap: labserve.GenerationSnapshot) -> str:
    """Goodput over the served rate: the share a search's ``attainment`` is judged on."""
    if not snap.requests_per_s:
        return "-"
    return _fmt(100.0 * snap.goodput / snap.requests_per_s, ".0f", "%")


def _prefix_cache(snap: labserve.GenerationSnapshot, window: str) -> str:
    """The prefix cache's hit rate over the window (nothing while caching is off)."""
    if not snap.config.enable_prefix_caching:
        return ""
    return (
        f" · prefix cache hit rate <b>{_fmt(100 * snap.prefix_cache_hit_rate, '.0f', '%')}</b>"
        f" {window}, <b>{snap.kv_blocks_cached}</b> blocks cached"
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
        f"chunked prefill {'on' if cfg.enable_chunked_prefill else 'off'}, "
        f"prefix caching {'on' if cfg.enable_prefix_caching else 'off'}"
    )
    if cfg.ttft_slo_ms or cfg.tpot_slo_ms:
        text += f", targets TTFT {cfg.ttft_slo_ms:g} ms, TPOT {cfg.tpot_slo_ms:g} ms"
    if asked is not None and asked != snap.config:
        text += " <i>(from the next step)</i>"
    return text


_REPLICA_COLUMNS = ("running", "waiting", "KV blocks", "prefix hit rate", "served",
                    "tokens/s", "TTFT p50 ms", "max_num_seqs")  # fmt: skip


def _replica_row(snap: labserve.GenerationSnapshot) -> tuple[str, ...]:
    hit = snap.prefix_cache_hit_rate if snap.config.enable_prefix_caching else math.nan
    total = snap.kv_blocks_total or snap.config.num_kv_blocks
    return (
        f"{snap.num_running}",
        f"{snap.num_waiting}",
        f"{snap.kv_blocks_used}" + (f" of {total}" if total else ""),
        _fmt(100 * hit, ".0f", "%"),
        f"{snap.outcomes.get('served', 0):,}",
        _fmt(snap.output_tokens_per_s, ",.0f"),
        _fmt(snap.percentiles_ms["ttft"]["p50"], ".0f"),
        f"{snap.config.max_num_seqs}",
    )


def replica_table(view: labserve.GenerationView) -> str:
    """Each replica's own numbers, a row each ('' for a method in one process).

    Running, waiting and KV blocks are now; hit rate, tokens/s and TTFT cover each replica's
    window; served counts since its start. The last column is the config the replica runs:
    a knob turned once shows on every row once each has taken it.
    """
    note = (
        f"running, waiting, KV: now; hit rate, tokens/s, TTFT: last "
        f"{view.snapshot.window_s:g} s; served: since start"
    )
    return rows_per_replica(view, _REPLICA_COLUMNS, _replica_row, note)
