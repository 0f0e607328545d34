"""The batching controls: method, strategy, caps and overload policy, reset, and the export box.

They act on the chosen method's source (a runner in this process, a server by URL, a Ray
application's replicas) at its next batch, and show the config asked for: a bad value is
refused with its reason next to the control, and the control goes back to what holds
(:class:`~labserve.widgets.controls_base.ControlsBase` owns that; this module, the knobs).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import ipywidgets as w

import labserve

from .controls_base import ERROR_WIDTH, ControlsBase, control_layout

__all__ = [
    "MAX_BATCH_SIZE_STEPS",
    "MAX_LATENCY_MS_STEPS",
    "BatchingControls",
]

MAX_BATCH_SIZE_STEPS = tuple(2**k for k in range(11))  # 1 .. 1024
MAX_LATENCY_MS_STEPS = (0, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_STYLE = {"description_width": "125px"}  # "latency target ms" whole, as tokencontrols


class BatchingControls(ControlsBase[labserve.MethodSource, labserve.BatchingConfig]):
    """Controls over the batching of one of ``methods`` (a name -> ``labserve.MethodSource``).

    ``on_method()`` runs after another method is chosen, ``on_reset()`` after its statistics
    were reset (or, for a source whose counts cannot be reset, after the button asked the
    charts to start over). Thread-safety: :meth:`show_config` and :meth:`follow` may be
    called from any thread (the pump calls them when the config changed elsewhere); the
    widgets' own callbacks run on the kernel's thread. Showing a config never configures.
    """

    _STYLE: ClassVar[dict[str, str]] = _STYLE
    _INTS: ClassVar[frozenset[str]] = frozenset({"max_batch_size"})

    def _build(self) -> w.VBox:
        c = self.widgets
        c["strategy"] = w.Dropdown(options=list(labserve.STRATEGIES), description="strategy",
                                   layout=control_layout(), style=_STYLE)  # fmt: skip
        c["max_batch_size"] = w.SelectionSlider(options=list(MAX_BATCH_SIZE_STEPS),
                                                description="max_batch_size",
                                                layout=control_layout(), style=_STYLE,
                                                continuous_update=False)  # fmt: skip
        c["max_batch_size_text"] = w.Text(layout=w.Layout(width="70px"), continuous_update=False)
        c["max_latency_ms"] = w.SelectionSlider(options=list(MAX_LATENCY_MS_STEPS),
                                                description="max_latency_ms",
                                                layout=control_layout(), style=_STYLE,
                                                continuous_update=False)  # fmt: skip
        c["max_latency_ms_text"] = w.Text(layout=w.Layout(width="70px"), continuous_update=False)
        c["on_overload"] = w.Dropdown(options=["wait", "reject"], description="on_overload",
                                      layout=control_layout(), style=_STYLE)  # fmt: skip
        c["latency_slo_ms_text"] = w.Text(description="latency target ms", style=_STYLE,
                                          layout=w.Layout(width="220px"),
                                          continuous_update=False)  # fmt: skip
        c["reset"] = w.Button(description="reset statistics", icon="eraser")
        c["export_format"] = w.ToggleButtons(options=["labserve", "ray", "triton"],
                                             description="export", style=_STYLE)  # fmt: skip
        c["export"] = w.Textarea(layout=w.Layout(width="420px", height="150px"))
        keys = ("max_batch_size", "max_latency_ms", "latency_slo_ms", "config")
        # A long refusal wraps under its control: unbounded, it widened this column and pushed
        # the load controls beside it out of view.
        self.errors = {
            k: w.HTML(layout=w.Layout(min_width="10px", max_width=ERROR_WIDTH)) for k in keys
        }

        for key in ("strategy", "max_batch_size", "max_latency_ms", "on_overload"):
            c[key].observe(lambda change, key=key: self._on_setting(key, change["new"]), "value")
        for key in ("max_batch_size", "max_latency_ms", "latency_slo_ms"):
            c[f"{key}_text"].observe(lambda ch, key=key: self._on_text(key, ch["new"]), "value")
        c["export_format"].observe(lambda _: self._show_export(), "value")

        box = w.VBox([
            c["method"],
            c["strategy"],
            w.HBox([c["max_batch_size"], c["max_batch_size_text"], self.errors["max_batch_size"]]),
            w.HBox([c["max_latency_ms"], c["max_latency_ms_text"], self.errors["max_latency_ms"]]),
            c["on_overload"],
            w.HBox([c["latency_slo_ms_text"], self.errors["latency_slo_ms"]]),
            w.HBox([c["reset"], self.errors["config"]]),
        ])  # fmt: skip
        self.export = w.Accordion(children=[w.VBox([c["export_format"], c["export"]])])
        self.export.set_title(0, "export these settings: labserve/BentoML YAML, Ray Serve, Triton")
        return box

    def _show(self, config: labserve.BatchingConfig) -> None:
        c = self.widgets
        c["strategy"].value = config.strategy
        c["on_overload"].value = config.on_overload
        for key, steps in (
            ("max_batch_size", MAX_BATCH_SIZE_STEPS),
            ("max_latency_ms", MAX_LATENCY_MS_STEPS),
        ):
            value: float = getattr(config, key)
            c[key].value = min(steps, key=lambda s: abs(math.log1p(s) - math.log1p(value)))
            c[f"{key}_text"].value = f"{value:g}"
        c["latency_slo_ms_text"].value = f"{config.latency_slo_ms:g}"  # 0: none

    def show_config(self, config: labserve.BatchingConfig) -> None:
        """Set every control to ``config`` without acting on it, the export too (thread-safe)."""
        with self._lock:
            super().show_config(config)
            self._show_export()

    def _on_setting(self, key: str, value: Any) -> None:
        if self._acting():
            self._configure("config" if key in ("strategy", "on_overload") else key, **{key: value})

    def _show_export(self) -> None:
        fmt = self.widgets["export_format"].value
        source = self.method
        try:
            config = self.shown if self.shown is not None else source.config
            text = labserve.export_config(
                config, fmt=fmt, runner=source.runner, method=source.method
            )
        except Exception as exc:  # export must never break the controls
            text = f"# could not export: {exc}"
        self.widgets["export"].value = text
