"""The thread every dashboard pump runs on: the one writer of its charts' Bokeh document.

:class:`Ticker` owns the thread, its pace, the lock held while the document is written, the
rule that a document has one writer, the count and record of failed ticks, and the stop at
interpreter exit. :class:`~labserve.widgets.pump_base.PumpBase` subclasses it with the
tick both dashboards' pumps share (view, rows, charts), and each pump with what differs
(:class:`~labserve.widgets.pump.Pump` for batchable methods,
:class:`~labserve.widgets.generation.pump.GenerationPump` for generative ones).
"""

from __future__ import annotations

import atexit
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from bokeh.document import Document

__all__ = ["Ticker"]

V = TypeVar("V")

_OWNERS: weakref.WeakKeyDictionary[Document, Ticker[object]] = weakref.WeakKeyDictionary()
_OWNERS_LOCK = threading.Lock()


class Ticker(Generic[V]):
    """One thread that runs :meth:`_tick` ``hz`` times a second, the only writer of ``doc``.

    A second running ticker on the same document raises ``RuntimeError``. :attr:`lock` is
    held while a tick writes; hold it to read the document consistently from another thread
    (pass it to a ChartWidget showing the document). A tick that fails is counted and kept
    in :attr:`last_error` (the ticker goes on). Stops on :meth:`stop`, when ``alive()``
    turns false, or at interpreter exit.

    ``on_tick(view)`` runs on the thread after each tick (or failed tick), at most 5 times a
    second, with :attr:`view` (None before the first). Thread-safety: :meth:`stop` may be
    called from any thread; the rest is read-only from outside. ``start=False`` leaves the
    thread to :meth:`start`, for an owner whose ``on_tick`` needs the ticker itself.
    """

    def __init__(
        self,
        doc: Document,
        *,
        hz: float = 5.0,
        alive: Callable[[], bool] = lambda: True,
        on_tick: Callable[[V | None], None] | None = None,
        start: bool = True,
        name: str = "labserve-dashboard",
    ) -> None:
        if not (isinstance(hz, (int, float)) and math.isfinite(hz) and 0 < hz <= 60):
            raise ValueError(f"hz must be a number in (0, 60], got {hz!r}")
        with _OWNERS_LOCK:
            owner = _OWNERS.get(doc)
            if owner is not None and owner.running:
                raise RuntimeError("this Bokeh document already has a pump writing to it")
            _OWNERS[doc] = self  # type: ignore[assignment]
        self.doc = doc
        self.hz = float(hz)
        self.lock = threading.RLock()
        self.ticks = 0
        """Ticks done."""
        self.cpu_s = 0.0
        """CPU time the thread spent on its ticks, seconds."""
        self.errors = 0
        """Ticks that raised."""
        self.last_error: BaseException | None = None
        """The last exception a tick raised (None if none did)."""
        self.last_error_at = math.nan
        """When it was raised (``time.monotonic()``), NaN if never."""
        self.view: V | None = None
        """The last view pulled (None before the first)."""
        self._alive = alive
        self._on_tick = on_tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start the thread (when made with ``start=False``: its owner was not ready yet)."""
        self._thread.start()

    @property
    def running(self) -> bool:
        """True while the thread runs."""
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and join the thread. Idempotent; thread-safe (not from the thread itself)."""
        self._stop.set()
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(timeout)

    def _tick(self) -> None:
        """Pull and write one tick (on the thread). Subclasses define it."""
        raise NotImplementedError

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

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error, self.last_error_at = exc, time.monotonic()


@atexit.register
def _stop_all() -> None:
    with _OWNERS_LOCK:  # a running ticker holds its document, so it is still a key here
        tickers = list(_OWNERS.values())
    for ticker in tickers:
        ticker.stop(timeout=1.0)
