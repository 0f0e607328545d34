"""The scheduler's controls of a generative method: its knobs, applied at the next step.

Strategy (continuous or static), scheduling policy, ``max_num_seqs``,
``max_num_batched_tokens``, chunked prefill, prefix caching (refused, with the reason beside
it, for a model that keeps its own caches), the TTFT and TPOT targets (goodput's), and the KV
cache's size in blocks (``num_kv_blocks``: past it, sequences are preempted; refused live,
with the reason beside it, for a model that stores K/V in labserve's blocks), on
the chosen method's source (a runner in this process, a server by URL). A bad value is
refused with its reason next to the control, and the control goes back to what holds; a
change made elsewhere (a cell, ``PATCH /config``) shows in the controls.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import ipywidgets as w

import labserve

from ..controls_base import ControlsBase, control_layout

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
_CHECKBOXES = ("enable_chunked_prefill", "enable_prefix_caching")


def _nearest(steps: tuple[int, ...], value: float) -> int:
    return min(steps, key=lambda s: abs(math.log(s) - math.log(max(value, 1))))


class GenerationControls(ControlsBase[labserve.GenerationSource, labserve.GenerationConfig]):
    """Controls over the scheduling of one of ``methods`` (name -> ``GenerationSource``).

    ``on_method()`` runs after another method is chosen, ``on_reset()`` after the figures
    were reset (or, for a source that cannot reset, after the button asked the charts to
    start over). Thread-safety: :meth:`show_config` and :meth:`follow` may be called from
    any thread (the pump calls :meth:`follow`); the widgets' callbacks run on the kernel's
    thread. Showing a config never configures.
    """

    _STYLE: ClassVar[dict[str, str]] = _STYLE
    _COUNTS: ClassVar[str] = "figures"
    _INTS: ClassVar[frozenset[str]] = frozenset({*_SLIDERS, "num_kv_blocks"})
    _FLOAT_KIND: ClassVar[str] = "a number of milliseconds"

    def _build(self) -> w.VBox:
        c = self.widgets
        style, layout = _STYLE, control_layout
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
        c["enable_prefix_caching"] = w.Checkbox(description="enable_prefix_caching",
                                                indent=False, layout=layout())  # fmt: skip
        for key, zero in _BOXES.items():
            c[f"{key}_text"] = w.Text(description=key, placeholder=zero,
                                      layout=layout(), style=style,
                                      continuous_update=False)  # fmt: skip
        c["reset"] = w.Button(description="reset statistics", layout=w.Layout(width="160px"))
        keys = (*_SLIDERS, *_BOXES, "enable_prefix_caching", "config")
        self.errors = {k: w.HTML(layout=w.Layout(min_width="10px")) for k in keys}

        for key in ("strategy", "scheduling_policy", *_CHECKBOXES, *_SLIDERS):
            c[key].observe(lambda ch, key=key: self._on_setting(key, ch["new"]), "value")
        for key in (*_SLIDERS, *_BOXES):
            c[f"{key}_text"].observe(lambda ch, key=key: self._on_text(key, ch["new"]), "value")

        rows: list[Any] = [c["method"]] if len(self.methods) > 1 else []
        rows += [c["strategy"], c["scheduling_policy"]]
        rows += [w.HBox([c[k], c[f"{k}_text"], self.errors[k]]) for k in _SLIDERS]
        rows += [c["enable_chunked_prefill"]]
        rows += [w.HBox([c["enable_prefix_caching"], self.errors["enable_prefix_caching"]])]
        rows += [w.HBox([c[f"{k}_text"], self.errors[k]]) for k in _BOXES]
        rows += [w.HBox([c["reset"], self.errors["config"]])]
        return w.VBox(rows)

    def _show(self, config: labserve.GenerationConfig) -> None:
        c = self.widgets
        c["strategy"].value = config.strategy
        c["scheduling_policy"].value = config.scheduling_policy
        for key in _CHECKBOXES:  # None (decided by the model) shows as off
            c[key].value = bool(getattr(config, key))
        for key, steps in _SLIDERS.items():
            value = getattr(config, key)
            c[key].value = _nearest(steps, value)
            c[f"{key}_text"].value = f"{value}"
        for key in _BOXES:
            c[f"{key}_text"].value = f"{getattr(config, key):g}"

    def _on_setting(self, key: str, value: Any) -> None:
        if self._acting():
            self._configure(key if key in self.errors else "config", **{key: value})
