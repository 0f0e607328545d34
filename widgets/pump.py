"""The pump: the one thread that pulls a method's snapshots and streams them into charts.

Nothing here is on the request path: the runner records, and the pump pulls views from the
method's source (a runner here, a server by URL, a Ray application's replicas) on its own
thread and is the only writer of the charts' Bokeh document (two writers corrupt BokehJS's
message stream).
"""

from __future__ import annotations

import atexit
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from bokeh.document import Document

import labserve

from .charts import Charts
from .chartwidget import one_patch_per_widget
from .series import LiveSeries, Recent
from .tokens import TokenSeries, TokensRecent

__all__ = ["Pump"]

_OWNERS: weakref.WeakKeyDictionary[Document, Pump] = weakref.WeakKeyDictionary()
_OWNERS_LOCK = threading.Lock()


class Pump:
    """One thread that pulls a view ``hz`` times a second and streams it into ``charts``.

    ``source()`` returns the method to watch: a ``labserve.MethodSource``, or a
    ``RunnerMethod`` (watched through a ``labserve.RunnerSource``).

    It is the only writer of the charts' document: a second pump on the same document
    raises ``RuntimeError``. :attr:`lock` is held while it writes; hold it to read the
    document consistently from another thread (pass it to a ChartWidget showing the
    document). A tick that fails is counted and kept in :attr:`last_error` (the pump goes
    on). Stops on :meth:`stop`, when ``alive()`` turns false, or at interpreter exit.

    ``on_tick(view)`` runs on the pump thread after the charts are written (or failed to
    be), at most 5 times a second, with the last ``labserve.SourceView`` pulled (None
    before the first). Thread-safety: :meth:`clear` and :meth:`stop` may be called from any thread;
    the rest is read-only from outside. ``start=False`` leaves the thread to :meth:`start`,
    for an owner whose ``on_tick`` needs the pump itself.
    """

    def __init__(
        self,
        charts: Charts,
        doc: Document,
        source: Callable[[], labserve.MethodSource | labserve.RunnerMethod],
        *,
        hz: float = 5.0,
        alive: Callable[[], bool] = lambda: True,
        on_tick: Callable[[labserve.SourceView | None], None] | None = None,
        start: bool = True,
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
        self.errors = 0
        """Ticks that raised."""
        self.last_error: BaseException | None = None
        """The last exception a tick raised (None if none did)."""
        self.last_error_at = math.nan
        """When it was raised (``time.monotonic()``), NaN if never."""
        self.view: labserve.SourceView | None = None
        """The last view pulled (None before the first)."""
        self._source = source
        self._alive = alive
        self._on_tick = on_tick
        self._series = LiveSeries()
        self._tokens = TokenSeries()
        self._method: Any = None
        self._watched: labserve.MethodSource | None = None
        self._clear = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="labserve-dashboard", daemon=True)
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start the thread (when made with ``start=False``: its owner was not ready yet)."""
        self._thread.start()

    @property
    def recent(self) -> Recent | None:
        """What moved over the last second (rates, mean batch, rejected %, model busy %)."""
        return self._series.recent

    @property
    def tokens(self) -> TokensRecent | None:
        """The last second's batches in tokens: per batch, and how much was padding."""
        return self._tokens.recent

    @property
    def snapshot(self) -> labserve.Snapshot | None:
        """The last snapshot pulled (None before the first)."""
        view = self.view
        return None if view is None else view.snapshot

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
            except Exception as exc:  # a bad tick must not end the dashboard: it is shown
                self._failed(exc)
            # The line of numbers is read, not watched: at most 5 updates a second. It runs
            # after a failed tick too, so that it can say so.
            if self._on_tick is not None and self.ticks % max(round(self.hz / 5), 1) == 0:
                try:
                    self._on_tick(self.view)
                except Exception as exc:
                    self._failed(exc)
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
        watched = self._watched
        if method is not self._method or self._clear or watched is None:
            self._method = method
            watched = self._watched = (
                labserve.RunnerSource(method)
                if isinstance(method, labserve.RunnerMethod)
                else method
            )
            self._clear = False
            self._series = LiveSeries()
            self._tokens = TokenSeries()
            self.view = None
            with self.lock:
                self.charts.clear()
        view = self.view = watched.view()
        snap = view.snapshot
        tick = self._series.update(snap)
        tick.update(self._tokens.update(snap))
        # The cost chart redraws whole: once a second is enough to watch the fit settle.
        refit = self.ticks % max(round(self.hz), 1) == 0
        recent = snap.recent_batches[-256:]
        with self.lock, one_patch_per_widget():
            self.charts.stream(tick)
            self.charts.set_latency_window(snap.window_s)
            if refit:
                self.charts.show_fit(
                    [float(b.items) for b in recent],
                    [b.duration_s * 1000.0 for b in recent],
                    snap.cost_fit.a_ms,
                    snap.cost_fit.b_ms,
                    float(snap.config.max_batch_size),
                )

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error, self.last_error_at = exc, time.monotonic()


@atexit.register
def _stop_all_pumps() -> None:
    with _OWNERS_LOCK:  # a running pump holds its document, so it is still a key here
        pumps = list(_OWNERS.values())
    for pump in pumps:
        pump.stop(timeout=1.0)
