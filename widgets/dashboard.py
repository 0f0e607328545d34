"""The live dashboard: ipywidgets controls over a runner, streaming Bokeh charts, one pump thread.

Nothing here is on the request path: the runner records, and the :class:`Pump` pulls
snapshots on its own thread and is the only writer of the charts' Bokeh document.
"""

from __future__ import annotations

import atexit
import html
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import numpy as np
from bokeh.core.json_encoder import serialize_json
from bokeh.document import Document

import labserve

from .bokehjs import load_bokehjs
from .charts import Charts, ChartWidget, one_patch_per_widget
from .series import LiveSeries

__all__ = ["Dashboard", "Pump"]

MAX_BATCH_SIZE_STEPS = tuple(2**k for k in range(11))  # 1 .. 1024
MAX_LATENCY_MS_STEPS = (0, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
LOAD_PATTERNS = ("poisson", "constant", "step", "burst", "closed loop")
_OWNERS: weakref.WeakKeyDictionary[Document, Pump] = weakref.WeakKeyDictionary()
_OWNERS_LOCK = threading.Lock()


class Pump:
    """One thread that pulls a snapshot ``hz`` times a second and streams it into ``charts``.

    It is the only writer of the charts' document: a second pump on the same document
    raises ``RuntimeError``. ``lock`` is held while it writes; hold it to read the
    document consistently from another thread. Stops on :meth:`stop`, when ``alive()``
    turns false, or at interpreter exit.
    """

    def __init__(
        self,
        charts: Charts,
        doc: Document,
        source: Callable[[], labserve.RunnerMethod],
        *,
        hz: float = 5.0,
        alive: Callable[[], bool] = lambda: True,
        on_tick: Callable[[labserve.Snapshot], None] | None = None,
    ) -> None:
        if not (isinstance(hz, (int, float)) and math.isfinite(hz) and 0 < hz <= 60):
            raise ValueError(f"hz must be a number in (0, 60], got {hz!r}")
        with _OWNERS_LOCK:
            owner = _OWNERS.get(doc)
            if owner is not None and owner.running:
                raise RuntimeError("this Bokeh document already has a pump writing to it")
            _OWNERS[doc] = self
        self.charts = charts
        self.doc = doc
        self.hz = float(hz)
        self.lock = threading.RLock()
        self.ticks = 0
        """Ticks done."""
        self.cpu_s = 0.0
        """CPU time the pump thread spent on its ticks, seconds."""
        self.last_error: BaseException | None = None
        self._source = source
        self._alive = alive
        self._on_tick = on_tick
        self._series = LiveSeries()
        self._method: labserve.RunnerMethod | None = None
        self._clear = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="labserve-dashboard", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """True while the thread runs."""
        return self._thread.is_alive()

    def clear(self) -> None:
        """Empty the charts at the next tick (thread-safe)."""
        self._clear = True

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and join the thread. Idempotent; thread-safe (not from the pump itself)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        period = 1.0 / self.hz
        due = time.monotonic()
        while not self._stop.is_set():
            if not self._alive():
                break
            cpu = time.thread_time()
            try:
                self._tick()
            except Exception as exc:  # a bad tick must not end the dashboard
                self.last_error = exc
            self.cpu_s += time.thread_time() - cpu
            self.ticks += 1
            due += period
            delay = due - time.monotonic()
            if delay < 0:  # fell behind (a busy machine): skip, don't burst
                due = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)
        self._stop.set()

    def _tick(self) -> None:
        method = self._source()
        if method is not self._method or self._clear:
            self._method = method
            self._clear = False
            self._series = LiveSeries()
            with self.lock:
                self.charts.clear()
        snap = method.stats()
        tick, batches = self._series.update(snap)
        # The cost chart redraws whole: once a second is enough to watch the fit settle.
        refit = self.ticks % max(round(self.hz), 1) == 0
        recent = snap.recent_batches[-256:]
        with self.lock, one_patch_per_widget():
            self.charts.stream(tick, batches)
            if refit:
                self.charts.show_fit(
                    [float(b.items) for b in recent],
                    [b.duration_s * 1000.0 for b in recent],
                    snap.cost_fit.a_ms,
                    snap.cost_fit.b_ms,
                    float(snap.config.max_batch_size),
                )
        # The line of numbers is read, not watched: at most 5 updates a second.
        if self._on_tick is not None and self.ticks % max(round(self.hz / 5), 1) == 0:
            self._on_tick(snap)


