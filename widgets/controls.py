"""The batching controls: method, strategy, caps and overload policy, reset, and the export box.

They act on the chosen method's source (a runner in this process, a server by URL, a Ray
application's replicas) at its next batch, and show the config asked for: a bad value is
refused with its reason next to the control, and the control goes back to what holds.
"""

from __future__ import annotations

import html
import math
import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as w

import labserve

__all__ = [
    "ERROR_WIDTH",
    "MAX_BATCH_SIZE_STEPS",
    "MAX_LATENCY_MS_STEPS",
    "BatchingControls",
    "error_html",
]

MAX_BATCH_SIZE_STEPS = tuple(2**k for k in range(11))  # 1 .. 1024
MAX_LATENCY_MS_STEPS = (0, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_STYLE = {"description_width": "125px"}  # "latency target ms" whole, as tokencontrols
ERROR_WIDTH = "240px"
"""The widest a refusal next to a control grows before it wraps."""


def error_html(message: str) -> str:
    """A refusal shown next to a control."""
    return f"<span style='color:#c00'>{html.escape(message)}</span>"


def control_layout() -> w.Layout:
    """One per control: hiding one control must not hide the others."""
    return w.Layout(width="330px")


class BatchingControls:
    """Controls over the batching of one of ``methods`` (a name -> ``labserve.MethodSource``).

    ``on_method()`` runs after another method is chosen, ``on_reset()`` after its statistics
    were reset (or, for a source whose counts cannot be reset, after the button asked the
    charts to start over). Thread-safety: :meth:`show_config` and :meth:`follow` may be
    called from any thread (the pump calls them when the config changed elsewhere); the
    widgets' own callbacks run on the kernel's thread. Showing a config never configures.
    """

    def __init__(
        self,
        methods: dict[str, labserve.MethodSource],
        first: str,
        *,
        on_method: Callable[[], None] = lambda: None,
        on_reset: Callable[[], None] = lambda: None,
    ) -> None:
        self.methods = methods
        self._on_method_chosen = on_method
        self._on_reset_done = on_reset
        self._lock = threading.RLock()
        self._showing = threading.local()  # True on the thread that is setting the widgets
        self.shown: labserve.BatchingConfig | None = None
        """The config the controls show."""
        c: dict[str, Any] = {}
        c["method"] = w.Dropdown(options=list(methods), value=first, description="method",
                                 layout=control_layout(), style=_STYLE)  # fmt: skip
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
        self.widgets = c
        self._reset_label()
        keys = ("max_batch_size", "max_latency_ms", "latency_slo_ms", "config")
        # A long refusal wraps under its control: unbounded, it widened this column and pushed
        # the load controls beside it out of view.
        self.errors = {
            k: w.HTML(layout=w.Layout(min_width="10px", max_width=ERROR_WIDTH)) for k in keys
        }

        c["method"].observe(lambda _: self._on_method(), names="value")
        for key in ("strategy", "max_batch_size", "max_latency_ms", "on_overload"):
            c[key].observe(lambda change, key=key: self._on_setting(key, change["new"]), "value")
        for key in ("max_batch_size", "max_latency_ms", "latency_slo_ms"):
            c[f"{key}_text"].observe(lambda ch, key=key: self._on_text(key, ch["new"]), "value")
        c["reset"].on_click(lambda _: self._on_reset())
        c["export_format"].observe(lambda _: self._show_export(), "value")

        self.box = w.VBox([
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
        self.show_config(self.method.config)

    @property
    def method(self) -> labserve.MethodSource:
        """The source of the method chosen."""
        return self.methods[self.widgets["method"].value]

    def _reset_label(self) -> None:
        button = self.widgets["reset"]
        if self.method.resettable:
            button.description, button.tooltip = "reset statistics", ""
        else:  # a remote server's counts are its own: the charts start over
            button.description = "clear charts"
            button.tooltip = "this server's counts cannot be reset from here"

    def show_config(self, config: labserve.BatchingConfig) -> None:
        """Set every control to ``config`` without acting on it (thread-safe)."""
        c = self.widgets
        with self._lock:
            self._showing.on = True
            try:
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
                self.shown = config
            finally:
                self._showing.on = False
            self._show_export()

    def follow(self, config: labserve.BatchingConfig | None = None) -> None:
        """Show the method's config if it changed elsewhere (thread-safe; cheap when not).

        ``config``: the one asked for, as the pump's last view saw it (the source is asked
        again only when it differs from what is shown). The config asked, not a
        snapshot's: a change applies at the next batch (an idle runner has none), but the
        controls show what was asked at once.
        """
        with self._lock:
            if config is None or config != self.shown:
                config = self.method.config  # asked again: the view may predate a change
            if config != self.shown:
                self.show_config(config)

    def _acting(self) -> bool:
        """False while this thread is only showing a config (the widgets' echo)."""
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
            self._configure("config" if key in ("strategy", "on_overload") else key, **{key: value})

    def _on_text(self, key: str, text: str) -> None:
        if not self._acting():
            return
        try:
            value: Any = int(text) if key == "max_batch_size" else float(text)
        except ValueError:
            kind = "an integer" if key == "max_batch_size" else "a number"
            self.errors[key].value = error_html(f"{key} must be {kind}, got {text!r}")
            self.show_config(self.method.config)
            return
        self._configure(key, **{key: value})

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

    def _on_method(self) -> None:
        self._reset_label()
        self.show_config(self.method.config)
        self._on_method_chosen()

    def _on_reset(self) -> None:
        if self.method.resettable:
            try:
                self.method.reset_stats()
            except Exception as exc:  # shown next to the button (a remote that failed)
                self.errors["config"].value = error_html(f"reset failed: {exc}")
                return
        self.errors["config"].value = ""
        self._on_reset_done()
