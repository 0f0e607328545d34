"""The asyncio driver: runs one BatchQueue on the background loop and its worker threads.

It feeds the queue events (arrivals, cancellations, batch completions, its two timers:
the queue's next wake and its next timeout check) and carries out the queue's decisions
(run a batch, reject a request, set the timers). There is no polling tick. Its time, its
timers, its loop callbacks and its worker threads all come from one injected
:class:`~labserve.runtime.scheduling.Host`: labserve's background loop in a notebook,
a virtual one in tests, which steps this very code deterministically.

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
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from labserve.base.errors import (
    BatchSizeMismatchError,
    CancelledRequestError,
    LabServeError,
    RunnerStoppedError,
)
from labserve.batching.queue import BatchQueue
from labserve.batching.requests import Batch, Outcome, Request, Step
from labserve.config.batching import BatchingConfig
from labserve.metrics.snapshot import BatchRecord, Snapshot
from labserve.runtime.delivery import hand_out, settle, settle_all
from labserve.runtime.scheduling import MIN_TIMER_S, Host, Timer
from labserve.runtime.stall import StallWatch

__all__ = ["MethodDriver"]


class MethodDriver:
    """Drives one method's BatchQueue with a model function.

    Thread-safe: :meth:`submit_threadsafe`, :meth:`cancel_threadsafe`, :meth:`configure`,
    :meth:`snapshot`, :meth:`reset_stats`, :attr:`idle`. Loop-only: :meth:`submit`,
    :meth:`cancel`, :meth:`begin_close`, :meth:`abort`, :meth:`aclose`.
    """

    def __init__(
        self,
        queue: BatchQueue,
        fn: Callable[..., Any],
        *,
        is_async: bool,
        scheduler: Host,
    ) -> None:
        if is_async and scheduler.loop is None:
            raise TypeError("an async model needs a scheduler with an asyncio loop")
        self.queue = queue
        self._fn = queue.codec.bind(fn)  # a padded method may take its rows' lengths
        self._is_async = is_async
        self._scheduler = scheduler
        self._now = scheduler.now  # monotonic, and the scheduler's timers agree with it
        self._lock = threading.Lock()  # guards every call into self.queue
        # Holds end at the queue's wake: armed a tick early, so the batch fires within the
        # tick of its deadline, not a tick after it (see BatchQueue.poll's due_s).
        self._wake = Timer(scheduler, self._on_wake, lead_s=MIN_TIMER_S)
        self._check = Timer(scheduler, self._on_check)  # the next request timeout
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_idle: Callable[[], None] | None = None  # set by a close that waits
        self._closed = False  # closed and idle: nothing more is admitted or run
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
        self._loop = scheduler.loop  # whose futures the loop thread settles itself

    # -- thread-safe doors --------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this driver runs on (None on a virtual scheduler)."""
        return self._loop

    def submit_threadsafe(self, request: Request) -> None:
        """Admit ``request`` from any thread.

        Its handle is a concurrent Future, or an asyncio Future of the caller's own
        running loop (answered there, with one hand-off per batch for all of that loop's
        callers).

        Requests arriving together from many threads cost the loop one wake-up, not one
        each. The flag is cleared before the inbox is emptied, so an arrival racing with
        the drain either is drained or schedules a new one: none is left behind. Once the
        loop is closed, requests are refused here with RunnerStoppedError.
        """
        if self._closed:
            self._refuse([request])
            return
        self._inbox.append(request)
        if not self._inbox_scheduled:
            self._inbox_scheduled = True
            try:
                self._scheduler.call_soon_threadsafe(self._drain_inbox)
            except RuntimeError:  # the loop is closed: nobody will ever admit them
                self._inbox_scheduled = False
                taken = []
                while self._inbox:
                    taken.append(self._inbox.popleft())
                self._refuse(taken)

    def _refuse(self, requests: list[Request]) -> None:
        """Refuse (and count) requests that came after the close, from the calling thread."""
        with self._lock:
            self.queue.close()  # already, unless the loop closed under it
            refused = self.queue.admit_all(requests, self._now())
        for r, value, error in refused:
            settle(r.handle, value, error)

    def cancel_threadsafe(self, request: Request) -> None:
        """Withdraw ``request`` from any thread."""
        try:
            self._scheduler.call_soon_threadsafe(self.cancel, request)
        except RuntimeError:
            pass  # the loop is closed: stopping answered everyone

    def snapshot(self) -> Snapshot:
        """A consistent snapshot of the queue. Thread-safe."""
        with self._lock:
            return self.queue.snapshot(self._now())

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
        try:
            self._scheduler.call_soon_threadsafe(self._pump)
        except RuntimeError:
            pass  # the loop is closed: nothing runs any more; the queue keeps the config

    @property
    def idle(self) -> bool:
        """True when nothing is queued, running or being delivered. Thread-safe."""
        with self._lock:
            return self.queue.idle and not self._delivering

    # -- the loop side -------------------------------------------------------------------

    def _drain_inbox(self) -> None:
        self._inbox_scheduled = False
        inbox = self._inbox
        arrivals = self._arrivals
        if inbox and not arrivals:
            self._arrived_s = self._now()
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
            self._arrived_s = self._now()
        arrivals.append(request)
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._scheduler.call_soon(self._pump)

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
        """Withdraw a request whose caller gave up. Loop-only.

        Unless it already had its outcome, it is counted ``cancelled`` and its future, if
        its caller has not cancelled it already, gets CancelledRequestError.
        """
        with self._lock:
            now = self._now()
            refused = self._admit_arrivals()  # it may still be among them
            withdrawn = self.queue.cancel(request, now)
        if withdrawn:
            refused.append((request, None, CancelledRequestError(self.queue.label)))
        if refused:
            self._settle_here(refused)
        if withdrawn or refused:
            self._pump()

    def _settle_here(self, outcomes: list[Outcome]) -> None:
        """Answer ``outcomes`` from the loop thread, whoever awaits them. Loop-only."""
        settle_all(hand_out(outcomes, self._loop))

    def _pump(self, due_s: float | None = None) -> None:
        """Admit, decide, carry the decision out and set both timers. Loop-only.

        ``due_s``: the wake this pump was set for, when the wake timer is why it runs.
        """
        self._pump_scheduled = False
        now = self._now()
        with self._lock:
            refused = self._admit_arrivals()
            step = self.queue.poll(now, due_s)
            idle = self.queue.idle and not self._delivering
        if refused:
            self._settle_here(refused)
        self._carry_out(step)
        self._wake.set(step.wake_s, now)
        self._check.set(step.timeout_check_s, now)
        if idle and self._on_idle is not None:
            self._on_idle()

    def _carry_out(self, step: Step) -> None:
        if step.rejected or step.timed_out:
            self._settle_here(step.rejected + step.timed_out)
        for batch in step.fire:
            self._launch(batch)

    def _on_wake(self, due_s: float) -> None:
        self._pump(due_s)

    def _on_check(self, due_s: float) -> None:
        self._pump()

    def _launch(self, batch: Batch) -> None:
        if self._scheduler.closing:  # a task started now would be destroyed with the loop
            self._abandon(batch)
            return
        if self._is_async:
            task = asyncio.ensure_future(self._run_async(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        try:
            self._scheduler.submit(self._worker, batch)
        except RuntimeError:  # the pool is shut down: the loop is stopping
            self._abandon(batch)

    def _abandon(self, batch: Batch) -> None:
        """Fail a fired batch that will never run (labserve is stopping). Any thread."""
        with self._lock:
            now = self._now()
            outcomes = self.queue.fail(batch, RunnerStoppedError(self.queue.runner), now)
            self.queue.release(batch, now, ok=False)
        self._call_loop(self._answer_on_loop, hand_out(outcomes, self._loop), False)

    def _call_loop(self, fn: Callable[..., None], *args: Any) -> bool:
        """Hand ``fn(*args)`` to the loop from any thread; False once the loop is closed."""
        try:
            self._scheduler.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    def _answer_on_loop(
        self, outcomes: list[Outcome], delivered: bool = False, batch: Batch | None = None
    ) -> None:
        settle_all(outcomes)  # labserve's loop's own futures (a worker answered the rest)
        if delivered or batch is not None:
            with self._lock:
                if delivered:
                    self._delivering -= 1
                if batch is not None:  # its callers have their answers: the latency is known
                    self.queue.answered(batch, self._now())
        self._pump()  # fresh decision and timers from the current state

    # -- worker threads (synchronous models) ---------------------------------------------

    def _worker(self, batch: Batch | None) -> None:
        """Run ``batch``, free its slot, and go straight on to whatever fires next.

        Recording and delivering the finished batch's results is handed to another
        worker, so that the next model call does not wait for it.
        """
        while batch is not None:
            output, error, outcomes = self._run_sync(batch)
            with self._lock:
                now = self._now()
                self.queue.release(batch, now, ok=error is None and outcomes is None)
                step = self.queue.poll(now)
                self._delivering += 1
            args = (batch, output, error, outcomes, step.rejected + step.timed_out)
            if not step.fire:
                # Nothing else to run: deliver from this thread (no hop to another worker).
                self._deliver(*args)
                return
            try:
                self._scheduler.submit(self._deliver, *args)
            except RuntimeError:  # the pool is shut down: deliver here, run nothing more
                self._deliver(*args)
                for fired in step.fire:
                    self._abandon(fired)
                return
            batch = step.fire[0]
            for extra in step.fire[1:]:
                try:
                    self._scheduler.submit(self._worker, extra)
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
                now = self._now()
                if outcomes is None:
                    if error is None:
                        assert parts is not None
                        outcomes = self._complete(batch, parts)
                    else:
                        outcomes = self.queue.fail(batch, error, now)
            mine = hand_out(outcomes + rejected if rejected else outcomes, self._loop)
        finally:
            if mine is None:  # failed midway: whatever outcomes there are must still go out
                mine = hand_out([*(outcomes or ()), *rejected], self._loop)
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
        """Rerun each half of a failed batch, bisecting further, until only the poisoned fail.

        Each half's callers are answered as soon as that half is known, not when the whole
        bisection ends: a half that hangs must not hold up the answers of one already done
        (nor keep them past request_timeout_ms, which no longer looks at them). Returns no
        outcomes: none is left to deliver.
        """
        for half in batch.halves():
            self._attempt_sync(half)
        return []

    def _attempt_sync(self, batch: Batch) -> None:
        try:
            parts = self._call(batch)
        except BaseException as exc:
            if self._should_isolate(batch, exc):
                self._isolate_sync(batch)
                return
            with self._lock:
                outcomes = self.queue.fail(batch, exc, self._now())
        else:
            with self._lock:
                outcomes = self._complete(batch, parts)
        mine = hand_out(outcomes, self._loop)
        if mine:
            self._call_loop(settle_all, mine)

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
            return self.queue.complete(batch, parts, self._now())
        except Exception as bug:  # e.g. parts that will not rejoin: callers must still hear
            return self.queue.fail(batch, bug, self._now())

    def _should_isolate(self, batch: Batch, exc: BaseException) -> bool:
        return (
            isinstance(exc, Exception)
            and self.queue.config.isolate_errors
            and len(batch.parts) > 1
            and not isinstance(exc, BatchSizeMismatchError)
        )

    # -- async models (on the loop) ------------------------------------------------------

    async def _run_async(self, batch: Batch) -> None:
        outcomes: list[Outcome] = []  # a stop's, under the model; the rest are answered at once
        ok = False
        try:
            ok = await self._attempt_async(batch)
        except asyncio.CancelledError:  # the loop is stopping under the model
            with self._lock:
                stopped = RunnerStoppedError(self.queue.runner)
                outcomes += self.queue.fail(batch, stopped, self._now())
            raise
        finally:
            with self._lock:
                self.queue.release(batch, self._now(), ok=ok)
            self._answer_on_loop(hand_out(outcomes, self._loop), False, batch)

    async def _attempt_async(self, batch: Batch) -> bool:
        """Run ``batch`` (bisecting on error if asked); True if it ran cleanly whole."""
        try:
            call = self._fn(*batch.stack(self.queue.codec))
            parts = self._split(batch, await self._stall.timed(call))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit too: it must not end labserve's loop
            if self._should_isolate(batch, exc):
                for half in batch.halves():
                    await self._attempt_async(half)
                return False
            with self._lock:
                done = self.queue.fail(batch, exc, self._now())
            self._settle_here(done)  # now, not once every half ran (see _isolate_sync)
            return False
        with self._lock:
            done = self._complete(batch, parts)
        self._settle_here(done)
        return True

    # -- closing ------------------------------------------------------------------------

    def begin_close(self) -> None:
        """Refuse new requests and fire what is queued (reason ``drain``). Loop-only."""
        with self._lock:
            refused = self._admit_arrivals()  # arrived before the close
            self.queue.close()
        if refused:
            self._settle_here(refused)
        self._pump()

    def abort(self) -> None:
        """Answer everyone still waiting with RunnerStoppedError. Loop-only.

        For a close that cannot wait any longer (a model still running): nobody queued or
        in a running batch is left without an answer; a running batch's late results are
        dropped.
        """
        with self._lock:
            stopped = RunnerStoppedError(self.queue.runner)
            outcomes = self.queue.abort(stopped, self._now())
        self._settle_here(outcomes)

    def end(self) -> None:
        """Disarm the timers and refuse what still arrives. Loop-only; once idle or aborted."""
        self._closed = True
        self._on_idle = None
        self._wake.cancel()
        self._check.cancel()

    async def aclose(self) -> None:
        """Refuse new requests, fire what is queued (reason ``drain``), wait until idle.

        Cancelled (stop() gave up waiting), it answers everyone still waiting first.
        """
        idle = asyncio.get_running_loop().create_future()

        def on_idle() -> None:
            if not idle.done():
                idle.set_result(None)

        self._on_idle = on_idle
        self.begin_close()
        try:
            if not self.idle:
                await idle
        except asyncio.CancelledError:
            self.abort()
            raise
        finally:
            self.end()
