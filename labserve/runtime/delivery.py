"""Handing outcomes to callers: their futures, whichever thread and loop they wait on.

A batch's callers are answered with one hand-off per event loop: callers blocked in other
threads (concurrent futures) directly from the delivering thread, callers awaiting on
labserve's loop by the loop itself, callers awaiting on another loop (the kernel's) by one
``call_soon_threadsafe`` to that loop for all of theirs. :class:`Delivery` is a driver's
way out: it records a finished batch before it answers the batch's callers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from labserve.base.errors import RunnerStoppedError
from labserve.batching.queue import BatchQueue
from labserve.batching.requests import Batch, Outcome
from labserve.runtime.scheduling import Host

__all__ = ["AnyFuture", "Delivery", "hand_out", "settle", "settle_all"]

AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


def settle(handle: AnyFuture, value: Any, error: BaseException | None) -> None:
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


def settle_all(outcomes: list[Outcome]) -> None:
    """Settle asyncio futures of the running loop (or concurrent ones): no lock, no hop."""
    for r, value, error in outcomes:
        handle = r.handle
        if handle.done():
            continue
        if error is None:
            handle.set_result(value)
        else:
            handle.set_exception(error)


def hand_out(outcomes: list[Outcome], home: asyncio.AbstractEventLoop | None) -> list[Outcome]:
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
            settle(handle, outcome[1], outcome[2])
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
                loop.call_soon_threadsafe(settle_all, theirs)
            except RuntimeError:
                pass  # that loop is closed: nobody is left awaiting there
    return mine


class Delivery:
    """A driver's way out: its finished batches' outcomes, to callers on the right threads.

    The rule it keeps: a batch is recorded (released to the queue) before any of its
    callers is answered, so a snapshot taken by a caller that has its answer shows its
    batch (:meth:`finished` runs after the worker's release; the async path releases
    before it calls :meth:`on_loop`). The one exception is a bisected batch
    (``isolate_errors``): each half's callers are answered as soon as that half is known,
    before the whole batch ends and is recorded.

    :attr:`pending` counts batches released whose outcomes are still on their way (a
    close waits for them); it is guarded by the driver's lock, which is held only for
    queue calls. Thread-safe: :meth:`call_loop`, :meth:`finished`, :meth:`abandon`. Loop-only:
    :meth:`here`, :meth:`on_loop`.
    """

    def __init__(
        self,
        queue: BatchQueue,
        lock: threading.Lock,
        host: Host,
        pump: Callable[[], None],
    ) -> None:
        self._queue = queue
        self._lock = lock
        self._host = host
        self._now = host.now
        self._loop = host.loop  # whose futures the loop thread settles itself
        self._pump = pump
        self.pending = 0

    def call_loop(self, fn: Callable[..., None], *args: Any) -> bool:
        """Hand ``fn(*args)`` to the loop from any thread; False once the loop is closed."""
        try:
            self._host.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    def here(self, outcomes: list[Outcome]) -> None:
        """Answer ``outcomes`` from the loop thread, whoever awaits them. Loop-only."""
        settle_all(hand_out(outcomes, self._loop))

    def on_loop(
        self, outcomes: list[Outcome], delivered: bool = False, batch: Batch | None = None
    ) -> None:
        """Answer the loop's own callers; count a delivery done; then pump. Loop-only.

        ``outcomes``: those :func:`hand_out` left for labserve's loop (it answered the
        rest); ``delivered``: a delivery counted in :attr:`pending` ends; ``batch``: whose
        callers now have their answers (its latency is known).
        """
        settle_all(outcomes)
        if delivered or batch is not None:
            with self._lock:
                if delivered:
                    self.pending -= 1
                if batch is not None:
                    self._queue.answered(batch, self._now())
        self._pump()  # fresh decision and timers from the current state

    def abandon(self, batch: Batch) -> None:
        """Fail a fired batch that will never run (labserve is stopping). Any thread."""
        with self._lock:
            now = self._now()
            outcomes = self._queue.fail(batch, RunnerStoppedError(self._queue.runner), now)
            self._queue.release(batch, now, ok=False)
        self.call_loop(self.on_loop, hand_out(outcomes, self._loop), False)

    def complete(self, batch: Batch, parts: list[Any]) -> list[Outcome]:
        """``queue.complete``, lock held; a failure to rejoin fails the callers instead."""
        try:
            return self._queue.complete(batch, parts, self._now())
        except Exception as bug:  # e.g. parts that will not rejoin: callers must still hear
            return self._queue.fail(batch, bug, self._now())

    def finished(
        self,
        batch: Batch,
        output: Any,
        error: BaseException | None,
        outcomes: list[Outcome] | None,
        rejected: list[Outcome],
    ) -> None:
        """Worker thread: a released batch's outcomes (and ``rejected``) to their callers.

        ``output`` is split here, off the path of the next model call; an output that
        will not split fails the batch's callers. Counted in :attr:`pending` by the caller.
        """
        mine: list[Outcome] | None = None  # the outcomes to set on labserve's loop
        try:
            parts: list[Any] | None = None
            if outcomes is None and error is None:
                try:
                    parts = batch.split(self._queue.codec, output)
                except Exception as exc:  # an output that will not split: callers must hear
                    error = exc
            with self._lock:
                now = self._now()
                if outcomes is None:
                    if error is None:
                        assert parts is not None
                        outcomes = self.complete(batch, parts)
                    else:
                        outcomes = self._queue.fail(batch, error, now)
            mine = hand_out(outcomes + rejected if rejected else outcomes, self._loop)
        finally:
            if mine is None:  # failed midway: whatever outcomes there are must still go out
                mine = hand_out([*(outcomes or ()), *rejected], self._loop)
            # The loop answers its own callers and counts the delivery done (so that stop()
            # waits for it); if the loop is gone, nobody is left to answer on it.
            if not self.call_loop(self.on_loop, mine, True, batch):
                with self._lock:
                    self.pending -= 1
