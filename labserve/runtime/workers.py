"""Synchronous models on worker threads: run a batch, free its slot, go on to the next.

A worker thread that finishes a batch takes the driver's lock, releases the batch (which
records it) and polls the queue itself: if another batch is ready it starts it at once in
the same thread, instead of handing the decision back to the loop (on a busy loop, with
the GIL, that wait is milliseconds; see the README's Architecture). The finished batch's
outcomes go out through the driver's :class:`~labserve.runtime.delivery.Delivery`, from
another worker meanwhile, or from the same one when nothing else is ready to run.
"""

from __future__ import annotations

import threading
from typing import Any

from labserve.batching.queue import BatchQueue
from labserve.batching.requests import Batch, Outcome
from labserve.runtime.delivery import Delivery, hand_out, settle_all
from labserve.runtime.model_call import ModelCall, should_isolate
from labserve.runtime.scheduling import Host

__all__ = ["Workers"]


class Workers:
    """Runs one method's fired batches on its host's worker threads. Thread-safe.

    Every batch it is given gets its outcomes: from the model, or RunnerStoppedError if
    the pool is shut down before it runs. A model's exceptions, KeyboardInterrupt and
    SystemExit included, become its callers' errors, never a worker's death with the slot
    still held.
    """

    def __init__(
        self,
        queue: BatchQueue,
        lock: threading.Lock,
        host: Host,
        model: ModelCall,
        out: Delivery,
    ) -> None:
        self._queue = queue
        self._lock = lock  # the driver's: guards every call into the queue
        self._host = host
        self._now = host.now
        self._model = model
        self._out = out
        self._loop = host.loop

    def start(self, batch: Batch) -> None:
        """Run ``batch`` on a worker thread (or fail it if the pool is shut down)."""
        try:
            self._host.submit(self._work, batch)
        except RuntimeError:  # the pool is shut down: the loop is stopping
            self._out.abandon(batch)

    def _work(self, batch: Batch | None) -> None:
        """Run ``batch``, free its slot, and go straight on to whatever fires next.

        Recording and delivering the finished batch's results is handed to another
        worker, so that the next model call does not wait for it. The batch is recorded
        (released) before its callers are answered.
        """
        while batch is not None:
            output, error, outcomes = self._run(batch)
            with self._lock:
                now = self._now()
                self._queue.release(batch, now, ok=error is None and outcomes is None)
                step = self._queue.poll(now)
                self._out.pending += 1
            args = (batch, output, error, outcomes, step.rejected + step.timed_out)
            if not step.fire:
                # Nothing else to run: deliver from this thread (no hop to another worker).
                self._out.finished(*args)
                return
            try:
                self._host.submit(self._out.finished, *args)
            except RuntimeError:  # the pool is shut down: deliver here, run nothing more
                self._out.finished(*args)
                for fired in step.fire:
                    self._out.abandon(fired)
                return
            batch = step.fire[0]
            for extra in step.fire[1:]:
                self.start(extra)

    def _run(self, batch: Batch) -> tuple[Any, BaseException | None, list[Outcome] | None]:
        """Call the model: (output, None, None), (None, error, None), or bisected outcomes.

        Catches everything the model raises, KeyboardInterrupt and SystemExit included.
        """
        try:
            # Only the count is checked here; splitting waits for delivery, off this path.
            output = self._model.start(batch)
            self._model.check_count(batch, output)
            return output, None, None
        except BaseException as exc:
            if should_isolate(batch, exc, self._queue.config):
                return None, exc, self.bisect(batch)
            return None, exc, None

    def bisect(self, batch: Batch) -> list[Outcome]:
        """Rerun each half of a failed batch, bisecting further, until only the poisoned fail.

        Each half's callers are answered as soon as that half is known, not when the whole
        bisection ends: a half that hangs must not hold up the answers of one already done
        (nor keep them past request_timeout_ms, which no longer looks at them). Returns no
        outcomes: none is left to deliver.
        """
        for half in batch.halves():
            self._attempt(half)
        return []

    def _attempt(self, batch: Batch) -> None:
        try:
            parts = self._model.call(batch)
        except BaseException as exc:
            if should_isolate(batch, exc, self._queue.config):
                self.bisect(batch)
                return
            with self._lock:
                outcomes = self._queue.fail(batch, exc, self._now())
        else:
            with self._lock:
                outcomes = self._out.complete(batch, parts)
        mine = hand_out(outcomes, self._loop)
        if mine:
            self._out.call_loop(settle_all, mine)
