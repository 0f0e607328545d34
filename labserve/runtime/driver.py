"""The asyncio driver: runs one BatchQueue on the background loop.

It feeds the queue events (arrivals, batch completions, its one timer) and carries out
the queue's decisions (run a batch, reject a request, set the timer). There is no
polling tick. Everything here is loop-only except :meth:`MethodDriver.submit_threadsafe`,
:meth:`MethodDriver.cancel_threadsafe` and :meth:`MethodDriver.snapshot`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Callable
from typing import Any

from labserve.batching.queue import Batch, BatchQueue, Outcome, Request
from labserve.clock import Clock, MonotonicClock
from labserve.config import BatchingConfig
from labserve.errors import BatchSizeMismatchError, LabServeError
from labserve.metrics.snapshot import Snapshot
from labserve.runtime.loop import BackgroundLoop

__all__ = ["MethodDriver"]

AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


def _settle(handle: AnyFuture, value: Any, error: BaseException | None) -> None:
    """Hand an outcome to the caller's future unless the caller already gave up."""
    if handle.done():
        return
    try:
        if error is None:
            handle.set_result(value)
        else:
            handle.set_exception(error)
    except (asyncio.InvalidStateError, concurrent.futures.InvalidStateError):
        pass  # cancelled by its (other-thread) caller between done() and here


