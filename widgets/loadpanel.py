"""The load column: a preset load shape and rate (or N clients), started and stopped by a button.

The shapes are labserve's load presets (:data:`labserve.LOAD_PRESETS`); the load runs on a
background loop, not in the notebook: the source's own (``MethodSource.start_load``: the
runner's calls in this process, the HTTP load generator for a server by URL or Ray's proxy).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w

import labserve

from .controls_base import control_layout, error_html
from .loadpanel_base import STYLE, LoadPanelBase, clock, number

__all__ = ["CHUNK_S", "LoadControls", "example_from_spec"]

_CLOSED_LOOP = "closed loop"
CHUNK_S = 30.0
"""A load that runs until stopped runs as chained runs of this long (one preset period)."""


def example_from_spec(method: labserve.RunnerMethod) -> Any:
    """One request of zeros shaped by the method's ``input_spec``, or None if it has none."""
    return labserve.RunnerSource(method).example()


class LoadControls(LoadPanelBase[labserve.LoadRun]):
    """A load generator on the method source ``target()`` returns, driven by widgets.

    It runs until stopped (chained runs of one preset period each, the elapsed time shown),
    or for the duration typed. ``example``: the request sent (default: the source's, from
    a method's ``input_spec``). ``input_len``: show a field for a length mix (a method with
    a ragged axis), holding this at first (``"lognormal:16:128"``; empty sends ``example``
    as it is). Thread-safety: :meth:`poll` runs on the dashboard's pump
    thread, the widgets' callbacks on the kernel's; :meth:`stop` may be called from either.
    """

    def __init__(
        self,
        target: Callable[[], labserve.MethodSource],
        example: Any = None,
        input_len: str | None = None,
    ) -> None:
        super().__init__(labserve.LOAD_PRESETS, rate="500")
        self._target = target
        self._example = example
        self._method: labserve.MethodSource | None = None
        self._kwargs: dict[str, Any] = {}
        self._until_stopped = True
        self._started = self._ends = 0.0
        self._sent_before = self._chunks = 0
        self._next: threading.Timer | None = None
        c = self.widgets
        c["concurrency"] = w.Text(value="16", description="clients", layout=control_layout(),
                                  style=STYLE, continuous_update=False)  # fmt: skip
        c["duration"] = w.Text(value="", placeholder="until stopped",
                               description="duration (s)", layout=control_layout(),
                               style=STYLE, continuous_update=False)  # fmt: skip
        if input_len is not None:  # each request resized to a length drawn from the mix
            c["input_len"] = w.Text(value=input_len, description="input lengths",
                                    placeholder="e.g. lognormal:16:128", style=STYLE,
                                    layout=control_layout(), continuous_update=False)  # fmt: skip
        start = self._add_start()
        c["pattern"].observe(lambda _: self._show_fields(), "value")
        self._show_fields()
        self.box = w.VBox([
            c["pattern"], c["rate"], c["concurrency"], c["duration"],
            *([c["input_len"]] if "input_len" in c else []),
            start,
        ])  # fmt: skip

    def _show_fields(self) -> None:
        closed = self.widgets["pattern"].value == _CLOSED_LOOP
        self.widgets["rate"].layout.display = "none" if closed else None
        self.widgets["concurrency"].layout.display = None if closed else "none"

    def _start(self) -> None:
        c = self.widgets
        method = self._target()
        example = self._example if self._example is not None else method.example()
        if example is None:
            raise ValueError(
                "no example request: pass Dashboard(..., example=x), or declare the "
                "method's input_spec"
            )
        text = c["duration"].value.strip()
        duration = None if text == "" else number("duration (s)", text)
        if duration is not None and not (math.isfinite(duration) and duration > 0):
            raise ValueError(f"duration (s) must be a number > 0 or empty, got {text!r}")
        # Until stopped: one preset period at a time, each chained at the end of the last.
        chunk = duration if duration is not None else CHUNK_S
        kwargs: dict[str, Any] = {"example": example, "duration_s": chunk}
        if "input_len" in c and c["input_len"].value.strip():
            kwargs["input_len"] = c["input_len"].value.strip()
        if c["pattern"].value == _CLOSED_LOOP:
            clients = c["concurrency"].value
            if not clients.strip().isdigit():
                raise ValueError(f"clients must be an integer >= 1, got {clients!r}")
            kwargs["concurrency"] = int(clients)
        else:
            kwargs["arrivals"] = labserve.preset_arrivals(
                c["pattern"].value, number("rate", c["rate"].value), period_s=chunk
            )
        with self._lock:
            self._stop_locked()
            self.run = method.start_load(**kwargs)
            self._method, self._kwargs = method, kwargs
            self._until_stopped = duration is None
            self._started = time.monotonic()
            self._ends = self._started + chunk
            self._sent_before, self._chunks = 0, 1

    def _next_chunk(self) -> None:
        """On a timer thread, at the end of a chunk: the next one, if the load still runs."""
        with self._lock:
            run = self.run
            if run is None or self._next is None or self._method is None:
                return
            self._next = None
            self._sent_before += run.sent
            try:
                self.run = self._method.start_load(seed=self._chunks, **self._kwargs)
            except labserve.LabServeError as exc:  # the runner stopped under it
                self.run = None
                self.error.value = error_html(str(exc))
                return
            self._chunks += 1
            self._ends = time.monotonic() + self._kwargs["duration_s"]

    def _stop_locked(self) -> None:
        if self._next is not None:
            self._next.cancel()
            self._next = None
        super()._stop_locked()

    def poll(self) -> str:
        """What the load is doing, for the status line ('' when none runs); notes its end.

        Called a few times a second (the pump): it schedules the next chunk of a load that
        runs until stopped, to start when this one ends.
        """
        with self._lock:
            run = self.run
            if run is None:
                return ""
            now = time.monotonic()
            left = self._ends - now
            if self._until_stopped and left < 1.0 and self._next is None:
                self._next = threading.Timer(max(left, 0.0), self._next_chunk)
                self._next.daemon = True
                self._next.start()
            if run.running or self._next is not None or left > -1.0:
                sent = self._sent_before + run.sent
                elapsed = clock(now - self._started)
                if self._until_stopped:
                    return f"load {sent:,} sent · running {elapsed}, until stopped"
                return f"load {sent:,} sent · {elapsed}, {max(left, 0.0):.0f} s left"
            self.run = None
        self._set_button(False)
        return ""