@atexit.register
def _stop_all_pumps() -> None:
    with _OWNERS_LOCK:  # a running pump holds its document, so it is still a key here
        pumps = list(_OWNERS.values())
    for pump in pumps:
        pump.stop(timeout=1.0)


class _LiveBokehModel(ChartWidget):
    """A BokehModel whose state, when a page (re)loads it, is the document as it is now.

    jupyter_bokeh keeps the render bundle of the moment the widget was made; streamed rows
    reach open views as patches but not the saved state, so a reload would show old data.
    """

    _pump_lock: threading.RLock | None = None

    def get_state(self, key: Any = None) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state(key)
        if "render_bundle" in state and self._pump_lock is not None:
            with self._pump_lock:
                state["render_bundle"] = serialize_json(self._model_to_traits(self._model))
        return state


def _error_html(message: str) -> str:
    return f"<span style='color:#c00'>{html.escape(message)}</span>"


def _example_from_spec(method: labserve.RunnerMethod) -> Any:
    specs = method.spec.input_spec
    if not specs or len(specs) != 1 or any(d == -1 for d in specs[0].shape):
        return None
    shape = list(specs[0].shape)
    batch_dim = method.spec.batch_dim
    shape.insert(batch_dim if isinstance(batch_dim, int) else batch_dim[0], 1)
    return np.zeros(shape, dtype=specs[0].dtype)


