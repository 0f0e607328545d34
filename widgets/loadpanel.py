"""The load column: a preset load shape and rate (or N clients), started and stopped by a button.

The shapes are labserve's load presets (:data:`labserve.LOAD_PRESETS`); the load runs on
labserve's background loop (:func:`labserve.start_load`), not in the notebook.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import numpy as np

import labserve

from .controls import control_layout, error_html

__all__ = ["LoadControls", "example_from_spec"]

_STYLE = {"description_width": "110px"}
_CLOSED_LOOP = "closed loop"


def example_from_spec(method: labserve.RunnerMethod) -> Any:
    """One request of zeros shaped by the method's ``input_spec``, or None if it has none."""
    specs = method.spec.input_spec
    if not specs or len(specs) != 1 or any(d == -1 for d in specs[0].shape):
        return None
    shape = list(specs[0].shape)
    batch_dim = method.spec.batch_dim
    shape.insert(batch_dim if isinstance(batch_dim, int) else batch_dim[0], 1)
    return np.zeros(shape, dtype=specs[0].dtype)


class LoadControls:
    """A load generator on the method ``target()`` returns, driven by widgets.

    ``example``: the request sent (default: from the method's ``input_spec``). Thread-safety:
    :meth:`poll` runs on the dashboard's pump thread, the widgets' callbacks on the kernel's;
    :meth:`stop` may be called from either.
    """

    def __init__(self, target: Callable[[], labserve.RunnerMethod], example: Any = None) -> None:
        self._target = target
        self._example = example
        self.run: labserve.LoadRun | None = None
        """The load running (None when stopped)."""
        self._ends = 0.0
        self._syncing = False
        c: dict[str, Any] = {}
        c["pattern"] = w.Dropdown(options=list(labserve.LOAD_PRESETS), description="load",
                                  layout=control_layout(), style=_STYLE)  # fmt: skip
        c["rate"] = w.Text(value="500", description="rate (req/s)", layout=control_layout(),
                           style=_STYLE, continuous_update=False)  # fmt: skip
        c["concurrency"] = w.Text(value="16", description="clients", layout=control_layout(),
                                  style=_STYLE, continuous_update=False)  # fmt: skip
        c["duration"] = w.Text(value="60", description="duration (s)", layout=control_layout(),
                               style=_STYLE, continuous_update=False)  # fmt: skip
        c["start"] = w.ToggleButton(description="start load", icon="play", value=False)
        self.widgets = c
        self.error = w.HTML(layout=w.Layout(min_width="10px"))
        c["start"].observe(lambda ch: self._on_start(ch["new"]), "value")
        c["pattern"].observe(lambda _: self._show_fields(), "value")
        self._show_fields()
        self.box = w.VBox([
            c["pattern"], c["rate"], c["concurrency"], c["duration"],
            w.HBox([c["start"], self.error]),
        ])  # fmt: skip

    def _show_fields(self) -> None:
        closed = self.widgets["pattern"].value == _CLOSED_LOOP
        self.widgets["rate"].layout.display = "none" if closed else None
        self.widgets["concurrency"].layout.display = None if closed else "none"

    def _on_start(self, on: bool) -> None:
        if self._syncing:
            return
        if not on:
            self.stop()
            return
        c = self.widgets
        method = self._target()
        example = self._example if self._example is not None else example_from_spec(method)
        try:
            if example is None:
                raise ValueError(
                    "no example request: pass Dashboard(..., example=x), or declare the "
                    "method's input_spec"
                )
            duration = float(c["duration"].value)
            kwargs: dict[str, Any] = {"example": example, "duration_s": duration}
            if c["pattern"].value == _CLOSED_LOOP:
                text = c["concurrency"].value
                if not text.strip().isdigit():
                    raise ValueError(f"clients must be an integer >= 1, got {text!r}")
                kwargs["concurrency"] = int(text)
            else:
                kwargs["arrivals"] = labserve.preset_arrivals(
                    c["pattern"].value, _number("rate", c["rate"].value), period_s=duration
                )
            self.run = labserve.start_load(method, **kwargs)
        except (ValueError, TypeError, labserve.LabServeError) as exc:
            self.error.value = error_html(str(exc))
            self._set_button(False)
            return
        self.error.value = ""
        self._ends = time.monotonic() + duration
        c["start"].description, c["start"].icon = "stop load", "stop"

    def stop(self) -> None:
        """Stop the load, if one runs. Idempotent."""
        run, self.run = self.run, None
        if run is not None:
            run.stop()
        self._set_button(False)

    def _set_button(self, on: bool) -> None:
        c = self.widgets["start"]
        self._syncing = True
        try:
            c.value = on
            c.description, c.icon = ("stop load", "stop") if on else ("start load", "play")
        finally:
            self._syncing = False

    def poll(self) -> str:
        """What the load is doing, for the status line ('' when none runs); notes its end."""
        run = self.run
        if run is None:
            return ""
        if run.running and time.monotonic() < self._ends + 1:
            left = max(self._ends - time.monotonic(), 0.0)
            return f"load {run.sent:,} sent, {left:.0f} s left"
        self.run = None
        self._set_button(False)
        return ""


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
