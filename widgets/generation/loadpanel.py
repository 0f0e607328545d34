"""The generation load column: a length mix at a rate, started and stopped by a button.

Prompt and output lengths come from the length vocabulary (``"lognormal:32:256"``,
``"uniform:1:512"``, ``64``); arrivals from labserve's load presets (Poisson, constant,
step, burst). The load runs until stopped (:class:`labserve.UntilStopped`, chunks of one
preset period), on the source's own machinery: ``async_run`` on the runner's background
loop in this process, streamed completions over ``/v1`` for a server by URL. With a shared
prefix or several turns it sends a :class:`labserve.SharedPrefixWorkload`'s sessions
instead (chats on ``/v1/chat/completions`` by URL), the same tenants run after run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w

import labserve

from ..controls_base import control_layout, error_html
from ..loadpanel_base import STYLE, LoadPanelBase, clock, number

__all__ = ["GenerationLoadControls"]

_PATTERNS = tuple(p for p in labserve.LOAD_PRESETS if p != "closed loop")


class GenerationLoadControls(LoadPanelBase[labserve.UntilStopped]):
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
        super().__init__(_PATTERNS, rate=f"{rate:g}")
        self._target = target
        self.chunk_s = chunk_s
        self._started = 0.0
        self._unit = "requests"
        c = self.widgets
        c["input_len"] = w.Text(value=input_len, description="prompt tokens",
                                layout=control_layout(), style=STYLE,
                                continuous_update=False)  # fmt: skip
        c["output_len"] = w.Text(value=output_len, description="output tokens",
                                 layout=control_layout(), style=STYLE,
                                 continuous_update=False)  # fmt: skip
        shared = self._add_workload_fields()
        start = self._add_start()
        hint = w.HTML(
            "<small>lengths: <code>64</code>, <code>uniform:1:512</code>, "
            "<code>lognormal:MEDIAN:P99</code>; with a shared prefix or turns &gt; 1, the "
            "rate counts sessions and the prompt tokens are each turn's user message</small>",
            layout=control_layout(),  # wraps at the fields' width: a long line took the controls'
        )
        self.box = w.VBox([c["pattern"], c["rate"], c["input_len"], c["output_len"], *shared,
                           hint, start])  # fmt: skip

    def _add_workload_fields(self) -> list[w.Text]:
        """A shared-prefix workload's fields: its prefixes, turns and think time."""
        c = self.widgets
        fields = {"prefix_len": ("prefix tokens", "0"), "num_prefixes": ("prefixes", "1"),
                  "turns": ("turns", "1"), "think_time_s": ("think time (s)", "0")}  # fmt: skip
        for key, (label, value) in fields.items():
            c[key] = w.Text(value=value, description=label, layout=control_layout(),
                            style=STYLE, continuous_update=False)  # fmt: skip
        return [c[key] for key in fields]

    def workload(self) -> labserve.SharedPrefixWorkload | None:
        """The shared-prefix workload the fields ask for (None: no prefix and one turn).

        Raises:
            ValueError, TypeError: a field breaks its rule (the message names it).
        """
        c = self.widgets
        prefix_len = _integer("prefix tokens", c["prefix_len"].value)
        num_prefixes = _integer("prefixes", c["num_prefixes"].value)
        turns = _integer("turns", c["turns"].value)
        think_s = number("think time (s)", c["think_time_s"].value)
        if not prefix_len and turns == 1:
            return None
        return labserve.SharedPrefixWorkload(
            prefix_len=prefix_len,
            num_prefixes=num_prefixes,
            turns=turns,
            think_time_s=think_s,
            input_len=c["input_len"].value.strip(),
            output_len=c["output_len"].value.strip(),
        )

    def _start(self) -> None:
        c = self.widgets
        source = self._target()
        rate = number("rate (req/s)", c["rate"].value)
        arrivals = labserve.preset_arrivals(c["pattern"].value, rate, period_s=self.chunk_s)
        input_len = labserve.parse_length(c["input_len"].value.strip(), name="prompt tokens")
        output_len = labserve.parse_length(c["output_len"].value.strip(), name="output tokens")
        workload = self.workload()

        def start(seed: int, duration_s: float) -> Any:
            return source.start_load(arrivals=arrivals, duration_s=duration_s,
                                     input_len=input_len, output_len=output_len,
                                     seed=seed, workload=workload)  # fmt: skip

        with self._lock:
            self._stop_locked()
            self.run = labserve.UntilStopped(start, chunk_s=self.chunk_s)
            self._started = time.monotonic()
            self._unit = "sessions" if workload is not None else "requests"

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
                elapsed = clock(time.monotonic() - self._started)
                return f"load {run.sent:,} {self._unit} sent · running {elapsed}, until stopped"
            else:
                self.run = None
        self._set_button(False)
        return ""


def _integer(name: str, text: str) -> int:
    """``text`` as an integer; a refusal naming the field if it is none."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None
