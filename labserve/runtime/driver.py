"""The asyncio driver: runs one BatchQueue on the background loop and its worker threads.

It feeds the queue events (arrivals, cancellations, batch completions, its one timer)
and carries out the queue's decisions (run a batch, reject a request, set the timer).
There is no polling tick.

Ownership: the queue is sans-IO and not thread-safe, so the driver guards it with one
lock, held only for queue calls (microseconds). Arrivals, cancellations and timers are
handled on the loop. A worker thread that finishes a synchronous batch records it and,
if another batch is ready, starts it at once in the same thread: the model is not left
idle waiting for the loop to be scheduled (on a busy loop, with the GIL, that wait is
milliseconds). The finished batch's results are split out and delivered by another
worker meanwhile, or by the same worker when nothing else is ready to run.

Wake-ups are per batch, not per request: the arrivals of one loop iteration are admitted
together (one lock, one clock read, one decision), and a batch's callers are answered
with one hand-off per event loop: callers blocked in other threads directly from the
worker, callers awaiting on labserve's loop by one ``call_soon_threadsafe``, callers
awaiting on another loop (the kernel's) by one ``call_soon_threadsafe`` to that loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from labserve.base.clock import Clock
from labserve.base.errors import BatchSizeMismatchError, LabServeError, RunnerStoppedError
from labserve.batching.queue import BatchQueue
from labserve.batching.requests import Batch, Outcome, Request, Step
from labserve.config.batching import BatchingConfig
from labserve.metrics.snapshot import BatchRecord, Snapshot
from labserve.runtime.loop import BackgroundLoop
from labserve.runtime.stall import StallWatch

__all__ = ["MethodDriver"]

AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]

# The shortest timer armed. Event loops wait in whole milliseconds: asyncio rounds a shorter
# wait up to 1 ms, uvloop fires it at once (early), and an early timer would only poll the
# queue again and again until the time came, spinning the loop (and taking the GIL from the
# model). Either way the decision is made on the runner's clock when the timer fires.
_MIN_TIMER_S = 0.001


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


def _settle_all(outcomes: list[Outcome]) -> None:
    """Settle asyncio futures of the running loop (or concurrent ones): no lock, no hop."""
    for r, value, error in outcomes:
        handle = r.handle
        if handle.done():
            continue
        if error is None:
            handle.set_result(value)
        else:
            handle.set_exception(error)


def _hand_out(outcomes: list[Outcome], home: asyncio.AbstractEventLoop) -> list[Outcome]:
    """Answer what can be answered from this thread; return the outcomes for ``home``.

    Concurrent futures are set here (any thread). Futures of another event loop get one
    ``call_soon_threadsafe`` per loop for all of theirs. Those of ``home`` (labserve's
    loop) are returned, to be set on its thread.
    """
    mine: list[Outcome] = []
    others: dict[asyncio.AbstractEventLoop, list[Outcome]] | None = None
    for outcome in outcomes:
        handle = outcome[0].handle
        if type(handle) is concurrent.futures.Future:
            _settle(handle, outcome[1], outcome[2])
            continue
        loop = handle.get_loop()
        if loop is home:
            mine.append(outcome)
        else:
            if others is None:
                others = {}
            others.setdefault(loop, []).append(outcome)
    if others:
        for loop, theirs in others.items():
            try:
                loop.call_soon_threadsafe(_settle_all, theirs)
            except RuntimeError:
                pass  # that loop is closed: nobody is left awaiting there
    return mine


class MethodDriver:
    """Drives one method's BatchQueue with a model function.

    Thread-safe: :meth:`submit_threadsafe`, :meth:`cancel_threadsafe`, :meth:`configure`,
    :meth:`snapshot`, :meth:`reset_stats`. Loop-only: :meth:`submit`, :meth:`cancel`,
    :meth:`aclose`.
    """

    def __init__(
        self,
        queue: BatchQueue,
        fn: Callable[..., Any],
        *,
        is_async: bool,
        bg: BackgroundLoop,
        clock: Clock,
    ) -> None:
        self.queue = queue
        self._fn = queue.codec.bind(fn)  # a padded method may take its rows' lengths
        self._is_async = is_async
        self._bg = bg
        self._clock = clock  # monotonic, and the loop's timers must agree with it
        self._lock = threading.Lock()  # guards every call into self.queue
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._check: asyncio.TimerHandle | None = None
        self._check_at: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: asyncio.Event | None = None
        # Arrivals from other threads wait here; one loop callback takes all that came.
        self._inbox: deque[Request] = deque()
        self._inbox_scheduled = False
        # Arrivals not yet admitted (loop-only): the next pump admits them all at once,
        # as arrived when the first of them did (never later than any of them came).
        self._arrivals: list[Request] = []
        self._arrived_s = 0.0
        self._pump_scheduled = False
        self._delivering = 0  # batches released whose results are still being delivered
        self._stall = StallWatch(queue.label)  # async models: warn once if one blocks the loop
        # Captured once: a late worker must not restart a loop that was stopped.
        self._loop = bg.loop
        self._executor = bg.executor

    # -- thread-safe doors --------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this driver runs on (labserve's background loop)."""
        return self._loop

    def submit_threadsafe(self, request: Request) -> None:
        """Admit ``request`` from any thread.

        Its handle is a concurrent Future, or an asyncio Future of the caller's own
        running loop (answered there, with one hand-off per batch for all of that loop's
        callers).

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
        """A consistent snapshot of the queue. Thread-safe."""
        with self._lock:
            return self.queue.snapshot(self._clock.now())

    def batch_records(self, last: int) -> list[BatchRecord]:
        """The last ``last`` recorded batches, oldest first. Thread-safe."""
        with self._lock:
            return self.queue.recorder.batch_records(last=last)

    def reset_stats(self) -> None:
        """Forget recorded traffic. Thread-safe."""
        with self._lock:
            self.queue.recorder.reset()

    def configure(self, config: BatchingConfig) -> None:
        """Apply ``config`` at the next batch boundary. Thread-safe."""
        with self._lock:
            self.queue.configure(config)
        self._bg.call_soon(self._pump)

    # -- the loop side -------------------------------------------------------------------

    def _drain_inbox(self) -> None:
        self._inbox_scheduled = False
        inbox = self._inbox
        arrivals = self._arrivals
        if inbox and not arrivals:
            self._arrived_s = self._clock.now()
        while inbox:
            arrivals.append(inbox.popleft())
        if not self._pump_scheduled:
            self._pump()  # no need to wait another loop iteration

    def submit(self, request: Request) -> None:
        """Admit a request; a refusal is set on its handle. Loop-only.

        Admission and the decision run once per loop iteration, after every arrival of
        that iteration: a burst of callers is admitted together and costs one decision.
        """
        arrivals = self._arrivals
        if not arrivals:
            self._arrived_s = self._clock.now()
        arrivals.append(request)
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _admit_arrivals(self) -> list[Outcome]:
        """Admit every pending arrival (lock held); return the refused, with their errors.

        They are admitted as of the first one's arrival: their waits and deadlines count
        from then (a busy loop iteration delays the admission, not the clock).
        """
        arrivals = self._arrivals
        if not arrivals:
            return []
        self._arrivals = []
        return self.queue.admit_all(arrivals, self._arrived_s)

    def cancel(self, request: Request) -> None:
        """Withdraw a request whose caller gave up. Loop-only."""
        with self._lock:
            now = self._clock.now()
            refused = self._admit_arrivals()  # it may still be among them
            withdrawn = self.queue.cancel(request, now)
        if refused:
            self._settle_here(refused)
        if withdrawn or refused:
            self._pump()

    def _settle_here(self, outcomes: list[Outcome]) -> None:
        """Answer ``outcomes`` from the loop thread, whoever awaits them. Loop-only."""
        _settle_all(_hand_out(outcomes, self._loop))

    def _pump(self) -> None:
        self._pump_scheduled = False
        now = self._clock.now()
        with self._lock:
            refused = self._admit_arrivals()
            step = self.queue.poll(now)
            idle = self.queue.idle and not self._delivering
        if refused:
            self._settle_here(refused)
        self._carry_out(step)
        self._set_timer(step.wake_s, now)
        if step.timeout_check_s != self._check_at:
            self._set_check(step.timeout_check_s, now)
        if idle and self._idle is not None:
            self._idle.set()

    def _carry_out(self, step: Step) -> None:
        if step.rejected or step.timed_out:
            self._settle_here(step.rejected + step.timed_out)
        for batch in step.fire:
            self._launch(batch)

    def _set_timer(self, wake_s: float | None, now: float) -> None:
        if wake_s == self._timer_at:
            return
        for timer in (self._timer, self._check):
            if timer is not None:
                timer.cancel()
        self._timer = self._check = None
        self._timer_at = wake_s
        if wake_s is not None:
            self._timer = self._loop.call_later(max(wake_s - now, _MIN_TIMER_S), self._on_timer)

    def _set_check(self, check_s: float | None, now: float) -> None:
        """The timeout check's own timer: it moves rarely, so it is not re-armed per poll."""
        if self._check is not None:
            self._check.cancel()
            self._check = None
        self._check_at = check_s
        if check_s is not None:
            self._check = self._loop.call_later(max(check_s - now, _MIN_TIMER_S), self._on_check)

    def _on_check(self) -> None:
        self._check = None
        self._check_at = None
        self._pump()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._pump()

    def _launch(self, batch: Batch) -> None:
        if self._bg.closing:  # a task started now would be destroyed with the loop
            self._abandon(batch)
            return
        if self._is_async:
            task = asyncio.ensure_future(self._run_async(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        try:
            self._executor.submit(self._worker, batch)
        except RuntimeError:  # the pool is shut down: the loop is stopping
            self._abandon(batch)

    def _abandon(self, batch: Batch) -> None:
        """Fail a fired batch that will never run (labserve is stopping). Any thread."""
        with self._lock:
            now = self._clock.now()
            outcomes = self.queue.fail(batch, RunnerStoppedError(self.queue.runner), now)
            self.queue.release(batch, now, ok=False)
        self._call_loop(self._answer_on_loop, _hand_out(outcomes, self._loop), False)

    def _call_loop(self, fn: Callable[..., None], *args: Any) -> bool:
        """Hand ``fn(*args)`` to the loop from any thread; False once the loop is closed."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    def _answer_on_loop(
        self, outcomes: list[Outcome], delivered: bool = False, batch: Batch | None = None
    ) -> None:
        _settle_all(outcomes)  # labserve's loop's own futures (a worker answered the rest)
        if delivered or batch is not None:
            with self._lock:
                if delivered:
                    self._delivering -= 1
                if batch is not None:  # its callers have their answers: the latency is known
                    self.queue.answered(batch, self._clock.now())
        self._pump()  # fresh decision and timer from the current state

    # -- worker threads (synchronous models) ---------------------------------------------

    def _worker(self, batch: Batch | None) -> None:
        """Run ``batch``, free its slot, and go straight on to whatever fires next.

        Recording and delivering the finished batch's results is handed to another
        worker, so that the next model call does not wait for it.
        """
        while batch is not None:
            output, error, outcomes = self._run_sync(batch)
            with self._lock:
                now = self._clock.now()
                self.queue.release(batch, now, ok=error is None and outcomes is None)
                step = self.queue.poll(now)
                self._delivering += 1
            args = (batch, output, error, outcomes, step.rejected + step.timed_out)
            if not step.fire:
                # Nothing else to run: deliver from this thread (no hop to another worker).
                self._deliver(*args)
                return
            try:
                self._executor.submit(self._deliver, *args)
            except RuntimeError:  # the pool is shut down: deliver here, run nothing more
                self._deliver(*args)
                for fired in step.fire:
                    self._abandon(fired)
                return
            batch = step.fire[0]
            for extra in step.fire[1:]:
                try:
                    self._executor.submit(self._worker, extra)
                except RuntimeError:
                    self._abandon(extra)

    def _deliver(
        self,
        batch: Batch,
        output: Any,
        error: BaseException | None,
        outcomes: list[Outcome] | None,
        rejected: list[Outcome],
    ) -> None:
        """Worker thread: record a finished batch's outcomes and hand them to the callers."""
        mine: list[Outcome] | None = None  # the outcomes to set on labserve's loop
        try:
            parts: list[Any] | None = None
            if outcomes is None and error is None:
                try:
                    parts = batch.split(self.queue.codec, output)
                except Exception as exc:  # an output that will not split: callers must hear
                    error = exc
            with self._lock:
                now = self._clock.now()
                if outcomes is None:
                    if error is None:
                        assert parts is not None
                        outcomes = self._complete(batch, parts)
                    else:
                        outcomes = self.queue.fail(batch, error, now)
            mine = _hand_out(outcomes + rejected if rejected else outcomes, self._loop)
        finally:
            if mine is None:  # failed midway: whatever outcomes there are must still go out
                mine = _hand_out([*(outcomes or ()), *rejected], self._loop)
            # The loop answers its own callers and counts the delivery done (so that stop()
            # waits for it); if the loop is gone, nobody is left to answer on it.
            if not self._call_loop(self._answer_on_loop, mine, True, batch):
                with self._lock:
                    self._delivering -= 1

    def _run_sync(self, batch: Batch) -> tuple[Any, BaseException | None, list[Outcome] | None]:
        """Call the model: (output, None, None), (None, error, None), or bisected outcomes.

        Catches everything the model raises, KeyboardInterrupt and SystemExit included:
        they become its callers' errors, never a worker's death with the slot still held.
        """
        try:
            # Only the count is checked here; splitting waits for _deliver, off this path.
            output = self._fn(*batch.stack(self.queue.codec))
            self._check_count(batch, output)
            return output, None, None
        except BaseException as exc:
            if self._should_isolate(batch, exc):
                return None, exc, self._isolate_sync(batch)
            return None, exc, None

    def _isolate_sync(self, batch: Batch) -> list[Outcome]:
        """Rerun each half of a failed batch, bisecting further, until only the poisoned fail."""
        outcomes: list[Outcome] = []
        for half in batch.halves():
            self._attempt_sync(half, outcomes)
        return outcomes

    def _attempt_sync(self, batch: Batch, outcomes: list[Outcome]) -> None:
        try:
            parts = self._call(batch)
        except BaseException as exc:
            if self._should_isolate(batch, exc):
                outcomes += self._isolate_sync(batch)
            else:
                with self._lock:
                    outcomes += self.queue.fail(batch, exc, self._clock.now())
        else:
            with self._lock:
                outcomes += self._complete(batch, parts)

    def _call(self, batch: Batch) -> list[Any]:
        """Stack, call the model, split. Touches no queue state (any thread)."""
        return self._split(batch, self._fn(*batch.stack(self.queue.codec)))

    def _split(self, batch: Batch, output: Any) -> list[Any]:
        self._check_count(batch, output)
        return batch.split(self.queue.codec, output)

    def _check_count(self, batch: Batch, output: Any) -> None:
        """Raise BatchSizeMismatchError unless ``output`` has one item per input item."""
        try:
            returned = self.queue.codec.output_items(output)
        except LabServeError as exc:
            raise BatchSizeMismatchError(self.queue.name, batch.items, -1) from exc
        if returned != batch.items:
            raise BatchSizeMismatchError(self.queue.name, batch.items, returned)

    def _complete(self, batch: Batch, parts: list[Any]) -> list[Outcome]:
        """queue.complete, lock held; a failure to rejoin fails the callers instead."""
        try:
            return self.queue.complete(batch, parts, self._clock.now())
        except Exception as bug:  # e.g. parts that will not rejoin: callers must still hear
            return self.queue.fail(batch, bug, self._clock.now())

    def _should_isolate(self, batch: Batch, exc: BaseException) -> bool:
        return (
            isinstance(exc, Exception)
            and self.queue.config.isolate_errors
            and len(batch.parts) > 1
            and not isinstance(exc, BatchSizeMismatchError)
        )

    # -- async models (on the loop) ------------------------------------------------------

    async def _run_async(self, batch: Batch) -> None:
        outcomes: list[Outcome] = []  # filled as halves finish, so none is lost midway
        ok = False
        try:
            ok = await self._attempt_async(batch, outcomes)
        except asyncio.CancelledError:  # the loop is stopping under the model
            with self._lock:
                stopped = RunnerStoppedError(self.queue.runner)
                outcomes += self.queue.fail(batch, stopped, self._clock.now())
            raise
        finally:
            with self._lock:
                self.queue.release(batch, self._clock.now(), ok=ok)
            self._answer_on_loop(_hand_out(outcomes, self._loop), False, batch)

    async def _attempt_async(self, batch: Batch, outcomes: list[Outcome]) -> bool:
        """Run ``batch`` (bisecting on error if asked); True if it ran cleanly whole."""
        try:
            call = self._fn(*batch.stack(self.queue.codec))
            parts = self._split(batch, await self._stall.timed(call))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit too: it must not end labserve's loop
            if self._should_isolate(batch, exc):
                for half in batch.halves():
                    await self._attempt_async(half, outcomes)
            else:
                with self._lock:
                    outcomes += self.queue.fail(batch, exc, self._clock.now())
            return False
        with self._lock:
            outcomes += self._complete(batch, parts)
        return True

    async def aclose(self) -> None:
        """Refuse new requests, fire what is queued (reason ``drain``), wait until idle."""
        with self._lock:
            refused = self._admit_arrivals()  # arrived before the close
            self.queue.close()
        if refused:
            self._settle_here(refused)
        self._idle = asyncio.Event()
        self._pump()
        with self._lock:
            idle = self.queue.idle and not self._delivering
        try:
            if not idle:
                await self._idle.wait()
        except asyncio.CancelledError:
            # stop() gave up waiting (a model still running): nobody queued may be left
            # without an answer.
            with self._lock:
                stopped = RunnerStoppedError(self.queue.runner)
                outcomes = self.queue.abort(stopped, self._clock.now())
            self._settle_here(outcomes)
            raise
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
