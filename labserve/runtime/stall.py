"""Loop stalls: an ``async def`` model that blocks labserve's loop (``time.sleep``, CPU work).

The loop then serves nothing else (no arrivals, no timers, no HTTP) until the model yields.
Like asyncio's debug mode (``slow_callback_duration``), but always on and cheap: each step of
the model's coroutine is timed, and the first step longer than the threshold is reported
once per method on the ``labserve.runtime`` logger, naming the method.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Generator
from typing import Any

__all__ = ["STALL_S", "StallWatch"]

STALL_S = 0.1
"""A single step of an async model longer than this (seconds) is a stall worth a warning."""

_log = logging.getLogger("labserve.runtime")


class StallWatch:
    """Times the steps of one method's async model calls; warns once per method.

    Loop-only, like the calls it times.
    """

    def __init__(self, label: str, threshold_s: float = STALL_S) -> None:
        self.label = label
        self.threshold_s = threshold_s
        self.worst_s = 0.0
        """The longest single step seen (seconds)."""
        self.warned = False

    def timed(self, awaitable: Awaitable[Any]) -> Awaitable[Any]:
        """``awaitable``, with each step it runs on the loop timed: ``await watch.timed(c)``."""
        return _Timed(self, awaitable)

    def seen(self, step_s: float) -> None:
        """One step of a model call took ``step_s`` seconds."""
        if step_s > self.worst_s:
            self.worst_s = step_s
        if step_s > self.threshold_s and not self.warned:
            self.warned = True
            _log.warning(
                "%s: the async model blocked labserve's event loop for %.0f ms in one step "
                "(time.sleep or CPU work inside `async def`?); every request, timer and HTTP "
                "reply waited meanwhile. Await instead (asyncio.sleep, an async client), or "
                "make it a plain `def` so that it runs in a worker thread.",
                self.label,
                step_s * 1000.0,
            )


class _Timed:
    """An awaitable that steps another one, timing each step (what ``await`` would run)."""

    __slots__ = ("_awaitable", "_watch")

    def __init__(self, watch: StallWatch, awaitable: Awaitable[Any]) -> None:
        self._watch = watch
        self._awaitable = awaitable

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self._awaitable.__await__()
        seen = self._watch.seen
        value: Any = None
        error: BaseException | None = None
        while True:
            start = time.perf_counter()
            try:
                yielded = steps.send(value) if error is None else steps.throw(error)
            except StopIteration as done:
                seen(time.perf_counter() - start)
                return done.value
            except BaseException:
                seen(time.perf_counter() - start)
                raise
            seen(time.perf_counter() - start)
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # thrown in by the loop (cancellation): pass it on
                value, error = None, exc