class Dashboard:
    """Controls and live charts for the batchable methods of runners, or of a server's runners.

    ``target``: a Runner, a Server, a RunnerMethod, or a list of Runners. ``example``: one
    request, for the load controls (default: zeros from the method's ``input_spec`` if it
    declares one). ``hz``: snapshots per second. Display it (last line of a cell); each
    display is a fresh view of current data. ``close()`` stops its pump and load.

    >>> from labserve.widgets import Dashboard               # doctest: +SKIP
    >>> Dashboard(runner, example=np.ones((1, 4)))
    """

    def __init__(
        self,
        target: Any,
        *,
        example: Any = None,
        hz: float = 5.0,
        follow_s: float = 60.0,
    ) -> None:
        self._server: labserve.Server | None = None
        if isinstance(target, labserve.Server):
            self._server = target
            runners = list(target.runners.values())
        elif isinstance(target, labserve.Runner):
            runners = [target]
        elif isinstance(target, labserve.RunnerMethod):
            runners = [target.runner]
        elif isinstance(target, (list, tuple)) and all(
            isinstance(r, labserve.Runner) for r in target
        ):
            runners = list(target)
        else:
            raise TypeError(
                f"Dashboard needs a Runner, a Server, a RunnerMethod or a list of Runners, "
                f"got {type(target).__name__}"
            )
        self.methods: dict[str, labserve.RunnerMethod] = {
            f"{r.name}.{m.name}": m for r in runners for m in r.methods.values() if m.batchable
        }
        if not self.methods:
            raise ValueError("Dashboard found no batchable method to show")
        first = next(iter(self.methods))
        if isinstance(target, labserve.RunnerMethod):
            first = f"{target.runner.name}.{target.name}"
        self._example = example
        self._load: labserve.LoadRun | None = None
        self._load_ends = 0.0
        self._syncing = False
        self._views: list[_LiveBokehModel] = []

        self.charts = Charts(follow_s=follow_s)
        self.doc = Document()
        self.doc.add_root(self.charts.layout)
        self._build_controls(first)
        self.pump = Pump(
            self.charts,
            self.doc,
            lambda: self.method,
            hz=hz,
            alive=self._alive,
            on_tick=self._on_tick,
        )
        self._show_config(self.method.config)

    # -- what it shows ---------------------------------------------------------------------

    @property
    def method(self) -> labserve.RunnerMethod:
        """The method the controls and charts follow."""
        return self.methods[self.controls["method"].value]

    def _alive(self) -> bool:
        if self._server is not None and not self._server.running:
            return False
        return not self.method.runner.stopped

    def view(self) -> w.VBox:
        """A new view: the controls and a chart widget rendered from the data as it is now."""
        with self.pump.lock:
            charts = _LiveBokehModel(self.charts.layout)
            charts._pump_lock = self.pump.lock
        self._views.append(charts)
        return w.VBox([self.status, self.panel, charts])

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        load_bokehjs()
        bundle = self.view()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):  # the VBox's own text holds live numbers
            bundle["text/plain"] = repr(self)
        return bundle

    def save_html(self, path: str) -> None:
        """Write the charts as they are now to a standalone HTML file (BokehJS inline)."""
        from bokeh.embed import file_html
        from bokeh.resources import INLINE

        with self.pump.lock:
            page = file_html(self.charts.layout, INLINE, title=f"labserve · {self.method!r}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)

    def close(self) -> None:
        """Stop the load and the pump, close the widgets. Idempotent."""
        if self._load is not None:
            self._load.stop()
        self.pump.stop()
        for view in self._views:
            view.close()
        self._views.clear()

    def __repr__(self) -> str:
        state = "live" if self.pump.running else "stopped"
        return f"<Dashboard {self.controls['method'].value} ({state})>"

    # -- controls --------------------------------------------------------------------------

    def _build_controls(self, first: str) -> None:
        def layout() -> w.Layout:  # one each: hiding one control must not hide the others
            return w.Layout(width="330px")

        style = {"description_width": "110px"}
        c: dict[str, Any] = {}
        c["method"] = w.Dropdown(options=list(self.methods), value=first, description="method",
                                 layout=layout(), style=style)  # fmt: skip
        c["strategy"] = w.Dropdown(options=list(labserve.STRATEGIES), description="strategy",
                                   layout=layout(), style=style)  # fmt: skip
        c["max_batch_size"] = w.SelectionSlider(options=list(MAX_BATCH_SIZE_STEPS),
                                                description="max_batch_size", layout=layout(),
                                                style=style, continuous_update=False)  # fmt: skip
        c["max_batch_size_text"] = w.Text(layout=w.Layout(width="70px"), continuous_update=False)
        c["max_latency_ms"] = w.SelectionSlider(options=list(MAX_LATENCY_MS_STEPS),
                                                description="max_latency_ms", layout=layout(),
                                                style=style, continuous_update=False)  # fmt: skip
        c["max_latency_ms_text"] = w.Text(layout=w.Layout(width="70px"), continuous_update=False)
        c["on_overload"] = w.Dropdown(options=["reject", "wait"], description="on_overload",
                                      layout=layout(), style=style)  # fmt: skip
        c["reset"] = w.Button(description="reset statistics", icon="eraser")
        c["pattern"] = w.Dropdown(options=list(LOAD_PATTERNS), description="load",
                                  layout=layout(), style=style)  # fmt: skip
        c["rate"] = w.Text(value="500", description="rate (req/s)", layout=layout(), style=style,
                           continuous_update=False)  # fmt: skip
        c["concurrency"] = w.Text(value="16", description="clients", layout=layout(), style=style,
                                  continuous_update=False)  # fmt: skip
        c["duration"] = w.Text(value="60", description="duration (s)", layout=layout(),
                               style=style, continuous_update=False)  # fmt: skip
        c["start"] = w.ToggleButton(description="start load", icon="play", value=False)
        c["export_format"] = w.ToggleButtons(options=["labserve", "ray", "triton"],
                                             description="export", style=style)  # fmt: skip
        c["export"] = w.Textarea(layout=w.Layout(width="420px", height="150px"))
        self.controls = c
        self.errors = {k: w.HTML(layout=w.Layout(min_width="10px")) for k in
                       ("max_batch_size", "max_latency_ms", "config", "load")}  # fmt: skip
        self.status = w.HTML(value="<code>starting…</code>")

        c["method"].observe(self._on_method, names="value")
        for key in ("strategy", "max_batch_size", "max_latency_ms", "on_overload"):
            c[key].observe(lambda change, key=key: self._on_setting(key, change["new"]), "value")
        for key in ("max_batch_size", "max_latency_ms"):
            c[f"{key}_text"].observe(lambda ch, key=key: self._on_text(key, ch["new"]), "value")
        c["reset"].on_click(lambda _: self._on_reset())
        c["start"].observe(lambda ch: self._on_start(ch["new"]), "value")
        c["pattern"].observe(lambda _: self._show_load_fields(), "value")
        c["export_format"].observe(lambda _: self._show_export(), "value")
        self._show_load_fields()

        batching = w.VBox([
            c["method"],
            c["strategy"],
            w.HBox([c["max_batch_size"], c["max_batch_size_text"], self.errors["max_batch_size"]]),
            w.HBox([c["max_latency_ms"], c["max_latency_ms_text"], self.errors["max_latency_ms"]]),
            c["on_overload"],
            w.HBox([c["reset"], self.errors["config"]]),
        ])  # fmt: skip
        load = w.VBox([
            c["pattern"], c["rate"], c["concurrency"], c["duration"],
            w.HBox([c["start"], self.errors["load"]]),
        ])  # fmt: skip
        export = w.Accordion(children=[w.VBox([c["export_format"], c["export"]])])
        export.set_title(0, "export these settings: labserve/BentoML YAML, Ray Serve, Triton")
        self.panel = w.VBox([w.HBox([batching, load]), export])

    def _configure(self, error_key: str, **changes: Any) -> None:
        try:
            config = self.method.configure(**changes)
        except (labserve.ConfigError, ValueError, TypeError) as exc:
            self.errors[error_key].value = _error_html(str(exc))
            self._show_config(self.method.config)  # the controls show what is in force
            return
        self.errors[error_key].value = ""
        self._show_config(config)

    def _on_setting(self, key: str, value: Any) -> None:
        if self._syncing:
            return
        self._configure("config" if key in ("strategy", "on_overload") else key, **{key: value})

    def _on_text(self, key: str, text: str) -> None:
        if self._syncing:
            return
        try:
            value: Any = int(text) if key == "max_batch_size" else float(text)
        except ValueError:
            kind = "an integer" if key == "max_batch_size" else "a number"
            self.errors[key].value = _error_html(f"{key} must be {kind}, got {text!r}")
            self._show_config(self.method.config)
            return
        self._configure(key, **{key: value})

    def _show_config(self, config: labserve.BatchingConfig) -> None:
        """Set every control to the config in force, without acting on it."""
        c = self.controls
        self._syncing = True
        try:
            c["strategy"].value = config.strategy
            c["on_overload"].value = config.on_overload
            for key, steps in (
                ("max_batch_size", MAX_BATCH_SIZE_STEPS),
                ("max_latency_ms", MAX_LATENCY_MS_STEPS),
            ):
                value = getattr(config, key)
                c[key].value = min(steps, key=lambda s, v=value: abs(math.log1p(s) - math.log1p(v)))
                c[f"{key}_text"].value = f"{value:g}"
        finally:
            self._syncing = False
        self._show_export()

    def _show_export(self) -> None:
        fmt = self.controls["export_format"].value
        try:
            text = labserve.export_config(self.method, fmt=fmt)
        except Exception as exc:  # export must never break the controls
            text = f"# could not export: {exc}"
        self.controls["export"].value = text

    def _on_method(self, change: dict[str, Any]) -> None:
        self._stop_load()
        self._show_config(self.method.config)
        self.pump.clear()

    def _on_reset(self) -> None:
        self.method.reset_stats()
        self.pump.clear()

    # -- load ------------------------------------------------------------------------------

    def _show_load_fields(self) -> None:
        closed = self.controls["pattern"].value == "closed loop"
        self.controls["rate"].layout.display = "none" if closed else None
        self.controls["concurrency"].layout.display = None if closed else "none"

    def _arrivals(self, pattern: str, rate: float, duration: float) -> labserve.Arrivals:
        if pattern == "step":  # a quarter of the rate, the rate, a quarter again, in thirds
            third = duration / 3
            return labserve.arrivals(
                "step", rates=[(0, rate / 4), (third, rate), (2 * third, rate / 4)]
            )
        if pattern == "burst":  # a quarter of the rate, with 1 s bursts at twice it every 5 s
            return labserve.arrivals(
                "burst", base_rps=rate / 4, burst_rps=2 * rate, every_s=5.0, length_s=1.0
            )
        return labserve.arrivals(pattern, rate_rps=rate)

    def _on_start(self, on: bool) -> None:
        if self._syncing:
            return
        if not on:
            self._stop_load()
            return
        c = self.controls
        example = self._example if self._example is not None else _example_from_spec(self.method)
        try:
            if example is None:
                raise ValueError(
                    "no example request: pass Dashboard(..., example=x), or declare the "
                    "method's input_spec"
                )
            duration = float(c["duration"].value)
            kwargs: dict[str, Any] = {"example": example, "duration_s": duration}
            if c["pattern"].value == "closed loop":
                text = c["concurrency"].value
                if not text.strip().isdigit():
                    raise ValueError(f"clients must be an integer >= 1, got {text!r}")
                kwargs["concurrency"] = int(text)
            else:
                kwargs["arrivals"] = self._arrivals(
                    c["pattern"].value, float(c["rate"].value), duration
                )
            self._load = labserve.start_load(self.method, **kwargs)
        except (ValueError, TypeError, labserve.LabServeError) as exc:
            self.errors["load"].value = _error_html(str(exc))
            self._set_start(False)
            return
        self.errors["load"].value = ""
        self._load_ends = time.monotonic() + duration
        c["start"].description, c["start"].icon = "stop load", "stop"

    def _stop_load(self) -> None:
        if self._load is not None:
            self._load.stop()
            self._load = None
        self._set_start(False)

    def _set_start(self, on: bool) -> None:
        c = self.controls["start"]
        self._syncing = True
        try:
            c.value = on
            c.description, c.icon = ("stop load", "stop") if on else ("start load", "play")
        finally:
            self._syncing = False

    def _on_tick(self, snap: labserve.Snapshot) -> None:
        """On the pump thread: the line of numbers, and the load button when a run ends."""
        load = ""
        if self._load is not None:
            if self._load.running and time.monotonic() < self._load_ends + 1:
                left = max(self._load_ends - time.monotonic(), 0.0)
                load = f" · load {self._load.sent:,} sent, {left:.0f} s left"
            else:
                self._load = None
                self._set_start(False)
        lat = snap.latency_ms_window
        total = snap.served + snap.rejected + snap.failed
        rejected = 100.0 * snap.rejected / total if total else 0.0
        cfg = snap.config

        def ms(x: float) -> str:
            return f"{x:.1f} ms" if math.isfinite(x) else "-"

        mean = f"{snap.mean_batch_size:.1f}" if math.isfinite(snap.mean_batch_size) else "-"
        self.status.value = (
            f"<code><b>{html.escape(snap.runner)}.{html.escape(snap.method)}</b> · "
            f"{snap.served_rate:,.0f} req/s served · mean batch {mean} · "
            f"p50 {ms(lat.p50)} · p99 {ms(lat.p99)} · queue {snap.queue_requests} · "
            f"rejected {rejected:.1f}% · {cfg.strategy}, max_batch_size="
            f"{cfg.max_batch_size}, max_latency_ms={cfg.max_latency_ms:g}{load}</code>"
        )
