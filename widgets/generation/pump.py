"""The generation dashboard's pump: pulls a generative method's snapshots, streams chart rows.

Nothing here is on the step path: the driver records, and the pump pulls views from the
method's source (a runner here, a server by URL) on its own thread, the only writer of the
charts' Bokeh document (see :class:`~labserve.widgets.ticker.Ticker`).
"""

from __future__ import annotations

from collections.abc import Callable

from bokeh.document import Document

import labserve

from ..pump_base import PumpBase
from .charts import GenerationCharts
from .series import GenerationSeries, Rows

__all__ = ["GenerationPump"]


class GenerationPump(PumpBase[labserve.GenerationView, GenerationCharts]):
    """One thread that pulls ``source()``'s view ``hz`` times a second into ``charts``.

    ``source()`` returns the ``labserve.GenerationSource`` to watch (another one, or
    :meth:`clear`, starts the charts over). The rest is :class:`Ticker`'s: one writer per
    document, :attr:`lock` held while writing, failed ticks counted, ``on_tick(view)`` a
    few times a second. Thread-safety: :meth:`clear` and :meth:`stop` from any thread.
    """

    def __init__(
        self,
        charts: GenerationCharts,
        doc: Document,
        source: Callable[[], labserve.GenerationSource],
        *,
        hz: float = 5.0,
        alive: Callable[[], bool] = lambda: True,
        on_tick: Callable[[labserve.GenerationView | None], None] | None = None,
        start: bool = True,
    ) -> None:
        super().__init__(charts, doc, source, hz=hz, alive=alive, on_tick=on_tick, start=start,
                         name="labserve-gen-dashboard")  # fmt: skip

    @property
    def snapshot(self) -> labserve.GenerationSnapshot | None:
        """The last snapshot pulled (None before the first)."""
        view = self.view
        return None if view is None else view.snapshot

    def _start_over(self) -> None:
        self.series = GenerationSeries()
        """The rows' maker (its ``preempted_recent`` is the last second's preemptions)."""

    def _rows(self, view: labserve.GenerationView) -> Rows:
        return self.series.update(view.snapshot)

    def _write(self, view: labserve.GenerationView, rows: Rows) -> None:
        self.charts.stream(rows)
        self.charts.set_window(view.snapshot.window_s)
