"""A :class:`~labserve.runtime.scheduling.Host` on virtual time: the real driver, stepped.

For deterministic tests of :class:`~labserve.runtime.driver.MethodDriver`, the code that runs
in a notebook. The calling thread plays the event loop: callbacks and timers queue here and
run only when the test steps (:meth:`VirtualHost.settle`, :meth:`VirtualHost.advance`),
in the order asyncio would run them. Synchronous model calls run in real worker threads, one
per job, so that a model can hang: a test's model calls :meth:`VirtualHost.park` and
waits there until the test releases that call (:meth:`VirtualHost.release`). Every step
ends only once each worker is parked or finished and no callback is ready, so what happens
next depends only on the test's steps, never on how threads were scheduled.

>>> sched = VirtualHost()
>>> driver = MethodDriver(queue, sched.park, is_async=False, scheduler=sched)  # doctest: +SKIP
>>> driver.submit(request); sched.settle()  # doctest: +SKIP
>>> sched.release(sched.parked[0], value=outputs)  # doctest: +SKIP
>>> sched.advance(0.020)  # doctest: +SKIP
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from labserve.base.clock import SimClock

__all__ = ["Parked", "VirtualHost"]

_MAX_TIMERS_PER_ADVANCE = 100_000  # more is a timer re-arming itself forever: a bug

_ROUNDING: dict[str, Callable[[float], float]] = {
    "exact": lambda delay_s: delay_s,
    # asyncio waits for I/O in whole milliseconds, rounded up, from a moment just after the
    # timer was armed: it fires on the next whole millisecond of its delay, up to a tick late.
    "late": lambda delay_s: (math.floor(delay_s * 1000.0 + 1e-6) + 1) / 1000.0,
    # uvloop reads its clock once an iteration: a timer armed late in one fires early.
    "early": lambda delay_s: delay_s - min(0.0009, delay_s / 2.0),
}
"""How a loop's timer turns a delay into when it fires (see VirtualHost's ``timers``)."""


class Parked:
    """One model call waiting in :meth:`VirtualHost.park` until the test releases it."""

    __slots__ = ("_done", "_error", "_value", "args")

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args
        """What the model was called with."""
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None


class _Handle:
    """A virtual ``call_later`` handle."""

    __slots__ = ("cancelled", "fn", "when_s")

    def __init__(self, when_s: float, fn: Callable[[], None]) -> None:
        self.when_s = when_s
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        """Call it off."""
        self.cancelled = True


class VirtualHost:
    """Virtual time, a loop played by the calling thread, and worker threads that park.

    ``timers`` says when a timer fires: ``"exact"`` at its time; ``"late"`` on the next whole
    millisecond after its delay, as asyncio's do (it waits for I/O in whole milliseconds,
    rounded up); ``"early"`` up to
    0.9 ms before it (never sooner than half its delay), as uvloop's may (it reads its clock
    once per loop iteration).

    Not thread-safe but where the Host protocol asks (``call_soon_threadsafe``,
    ``submit``, and :meth:`park` from workers). ``settle_timeout_s`` bounds, in real time,
    how long a step waits for workers to park or finish; past it RuntimeError says the
    driver never settled (a deadlock is a bug found). Errors that escape a worker job are
    kept in :attr:`errors`, for the test to assert there are none.
    """

    loop = None

    def __init__(
        self,
        start_s: float = 0.0,
        *,
        timers: Literal["exact", "late", "early"] = "exact",
        settle_timeout_s: float = 10.0,
    ) -> None:
        if timers not in _ROUNDING:
            raise ValueError(f"timers must be one of {sorted(_ROUNDING)}, got {timers!r}")
        self._round = _ROUNDING[timers]
        self.clock = SimClock(start_s)
        self.settle_timeout_s = settle_timeout_s
        self.errors: list[BaseException] = []
        """Exceptions that escaped a worker job (the driver's own bugs)."""
        self.parked: list[Parked] = []
        """Model calls waiting for the test, oldest first."""
        self._ready: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._timers: list[tuple[float, int, _Handle]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._active = 0  # worker jobs submitted and not finished
        self._shut = False

    # -- the Host protocol -----------------------------------------------------------

    @property
    def closing(self) -> bool:
        """True once :meth:`shutdown` was called."""
        return self._shut

    def now(self) -> float:
        """Virtual time, in seconds."""
        return self.clock.now()

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue ``fn(*args)`` for the loop."""
        with self._cond:
            self._ready.append((fn, args))

    def call_soon_threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue ``fn(*args)`` for the loop, from any thread; RuntimeError once shut down."""
        with self._cond:
            if self._shut:
                raise RuntimeError("the virtual loop is closed")
            self._ready.append((fn, args))
            self._cond.notify_all()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> _Handle:
        """Run ``fn()`` once virtual time has advanced ``delay_s``."""
        handle = _Handle(self.clock.now() + self._round(max(delay_s, 0.0)), fn)
        heapq.heappush(self._timers, (handle.when_s, next(self._order), handle))
        return handle

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` in a new worker thread; RuntimeError once shut down."""
        with self._cond:
            if self._shut:
                raise RuntimeError("the virtual worker pool is shut down")
            self._active += 1
        threading.Thread(target=self._job, args=(fn, args), daemon=True).start()

    def _job(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # the driver's own bug: the test asserts there is none
            self.errors.append(exc)
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    # -- the model's side (worker threads) -------------------------------------------------

    def park(self, *args: Any) -> Any:
        """Wait, in a worker thread, until the test releases this call; then return or raise.

        Use it as (or inside) a synchronous model function.
        """
        call = Parked(args)
        with self._cond:
            self.parked.append(call)
            self._cond.notify_all()
        call._done.wait()
        if call._error is not None:
            raise call._error
        return call._value

    # -- the test's side --------------------------------------------------------------------

    def release(self, call: Parked, value: Any = None, error: BaseException | None = None) -> None:
        """Let a parked model call return ``value`` (or raise ``error``), then settle."""
        with self._cond:
            self.parked.remove(call)  # before it wakes: settle must wait for it again
        call._value, call._error = value, error
        call._done.set()
        self.settle()

    def settle(self) -> None:
        """Run ready callbacks, one at a time, each once every worker is parked or finished."""
        deadline = time.monotonic() + self.settle_timeout_s
        while True:
            with self._cond:
                while self._active > len(self.parked):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RuntimeError(
                            f"virtual scheduler: {self._active - len(self.parked)} worker "
                            f"job(s) neither parked nor finished in {self.settle_timeout_s} s"
                        )
                    self._cond.wait(left)
                if not self._ready:
                    return
                fn, args = self._ready.popleft()
            fn(*args)

    def advance(self, dt_s: float) -> None:
        """Advance virtual time by ``dt_s``, firing each timer at its time, settling after each."""
        target = self.clock.now() + dt_s
        self.settle()
        for _ in range(_MAX_TIMERS_PER_ADVANCE):
            if not self._timers or self._timers[0][0] > target:
                break
            when_s, _, handle = heapq.heappop(self._timers)
            if handle.cancelled:
                continue
            self.clock.advance_to(max(when_s, self.clock.now()))
            handle.fn()
            self.settle()
        else:
            raise RuntimeError(f"virtual scheduler: over {_MAX_TIMERS_PER_ADVANCE} timers fired")
        self.clock.advance_to(target)
        self.settle()

    def shutdown(self) -> None:
        """Refuse new callbacks and worker jobs (the loop is closing); settle what is there."""
        self.settle()
        with self._cond:
            self._shut = True
