"""What both dashboards' load columns share: the shape and rate, the start button, its error.

:class:`LoadPanelBase` owns the button that starts and stops the load (and is set back, without
acting, when the load ends by itself), the line where a refusal shows, and the lock that
:meth:`~LoadPanelBase.stop` and the pump's :meth:`poll` share. A panel
(:class:`~labserve.widgets.loadpanel.LoadControls`,
:class:`~labserve.widgets.generation.loadpanel.GenerationLoadControls`) adds its fields, how
a load starts from them (:meth:`~LoadPanelBase._start`), and what :meth:`poll` reports.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

import ipywidgets as w

import labserve

from .controls_base import control_layout, error_html

__all__ = ["STYLE", "LoadPanelBase", "clock", "number"]

STYLE = {"description_width": "110px"}
"""The load columns' labels ("rate (req/s)", "output tokens") whole."""


class Stoppable(Protocol):
    """A running load (``labserve.LoadRun``, ``labserve.UntilStopped``)."""

    def stop(self) -> Any: ...


R = TypeVar("R", bound=Stoppable)


class LoadPanelBase(Generic[R]):
    """A load generator driven by widgets: ``pattern`` and ``rate``, then the subclass's fields.

    ``patterns``: the load shapes offered (names of :data:`labserve.LOAD_PRESETS`); ``rate``:
    the rate field's first text. Thread-safety: :meth:`poll` runs on the dashboard's pump
    thread, the widgets' callbacks on the kernel's; :meth:`stop` may be called from either.
    """

    def __init__(self, patterns: Iterable[str], rate: str) -> None:
        self.run: R | None = None
        """The load running (None when stopped)."""
        self._lock = threading.RLock()
        self._syncing = False
        c: dict[str, Any] = {}
        c["pattern"] = w.Dropdown(options=list(patterns), description="load",
                                  layout=control_layout(), style=STYLE)  # fmt: skip
        c["rate"] = w.Text(value=rate, description="rate (req/s)", layout=control_layout(),
                           style=STYLE, continuous_update=False)  # fmt: skip
        self.widgets = c
        self.error = w.HTML(layout=w.Layout(min_width="10px"))
        """Where a refusal to start (or a load that stopped on an error) shows."""

    def _add_start(self) -> w.HBox:
        """The start/stop button (after the subclass's fields), in a row with the error."""
        c = self.widgets
        c["start"] = w.ToggleButton(description="start load", icon="play", value=False)
        c["start"].observe(lambda ch: self._on_start(ch["new"]), "value")
        return w.HBox([c["start"], self.error])

    def _start(self) -> None:
        """Start the load from the fields, under :attr:`_lock`; raise what a field got wrong.

        Raises ``ValueError``, ``TypeError`` or ``labserve.LabServeError``: shown by the button.
        """
        raise NotImplementedError

    def poll(self) -> str:
        """What the load is doing, for the status line ('' when none runs)."""
        raise NotImplementedError

    def _on_start(self, on: bool) -> None:
        if self._syncing:
            return
        if not on:
            self.stop()
            return
        try:
            self._start()
        except (ValueError, TypeError, labserve.LabServeError) as exc:
            self.error.value = error_html(str(exc))
            self._set_button(False)
            return
        self.error.value = ""
        start = self.widgets["start"]
        start.description, start.icon = "stop load", "stop"

    def stop(self) -> None:
        """Stop the load, if one runs. Idempotent; thread-safe."""
        with self._lock:
            self._stop_locked()
        self._set_button(False)

    def _stop_locked(self) -> None:
        run, self.run = self.run, None
        if run is not None:
            run.stop()

    def _set_button(self, on: bool) -> None:
        c = self.widgets["start"]
        self._syncing = True
        try:
            c.value = on
            c.description, c.icon = ("stop load", "stop") if on else ("start load", "play")
        finally:
            self._syncing = False


def clock(seconds: float) -> str:
    """``m:ss``, the time a load has run."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


def number(name: str, text: str) -> float:
    """``text`` as a float; a refusal naming the field if it is none."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
