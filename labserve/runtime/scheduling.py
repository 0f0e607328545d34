"""Where a driver's callbacks, timers and model calls run, and what time it is.

:class:`~labserve.runtime.driver.MethodDriver` reads the time, arms timers, hands work to
its loop and runs synchronous models only through a :class:`Host` (named apart from the
generation step planner, :class:`labserve.generation.scheduler.Scheduler`). In a notebook
that is :class:`LoopHost` (labserve's background asyncio loop, its worker threads and the
runner's monotonic clock); in tests it is
:class:`~labserve.runtime.virtual.VirtualHost`, which steps the same driver code on
virtual time. Because the timers are injected, a deterministic test reaches them: a
runner's clock alone would not.

Each of the driver's timers is one :class:`Timer` (its handle and its due time together),
set and cancelled only through itself, so that no timer can disarm another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from labserve.base.clock import Clock
from labserve.runtime.loop import BackgroundLoop

__all__ = ["MIN_TIMER_S", "Cancellable", "Host", "LoopHost", "Timer"]

MIN_TIMER_S = 0.001
"""One timer tick. Event loops wait in whole milliseconds: asyncio rounds a wait up to the next
one, uvloop fires a shorter timer at once (early). A hold's timer is armed a tick before its
time; a timer re-armed after an early wake waits at least a tick, so that an early timer does
not poll the queue again and again until its time comes, spinning the loop (and taking the GIL
from the model)."""


class Cancellable(Protocol):
    """A scheduled callback that can be called off (an ``asyncio.TimerHandle``)."""

    def cancel(self) -> None:
        """Call it off; no effect once it ran."""


class Host(Protocol):
    """The driver's view of its event loop, its worker threads and its clock.

    ``call_soon``, ``call_later`` and ``now`` are called on the loop thread only;
    ``call_soon_threadsafe`` and ``submit`` from any thread.
    """

    loop: asyncio.AbstractEventLoop | None
    """The asyncio loop whose futures the loop thread settles itself (None: there is none,
    every caller's handle is a concurrent future)."""

    @property
    def closing(self) -> bool:
        """True while the loop is stopping: nothing new may start on it."""

    def now(self) -> float:
        """The driver's time in seconds (monotonic; the same clock as the queue's)."""

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop at its next iteration. Loop-only."""

    def call_soon_threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon. Any thread; RuntimeError once it is closed."""

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Cancellable:
        """Run ``fn()`` on the loop ``delay_s`` seconds from now. Loop-only."""

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` in a worker thread. Any thread; RuntimeError once shut down."""


class LoopHost:
    """labserve's background loop, its worker threads and a monotonic clock.

    The clock must agree with the loop's timers (both monotonic, in seconds).
    """

    def __init__(self, bg: BackgroundLoop, clock: Clock) -> None:
        self._bg = bg
        # Captured once: a late worker must not restart a loop that was stopped.
        self._loop = bg.loop
        self.loop: asyncio.AbstractEventLoop | None = self._loop
        self._executor = bg.executor
        self.now = clock.now

    @property
    def closing(self) -> bool:
        """True while the background loop is stopping."""
        return self._bg.closing

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Next loop iteration. Loop-only."""
        self._loop.call_soon(fn, *args)

    def call_soon_threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        """From any thread; RuntimeError once the loop is closed."""
        self._loop.call_soon_threadsafe(fn, *args)

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Cancellable:
        """A loop timer. Loop-only."""
        return self._loop.call_later(delay_s, fn)

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """A worker thread of the background loop's pool; RuntimeError once it is shut down."""
        self._executor.submit(fn, *args)


class Timer:
    """One timer: its handle and its due time, set and cancelled only through itself.

    Loop-only. ``callback(due_s)`` runs when the timer fires, with the time it was set for.
    Event loops wake in the tick of a timer's time, not at it (asyncio up to a millisecond
    after, uvloop up to one before), so a timer with a ``lead_s`` is armed that much early
    and counts as come once within ``lead_s`` of its due time; one without fires at its time
    or after. Woken earlier than that, it re-arms itself for the rest; set again for the
    time it last fired for (the early wake did not settle what it was for), it waits that
    time out. A re-armed timer waits at least :data:`MIN_TIMER_S`: a loop that fires short
    timers at once (uvloop) then wakes it early at most once more, instead of spinning.

    >>> wake = Timer(scheduler, on_wake, lead_s=MIN_TIMER_S)  # doctest: +SKIP
    >>> wake.set(now + 0.020, now)  # doctest: +SKIP
    """

    __slots__ = ("_callback", "_fired_s", "_handle", "_lead_s", "_scheduler", "due_s")

    def __init__(
        self, scheduler: Host, callback: Callable[[float], None], *, lead_s: float = 0.0
    ) -> None:
        self._scheduler = scheduler
        self._callback = callback
        self._lead_s = lead_s
        self._handle: Cancellable | None = None
        self._fired_s: float | None = None
        self.due_s: float | None = None
        """When it is due next (None: not armed)."""

    def set(self, due_s: float | None, now: float) -> None:
        """Arm it for ``due_s`` (None disarms it); no change if it is already set for then."""
        if due_s == self.due_s:
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.due_s = due_s
        if due_s is None:
            return
        if due_s == self._fired_s:  # an early wake did not settle it: wait the time out
            self._arm(max(due_s - now, MIN_TIMER_S))
        else:
            self._arm(max(due_s - now - self._lead_s, 0.0))

    def cancel(self) -> None:
        """Disarm it."""
        self.set(None, 0.0)

    def _arm(self, delay_s: float) -> None:
        self._handle = self._scheduler.call_later(delay_s, self._fire)

    def _fire(self) -> None:
        due_s = self.due_s
        assert due_s is not None  # a fired handle was armed, and cancelling drops it
        early_s = due_s - self._scheduler.now()
        lead_s = self._lead_s if due_s != self._fired_s else 0.0
        if early_s > lead_s + _SLACK_S:  # woken too early (uvloop's cached clock)
            self._arm(max(early_s - lead_s, MIN_TIMER_S))
            return
        self._handle = None
        self.due_s = None
        self._fired_s = due_s
        self._callback(due_s)


_SLACK_S = 1e-9
"""Rounding in ``now + delay``: a timer this close to its time has come."""