class MethodDriver:
    """Drives one method's BatchQueue on a BackgroundLoop, with a model function."""

    def __init__(
        self,
        queue: BatchQueue,
        fn: Callable[..., Any],
        *,
        is_async: bool,
        bg: BackgroundLoop,
        clock: Clock | None = None,
    ) -> None:
        self.queue = queue
        self._fn = fn
        self._is_async = is_async
        self._bg = bg
        self._clock = clock or MonotonicClock()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: asyncio.Event | None = None
        # Arrivals from other threads wait here; one loop callback admits all that came.
        self._inbox: deque[Request] = deque()
        self._inbox_scheduled = False
        self._pump_scheduled = False

    # -- thread-safe doors --------------------------------------------------------------

    def submit_threadsafe(self, request: Request) -> None:
        """Admit ``request`` (its handle a concurrent Future) from any thread.

        Requests arriving together from many threads cost the loop one wake-up, not one
        each. The flag is cleared before the inbox is emptied, so an arrival racing with
        the drain either is drained or schedules a new one: none is left behind.
        """
        self._inbox.append(request)
        if not self._inbox_scheduled:
            self._inbox_scheduled = True
            self._bg.call_soon(self._drain_inbox)

    def cancel_threadsafe(self, request: Request) -> None:
        """Withdraw ``request`` from any thread."""
        self._bg.call_soon(self.cancel, request)

    def snapshot(self) -> Snapshot:
        """A snapshot taken on the loop thread (consistent). Thread-safe; blocks briefly."""
        return self._bg.call(lambda: self.queue.snapshot(self._clock.now()))

    def configure(self, config: BatchingConfig) -> None:
        """Apply ``config`` at the next batch boundary. Thread-safe; returns once queued."""
        self._bg.call(self._configure, config)

    # -- loop-only -----------------------------------------------------------------------

    def _configure(self, config: BatchingConfig) -> None:
        self.queue.configure(config)
        self._pump()

    def _drain_inbox(self) -> None:
        self._inbox_scheduled = False
        inbox = self._inbox
        while inbox:
            self._admit(inbox.popleft())
        self._schedule_pump()

    def submit(self, request: Request) -> None:
        """Admit a request; a refusal is set on its handle. Loop-only.

        The decision runs once per loop iteration, after every arrival of that iteration
        (a burst of callers is seen whole, and costs one decision).
        """
        self._admit(request)
        self._schedule_pump()

    def _admit(self, request: Request) -> None:
        try:
            self.queue.admit(request, self._clock.now())
        except LabServeError as exc:
            _settle(request.handle, None, exc)

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._bg.loop.call_soon(self._pump)

    def cancel(self, request: Request) -> None:
        """Withdraw a request whose caller gave up. Loop-only."""
        if self.queue.cancel(request, self._clock.now()):
            self._pump()

    def _pump(self) -> None:
        self._pump_scheduled = False
        now = self._clock.now()
        step = self.queue.poll(now)
        for r, value, error in step.rejected:
            _settle(r.handle, value, error)
        for batch in step.fire:
            self._launch(batch)
        self._set_timer(step.wake_s, now)
        if self._idle is not None and self.queue.idle:
            self._idle.set()

    def _set_timer(self, wake_s: float | None, now: float) -> None:
        if wake_s == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = wake_s
        if wake_s is not None:
            self._timer = self._bg.loop.call_later(max(wake_s - now, 0.0), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._pump()

    def _launch(self, batch: Batch) -> None:
        if self._is_async:
            task = asyncio.ensure_future(self._run_async(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        # Straight to the pool and one callback back: run_in_executor's future chaining
        # would cost the loop an extra iteration per batch.
        self._bg.executor.submit(self._work_and_report, batch, self._bg.loop)

    def _work_and_report(self, batch: Batch, loop: asyncio.AbstractEventLoop) -> None:
        """Worker thread: run the batch, then hand the outcome to the loop."""
        parts: list[Any] | None = None
        error: BaseException | None = None
        try:
            parts = self._work(batch)
        except BaseException as exc:  # handed to the loop, which gives it to the callers
            error = exc
        loop.call_soon_threadsafe(self._finished, batch, parts, error)

    def _work(self, batch: Batch) -> list[Any]:
        """Worker thread: stack, call the model, split. Pure with respect to the queue."""
        codec = self.queue.codec
        output = self._fn(*batch.stack(codec))
        return self._split(batch, output)

    def _split(self, batch: Batch, output: Any) -> list[Any]:
        codec = self.queue.codec
        try:
            returned = codec.output_items(output)
        except LabServeError as exc:
            raise BatchSizeMismatchError(self.queue.name, batch.items, -1) from exc
        if returned != batch.items:
            raise BatchSizeMismatchError(self.queue.name, batch.items, returned)
        return codec.split(output, batch.counts)

    def _finished(self, batch: Batch, parts: list[Any] | None, exc: BaseException | None) -> None:
        if exc is None:
            assert parts is not None
            try:
                outcomes = self.queue.complete(batch, parts, self._now())
            except Exception as bug:  # e.g. parts that will not rejoin: callers must still hear
                outcomes = self.queue.fail(batch, bug, self._now())
            self._outcomes(outcomes)
            self._release(batch, ok=True)
        elif self._should_isolate(batch, exc):
            task = asyncio.ensure_future(self._isolate_then_release(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._outcomes(self.queue.fail(batch, exc, self._now()))
            self._release(batch, ok=False)

    async def _run_async(self, batch: Batch) -> None:
        ok = False
        try:
            output = await self._fn(*batch.stack(self.queue.codec))
            parts = self._split(batch, output)
        except Exception as exc:
            if self._should_isolate(batch, exc):
                await self._isolate(batch)
            else:
                self._outcomes(self.queue.fail(batch, exc, self._now()))
        else:
            self._outcomes(self.queue.complete(batch, parts, self._now()))
            ok = True
        finally:
            self._release(batch, ok=ok)

    def _should_isolate(self, batch: Batch, exc: BaseException) -> bool:
        return (
            self.queue.config.isolate_errors
            and len(batch.parts) > 1
            and not isinstance(exc, BatchSizeMismatchError)
        )

    async def _isolate_then_release(self, batch: Batch) -> None:
        try:
            await self._isolate(batch)
        finally:
            self._release(batch, ok=False)

    async def _isolate(self, batch: Batch) -> None:
        """Bisect a failed batch, rerunning each half, until only poisoned requests fail."""
        for half in batch.halves():
            try:
                if self._is_async:
                    parts = self._split(half, await self._fn(*half.stack(self.queue.codec)))
                else:
                    parts = await self._bg.loop.run_in_executor(self._bg.executor, self._work, half)
            except Exception as exc:
                if len(half.parts) > 1 and not isinstance(exc, BatchSizeMismatchError):
                    await self._isolate(half)
                else:
                    self._outcomes(self.queue.fail(half, exc, self._now()))
            else:
                self._outcomes(self.queue.complete(half, parts, self._now()))

    def _outcomes(self, outcomes: list[Outcome]) -> None:
        for r, value, error in outcomes:
            _settle(r.handle, value, error)

    def _release(self, batch: Batch, *, ok: bool) -> None:
        self.queue.release(batch, self._now(), ok=ok)
        self._pump()

    def _now(self) -> float:
        return self._clock.now()

    async def aclose(self) -> None:
        """Refuse new requests, fire what is queued (reason ``drain``), wait until idle."""
        self.queue.close()
        self._idle = asyncio.Event()
        self._pump()
        if not self.queue.idle:
            await self._idle.wait()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
