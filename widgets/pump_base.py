"""What both dashboards' pumps share: each tick, a view of the source, its rows, the charts.

:class:`PumpBase` is a :class:`~labserve.widgets.ticker.Ticker` whose tick is one chain:
the source the owner follows now -> its view -> the series' rows -> the charts, written under
the lock in one patch per widget. Another source, or :meth:`~PumpBase.clear`, starts the
series and the charts over. A pump (:class:`~labserve.widgets.pump.Pump`,
:class:`~labserve.widgets.generation.pump.GenerationPump`) says how its series start
(:meth:`~PumpBase._start_over`), the rows of a view (:meth:`~PumpBase._rows`) and what it
writes (:meth:`~PumpBase._write`),
and, if the owner may hand it something else, how that is watched (:meth:`~PumpBase._watch`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from bokeh.document import Document

from .chartwidget import one_patch_per_widget
from .ticker import Ticker

__all__ = ["PumpBase", "Viewable"]

V = TypeVar("V")
"""What a source's ``view()`` returns: ``labserve.SourceView``, ``labserve.GenerationView``."""
V_co = TypeVar("V_co", covariant=True)


class Viewable(Protocol[V_co]):
    """A source a pump watches (``labserve.MethodSource``, ``labserve.GenerationSource``)."""

    def view(self) -> V_co:
        """The method as it is now."""
        ...


class Clearable(Protocol):
    """Charts a pump writes into."""

    def clear(self) -> None:
        """Empty every chart."""
        ...


K = TypeVar("K", bound=Clearable)


class PumpBase(Ticker[V], Generic[V, K]):
    """One thread that pulls ``source()``'s view ``hz`` times a second into ``charts``.

    ``source()`` returns what to watch (another one, or :meth:`clear`, starts the charts
    over). The rest is :class:`Ticker`'s (``ticker``: its keyword arguments): one writer per
    document, :attr:`lock` held while writing, failed ticks counted, ``on_tick(view)`` a few
    times a second. Thread-safety: :meth:`clear` and :meth:`stop` from any thread; the rest
    is read-only from outside.
    """

    def __init__(self, charts: K, doc: Document, source: Callable[[], Any], **ticker: Any) -> None:
        self.charts = charts
        self._source = source
        self._followed: Any = None
        """What ``source()`` returned when the charts last started over."""
        self._watched: Viewable[V] | None = None
        self._clear = False
        self._start_over()
        super().__init__(doc, **ticker)

    def clear(self) -> None:
        """Empty the charts at the next tick (thread-safe)."""
        self._clear = True

    def _watch(self, followed: Any) -> Viewable[V]:
        """The source to pull views from, for what ``source()`` returned (itself here)."""
        watched: Viewable[V] = followed
        return watched

    def _start_over(self) -> None:
        """New series: the next row counts from the next view (on the thread, or at birth)."""
        raise NotImplementedError

    def _rows(self, view: V) -> Any:
        """The series' rows for ``view`` (outside the lock: only the writing holds it)."""
        raise NotImplementedError

    def _write(self, view: V, rows: Any) -> None:
        """Stream ``rows`` into the charts, and what else ``view`` shows (under the lock)."""
        raise NotImplementedError

    def _tick(self) -> None:
        followed = self._source()
        watched = self._watched
        if followed is not self._followed or self._clear or watched is None:
            self._followed = followed
            watched = self._watched = self._watch(followed)
            self._clear = False
            self._start_over()
            self.view = None
            with self.lock:
                self.charts.clear()
        view = self.view = watched.view()
        rows = self._rows(view)
        with self.lock, one_patch_per_widget():
            self._write(view, rows)
