"""What both dashboards share: the document, the pump's life, the views, the status line, close.

:class:`DashboardBase` owns the charts' Bokeh document and the one pump that writes it, each
view handed to a page (and BokehJS carried with it, so a reloaded page draws), the status
box and its pace, the tracking that lets a re-run cell's dashboard replace this one, and
:meth:`~DashboardBase.close`. A dashboard (:class:`~labserve.widgets.dashboard.Dashboard`,
:class:`~labserve.widgets.generation.dashboard.GenerationDashboard`) builds its charts,
settings form and load column, then calls :meth:`~DashboardBase._start`; its
``_on_tick`` writes the status line.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import ipywidgets as w
from bokeh.document import Document

import labserve

from .bokehjs import display_bokehjs
from .charts_base import ChartsBase
from .chartwidget import ChartWidget
from .controls_base import ControlsBase, Tunable
from .loadpanel_base import LoadPanelBase
from .pump_base import PumpBase

__all__ = ["DashboardBase", "rows_per_replica"]


class _Source(Tunable[Any], Protocol):
    """What a dashboard needs of a method's source, beyond what its form needs."""

    @property
    def alive(self) -> bool:
        """False once the method cannot answer any more."""
        ...


S = TypeVar("S", bound=_Source)
"""A method's source: ``labserve.MethodSource``, ``labserve.GenerationSource``."""


