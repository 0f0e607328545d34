"""The pump: the one thread that pulls a method's snapshots and streams them into charts.

Nothing here is on the request path: the runner records, and the pump pulls views from the
method's source (a runner here, a server by URL, a Ray application's replicas) on its own
thread and is the only writer of the charts' Bokeh document (two writers corrupt BokehJS's
message stream).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bokeh.document import Document

import labserve

from .charts import Charts
from .pump_base import PumpBase
from .series import LiveSeries, Recent, Rows
from .tokens import TokenSeries, TokensRecent

__all__ = ["Pump"]


class Pump(PumpBase[labserve.SourceView, Charts]):
    """One thread that pulls a view ``hz`` times a second and streams it into ``charts``.

    ``source()`` returns the method to watch: a ``labserve.MethodSource``, or a
    ``RunnerMethod`` (watched through a ``labserve.RunnerSource``).

    It is the only writer of the charts' document: a second pump on the same document
    raises ``RuntimeError``. :attr:`lock` is held while it writes; hold it to read the
    document consistently from another thread (pass it to a ChartWidget showing the
    document). A tick that fails is counted and kept in :attr:`last_error` (the pump goes
    on). Stops on :meth:`stop`, when ``alive()`` turns false, or at interpreter exit.

    ``on_tick(view)`` runs on the pump thread after the charts are written (or failed to
    be), at most 5 times a second, with the last ``labserve.SourceView`` pulled (None
    before the first). Thread-safety: :meth:`clear` and :meth:`stop` may be called from any thread;
    the rest is read-only from outside. ``start=False`` leaves the thread to :meth:`start`,
    for an owner whose ``on_tick`` needs the pump itself.
    """

    def __init__(
        self,
        charts: Charts,
        doc: Document,
        source: Callable[[], labserve.MethodSource | labserve.RunnerMethod],
        *,
        hz: float = 5.0,
        alive: Callable[[], bool] = lambda: True,
        on_tick: Callable[[labserve.SourceView | None], None] | None = None,
        start: bool = True,
    ) -> None:
        super().__init__(charts, doc, source, hz=hz, alive=alive, on_tick=on_tick, start=start)

    @property
    def recent(self) -> Recent | None:
        """What moved over the last second (rates, mean batch, rejected %, model busy %)."""
        return self._series.recent

    @property
    def tokens(self) -> TokensRecent | None:
        """The last second's batches in tokens: per batch, and how much was padding."""
        return self._tokens.recent

    @property
    def snapshot(self) -> labserve.Snapshot | None:
        """The last snapshot pulled (None before the first)."""
        view = self.view
        return None if view is None else view.snapshot

    def _watch(self, followed: Any) -> labserve.MethodSource:
        if isinstance(followed, labserve.RunnerMethod):
            return labserve.RunnerSource(followed)
        source: labserve.MethodSource = followed
        return source

    def _start_over(self) -> None:
        self._series = LiveSeries()
        self._tokens = TokenSeries()

    def _rows(self, view: labserve.SourceView) -> Rows:
        tick = self._series.update(view.snapshot)
        tick.update(self._tokens.update(view.snapshot))
        return tick

    def _write(self, view: labserve.SourceView, rows: Rows) -> None:
        snap = view.snapshot
        self.charts.stream(rows)
        self.charts.set_latency_window(snap.window_s)
        # The cost chart redraws whole: once a second is enough to watch the fit settle.
        if self.ticks % max(round(self.hz), 1) == 0:
            recent = snap.recent_batches[-256:]
            self.charts.show_fit(
                [float(b.items) for b in recent],
                [b.duration_s * 1000.0 for b in recent],
                snap.cost_fit.a_ms,
                snap.cost_fit.b_ms,
                float(snap.config.max_batch_size),
                snap.cost_fit.c_ms,
                snap.cost_fit.width,
            )
