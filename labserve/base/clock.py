"""Time, injected: a monotonic real clock and a virtual clock for simulation.

The batching core never reads the time itself; its drivers pass ``now`` in. Times are
seconds (floats) on an arbitrary monotonic origin.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "MonotonicClock", "SimClock"]


class Clock(Protocol):
    """Anything with a monotonic ``now()`` in seconds."""

    def now(self) -> float:
        """Return the current time in seconds; never decreases."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic``, the clock asyncio's own loop uses too.

    uvloop's ``loop.time()`` is libuv's (whole milliseconds, read once per loop iteration):
    compare times from this clock with each other, not with a loop's.
    """

    def now(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()


class SimClock:
    """A virtual clock that moves only when told to, and never backwards.

    >>> c = SimClock()
    >>> c.advance_to(1.5); c.now()
    1.5
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def now(self) -> float:
        """Return the virtual time in seconds."""
        return self._now

    def advance_to(self, t_s: float) -> None:
        """Move the clock to ``t_s``; raises ValueError if that is in the past."""
        if t_s < self._now:
            raise ValueError(f"SimClock cannot go backwards: now={self._now!r}, asked {t_s!r}")
        self._now = t_s

    def advance(self, dt_s: float) -> None:
        """Move the clock forward by ``dt_s >= 0`` seconds."""
        self.advance_to(self._now + dt_s)