class DashboardBase(Generic[S]):
    """Charts, controls and a status line on one of ``methods``, pumped by one thread.

    Display it (last line of a cell); each display is a fresh view of current data.
    ``close()`` stops its pump and load. A subclass sets :attr:`charts` (through
    ``__init__``), :attr:`panel`, ``_form`` (its settings form) and :attr:`load`, then calls
    :meth:`_start`.
    """

    _KIND: ClassVar[str] = "dashboard"
    """What :func:`labserve.track` and a closed view call it."""

    def __init__(self, methods: dict[str, S], charts: ChartsBase) -> None:
        self.methods = methods
        self._views: list[ChartWidget] = []
        self._boxes: list[w.VBox] = []
        self._carriers: list[Any] = []
        self._status_at = -math.inf
        self.charts = charts
        self.doc = Document()
        self.doc.add_root(self.charts.layout)
        # The numbers a tuner compares, then the settings, the load and any warning. Room for
        # three lines, so a message appearing does not move the charts; more when a narrow
        # page wraps them (a fixed height hid the settings line there, cut off mid-line).
        self.status = w.HTML(
            value="<code>starting…</code>",
            layout=w.Layout(min_height="6.4em", margin="4px 0"),
        )
        self.panel: w.Box = w.VBox()
        """The settings and the load, above the status line."""
        self.replicas = w.HTML(value="", layout=w.Layout(display="none", margin="0 0 4px 0"))
        """Each replica's numbers, a row each (shown when the method runs on several)."""
        self._form: ControlsBase[S, Any]
        self.load: LoadPanelBase[Any]
        self.pump: PumpBase[Any, Any]

    def _start(self, pump: PumpBase[Any, Any], in_process: type[Any]) -> None:
        """Start ``pump`` (made with ``start=False``) and be tracked by name.

        A re-run cell's dashboard on the same methods replaces this one (its pump and load
        do not live on unseen); a new runner of the name it watches in this process ends it
        too (the sources of type ``in_process`` hold one). labserve.stop_all() closes it.
        """
        self.pump = pump
        pump.start()
        needs = [("runner", m.runner) for m in self.methods.values() if isinstance(m, in_process)]
        self._untrack = labserve.track(
            self, self._KIND, ",".join(self.methods), self.close, needs=needs
        )

    @property
    def method(self) -> S:
        """The source of the method the controls and charts follow."""
        return self._form.method

    def _alive(self) -> bool:
        """On the pump thread: whether to go on."""
        return self.method.alive

    def _on_method(self) -> None:
        self.load.stop()
        self.pump.clear()

    def _on_reset(self) -> None:
        self.pump.clear()

    def _view_rows(self) -> list[w.Widget]:
        """What a view shows above its charts."""
        return [self.panel, self.status, self.replicas]

    def view(self) -> w.VBox:
        """A new view: the controls and a chart widget rendered from the data as it is now."""
        with self.pump.lock:
            charts = ChartWidget(self.charts.layout, lock=self.pump.lock)
        self._views.append(charts)
        box = w.VBox([*self._view_rows(), charts])
        self._boxes.append(box)
        return box

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # BokehJS first, in a widget of its own: a reloaded page gets it from the kernel.
        self._carriers.append(display_bokehjs())
        bundle = self.view()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):  # the VBox's own text holds live numbers
            # What a saved notebook shows where widgets do not draw: no state (a saved
            # "(live)" said so before anything ran).
            name = f"{type(self).__name__} {self.method.name}"
            bundle["text/plain"] = f"<{name}: live charts when its cell runs>"
        return bundle

    def close(self) -> None:
        """Stop the load and the pump; each view says it is closed. Idempotent.

        A new dashboard on the same methods (a re-run cell) closes this one. A view left on
        the page reads as closed, with the charts' last frame gone and no control that looks
        alive but does nothing.
        """
        self.load.stop()
        self.pump.stop()
        self._untrack()
        note = w.HTML(
            f"<code>{self._KIND} on {html.escape(', '.join(self.methods))} closed: its "
            f"controls and charts stopped. Create a new {type(self).__name__} to watch "
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
        return f"<{type(self).__name__} {self.method.name} ({state})>"

    def _due(self, now: float, every_s: float) -> bool:
        """Whether the status line is due again (it is read, not watched), noting it if so."""
        if now - self._status_at < every_s:
            return False
        self._status_at = now
        return True

    def _pump_error(self, now: float) -> str | None:
        """The pump's failed chart updates, for the status line (None if none failed)."""
        error = self.pump.last_error
        if error is None:
            return None
        ago = now - self.pump.last_error_at
        return (
            f"<span style='color:#c00'>chart update failed {self.pump.errors:,} times "
            f"(last {ago:.0f} s ago: {html.escape(type(error).__name__)}: "
            f"{html.escape(str(error))})</span>"
        )

    def _show_replicas(self, table: str) -> None:
        """Show ``table`` (:func:`rows_per_replica`) under the status line; hide it when ''."""
        if table != self.replicas.value:
            self.replicas.value = table
            self.replicas.layout.display = None if table else "none"

    def _show_status(self, numbers: str, parts: list[str], now: float) -> None:
        """Write the status line: the numbers, then the parts and any pump error."""
        error = self._pump_error(now)
        if error is not None:
            parts.append(error)
        self.status.value = f"<code>{numbers}<br>{' · '.join(parts)}</code>"


def rows_per_replica(
    view: Any, columns: tuple[str, ...], row: Callable[[Any], tuple[str, ...]], note: str
) -> str:
    """A row per replica of ``view`` (a view with ``replicas`` and ``stale``), '' for none.

    Each row is the replica's id, whether it reports, then ``row(its snapshot)``, under
    ``columns`` (the two first, then one per value); ``note`` says over what each figure runs.
    """
    if not view.replicas:
        return ""
    cell = "padding:0 8px;text-align:right"
    head = "".join(f"<th style='{cell}'>{h}</th>" for h in ("replica", "", *columns))
    rows = []
    for rid, snap in sorted(view.replicas.items()):
        stale = "<span style='color:#b60'>stale</span>" if rid in view.stale else "live"
        values = (html.escape(rid[-8:]), stale, *row(snap))
        rows.append("<tr>" + "".join(f"<td style='{cell}'>{v}</td>" for v in values) + "</tr>")
    live = len(view.replicas) - len(view.stale)
    return (
        f"<code>{live} of {len(view.replicas)} replicas reporting <i>({note})</i></code>"
        f"<table style='font-family:monospace;font-size:90%'><tr>{head}</tr>{''.join(rows)}</table>"
    )
