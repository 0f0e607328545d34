"""The generation load column: a length mix at a rate, started and stopped by a button.

Prompt and output lengths come from the length vocabulary (``"lognormal:32:256"``,
``"uniform:1:512"``, ``64``); arrivals from labserve's load presets (Poisson, constant,
step, burst). The load runs until stopped (:class:`labserve.UntilStopped`, chunks of one
preset period), on the source's own machinery: ``async_run`` on the runner's background
loop in this process, streamed completions over ``/v1`` for a server by URL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w

import labserve

from ..controls import control_layout, error_html

__all__ = ["GenerationLoadControls"]

_STYLE = {"description_width": "110px"}
_PATTERNS = tuple(p for p in labserve.LOAD_PRESETS if p != "closed loop")


class GenerationLoadControls:
    """A load generator on the generation source ``target()`` returns, driven by widgets.

    Thread-safety: :meth:`poll` runs on the dashboard's pump thread, the widgets'
    callbacks on the kernel's; :meth:`stop` may be called from either. ``chunk_s``: the
    length of each chained run (the preset shapes' period).
    """

    def __init__(
        self,
        target: Callable[[], labserve.GenerationSource],
        *,
        rate: float = 4.0,
        input_len: str = "lognormal:32:256",
        output_len: str = "lognormal:64:256",
        chunk_s: float = 30.0,
    ) -> None:
        self._target = target
        self.chunk_s = chunk_s
        self.run: labserve.UntilStopped | None = None
        """The load running (None when stopped)."""
        self._lock = threading.RLock()
        self._started = 0.0
        self._syncing = False
        c: dict[str, Any] = {}
        c["pattern"] = w.Dropdown(options=list(_PATTERNS), description="load",
                                  layout=control_layout(), style=_STYLE)  # fmt: skip
        c["rate"] = w.Text(value=f"{rate:g}", description="rate (req/s)",
                           layout=control_layout(), style=_STYLE,
                           continuous_update=False)  # fmt: skip
        c["input_len"] = w.Text(value=input_len, description="prompt tokens",
                                layout=control_layout(), style=_STYLE,
                                continuous_update=False)  # fmt: skip
        c["output_len"] = w.Text(value=output_len, description="output tokens",
                                 layout=control_layout(), style=_STYLE,
                                 continuous_update=False)  # fmt: skip
        c["start"] = w.ToggleButton(description="start load", icon="play", value=False)
        self.widgets = c
        self.error = w.HTML(layout=w.Layout(min_width="10px"))
        c["start"].observe(lambda ch: self._on_start(ch["new"]), "value")
        hint = w.HTML(
            "<small>lengths: <code>64</code>, <code>uniform:1:512</code>, "
            "<code>lognormal:MEDIAN:P99</code></small>"
        )
        self.box = w.VBox([c["pattern"], c["rate"], c["input_len"], c["output_len"], hint,
                           w.HBox([c["start"], self.error])])  # fmt: skip

    def _on_start(self, on: bool) -> None:
        if self._syncing:
            return
        if not on:
            self.stop()
            return
        c = self.widgets
        source = self._target()
        try:
            rate = _number("rate (req/s)", c["rate"].value)
            arrivals = labserve.preset_arrivals(c["pattern"].value, rate, period_s=self.chunk_s)
            input_len = labserve.parse_length(c["input_len"].value.strip(), name="prompt tokens")
            output_len = labserve.parse_length(c["output_len"].value.strip(), name="output tokens")

            def start(seed: int, duration_s: float) -> Any:
                return source.start_load(arrivals=arrivals, duration_s=duration_s,
                                         input_len=input_len, output_len=output_len,
                                         seed=seed)  # fmt: skip

            with self._lock:
                self._stop_locked()
                self.run = labserve.UntilStopped(start, chunk_s=self.chunk_s)
                self._started = time.monotonic()
        except (ValueError, TypeError, labserve.LabServeError) as exc:
            self.error.value = error_html(str(exc))
            self._set_button(False)
            return
        self.error.value = ""
        c["start"].description, c["start"].icon = "stop load", "stop"

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

    def poll(self) -> str:
        """What the load is doing, for the status line ('' when none runs)."""
        with self._lock:
            run = self.run
            if run is None:
                return ""
            if run.error is not None:  # a later chunk could not start (the server went away)
                self.error.value = error_html(f"load stopped: {run.error}")
                self._stop_locked()
            elif run.running:
                minutes, secs = divmod(int(time.monotonic() - self._started), 60)
                return f"load {run.sent:,} sent · running {minutes}:{secs:02d}, until stopped"
            else:
                self.run = None
        self._set_button(False)
        return ""


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
