"""The scheduler's controls of a generative method: its knobs, applied at the next step.

Strategy (continuous or static), scheduling policy, ``max_num_seqs``,
``max_num_batched_tokens``, chunked prefill, the TTFT and TPOT targets (goodput's), and the
KV cache's size in blocks (``num_kv_blocks``: past it, sequences are preempted; refused live,
with the reason beside it, for a model that stores K/V in labserve's blocks), on
the chosen method's source (a runner in this process, a server by URL). A bad value is
refused with its reason next to the control, and the control goes back to what holds; a
change made elsewhere (a cell, ``PATCH /config``) shows in the controls.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as w

import labserve

from ..controls import control_layout, error_html

__all__ = ["MAX_NUM_BATCHED_TOKENS_STEPS", "MAX_NUM_SEQS_STEPS", "GenerationControls"]

MAX_NUM_SEQS_STEPS = tuple(2**k for k in range(11))  # 1 .. 1024
MAX_NUM_BATCHED_TOKENS_STEPS = tuple(2**k for k in range(4, 16))  # 16 .. 32768
_STYLE = {"description_width": "185px"}  # "max_num_batched_tokens" whole
_SLIDERS = {
    "max_num_seqs": MAX_NUM_SEQS_STEPS,
    "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS_STEPS,
}
_BOXES = {"ttft_slo_ms": "0: no target", "tpot_slo_ms": "0: no target",
          "num_kv_blocks": "0: no limit"}  # fmt: skip
"""Settings typed into a box, with what 0 means."""
_INTS = {*_SLIDERS, "num_kv_blocks"}


def _nearest(steps: tuple[int, ...], value: float) -> int:
    return min(steps, key=lambda s: abs(math.log(s) - math.log(max(value, 1))))


class GenerationControls:
    """Controls over the scheduling of one of ``methods`` (name -> ``GenerationSource``).

    ``on_method()`` runs after another method is chosen, ``on_reset()`` after the figures
    were reset (or, for a source that cannot reset, after the button asked the charts to
    start over). Thread-safety: :meth:`show_config` and :meth:`follow` may be called from
    any thread (the pump calls :meth:`follow`); the widgets' callbacks run on the kernel's
    thread. Showing a config never configures.
    """

    def __init__(
        self,
        methods: dict[str, labserve.GenerationSource],
        first: str,
        *,
        on_method: Callable[[], None] = lambda: None,
        on_reset: Callable[[], None] = lambda: None,
    ) -> None:
        self.methods = methods
        self._on_method_chosen = on_method
        self._on_reset_done = on_reset
        self._lock = threading.RLock()
        self._showing = threading.local()
        self.shown: labserve.GenerationConfig | None = None
        """The config the controls show."""
        c: dict[str, Any] = {}
        style, layout = _STYLE, control_layout
        c["method"] = w.Dropdown(options=list(methods), value=first, description="method",
                                 layout=layout(), style=style)  # fmt: skip
        c["strategy"] = w.Dropdown(options=list(labserve.GENERATION_STRATEGIES),
                                   description="strategy", layout=layout(),
                                   style=style)  # fmt: skip
        c["scheduling_policy"] = w.Dropdown(options=list(labserve.SCHEDULING_POLICIES),
                                            description="scheduling_policy", layout=layout(),
                                            style=style)  # fmt: skip
        for key, steps in _SLIDERS.items():
            c[key] = w.SelectionSlider(options=list(steps), description=key, layout=layout(),
                                       style=style, continuous_update=False)  # fmt: skip
            c[f"{key}_text"] = w.Text(layout=w.Layout(width="70px"), continuous_update=False)
        c["enable_chunked_prefill"] = w.Checkbox(description="enable_chunked_prefill",
                                                 indent=False, layout=layout())  # fmt: skip
        for key, zero in _BOXES.items():
            c[f"{key}_text"] = w.Text(description=key, placeholder=zero,
                                      layout=layout(), style=style,
                                      continuous_update=False)  # fmt: skip
        c["reset"] = w.Button(description="reset statistics", layout=w.Layout(width="160px"))
        self.widgets = c
        self._reset_label()
        keys = (*_SLIDERS, *_BOXES, "config")
        self.errors = {k: w.HTML(layout=w.Layout(min_width="10px")) for k in keys}

        c["method"].observe(lambda _: self._on_method(), names="value")
        for key in ("strategy", "scheduling_policy", "enable_chunked_prefill", *_SLIDERS):
            c[key].observe(lambda ch, key=key: self._on_setting(key, ch["new"]), "value")
        for key in (*_SLIDERS, *_BOXES):
            c[f"{key}_text"].observe(lambda ch, key=key: self._on_text(key, ch["new"]), "value")
        c["reset"].on_click(lambda _: self._on_reset())

        rows: list[Any] = [c["method"]] if len(methods) > 1 else []
        rows += [c["strategy"], c["scheduling_policy"]]
        rows += [w.HBox([c[k], c[f"{k}_text"], self.errors[k]]) for k in _SLIDERS]
        rows += [c["enable_chunked_prefill"]]
        rows += [w.HBox([c[f"{k}_text"], self.errors[k]]) for k in _BOXES]
        rows += [w.HBox([c["reset"], self.errors["config"]])]
        self.box = w.VBox(rows)
        self.show_config(self.method.config)

    @property
    def method(self) -> labserve.GenerationSource:
        """The source of the method chosen."""
        return self.methods[self.widgets["method"].value]

    def _reset_label(self) -> None:
        button = self.widgets["reset"]
        if self.method.resettable:
            button.description, button.tooltip = "reset statistics", ""
        else:  # a remote server's figures are its own: the charts start over
            button.description = "clear charts"
            button.tooltip = "this server's figures cannot be reset from here"

    def show_config(self, config: labserve.GenerationConfig) -> None:
        """Set every control to ``config`` without acting on it (thread-safe)."""
        c = self.widgets
        with self._lock:
            self._showing.on = True
            try:
                c["strategy"].value = config.strategy
                c["scheduling_policy"].value = config.scheduling_policy
                c["enable_chunked_prefill"].value = config.enable_chunked_prefill
                for key, steps in _SLIDERS.items():
                    value = getattr(config, key)
                    c[key].value = _nearest(steps, value)
                    c[f"{key}_text"].value = f"{value}"
                for key in _BOXES:
                    c[f"{key}_text"].value = f"{getattr(config, key):g}"
                self.shown = config
            finally:
                self._showing.on = False

    def follow(self, config: labserve.GenerationConfig | None = None) -> None:
        """Show the method's config if it changed elsewhere (thread-safe; cheap when not).

        ``config``: the one asked for, as the pump's last view saw it; the source is asked
        again only when it differs from what is shown (the view may predate a change).
        """
        with self._lock:
            if config is None or config != self.shown:
                config = self.method.config
            if config != self.shown:
                self.show_config(config)

    def _acting(self) -> bool:
        return not getattr(self._showing, "on", False)

    def _configure(self, error_key: str, **changes: Any) -> None:
        with self._lock:
            try:
                config = self.method.configure(**changes)
            except (labserve.LabServeError, ValueError, TypeError) as exc:
                self.errors[error_key].value = error_html(str(exc))
                self.show_config(self.method.config)  # the controls show what is in force
                return
            self.errors[error_key].value = ""
            self.show_config(config)

    def _on_setting(self, key: str, value: Any) -> None:
        if self._acting():
            self._configure(key if key in _SLIDERS else "config", **{key: value})

    def _on_text(self, key: str, text: str) -> None:
        if not self._acting():
            return
        try:
            value: Any = int(text) if key in _INTS else float(text)
        except ValueError:
            kind = "an integer" if key in _INTS else "a number of milliseconds"
            self.errors[key].value = error_html(f"{key} must be {kind}, got {text!r}")
            self.show_config(self.method.config)
            return
        self._configure(key, **{key: value})

    def _on_method(self) -> None:
        self._reset_label()
        self.show_config(self.method.config)
        self._on_method_chosen()

    def _on_reset(self) -> None:
        if self.method.resettable:
            try:
                self.method.reset_stats()
            except Exception as exc:  # shown next to the button
                self.errors["config"].value = error_html(f"reset failed: {exc}")
                return
        self.errors["config"].value = ""
        self._on_reset_done()
