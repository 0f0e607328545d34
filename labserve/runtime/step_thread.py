"""One named thread of a driver's own, that runs its jobs in order: a generative method's steps.

A generative method's steps are a chain: each is planned on the loop once the last came back,
so exactly one runs at a time. Handed to the loop's shared pool, they rotated over its
threads (a free pool thread is woken by whichever waits longest), and every thread that ran
one warmed its own stack, glibc malloc arena and CPU caches for it. :class:`StepThread`
keeps the chain on one thread: the step's arrays come back from one arena, warm.

Between jobs the thread sleeps on a condition (no polling, no CPU while idle); it starts at
the first job and ends after :meth:`close`, once its last job returned. Thread-safe:
:meth:`submit`, :meth:`close`, :meth:`join`, :meth:`wait_closed` and the properties.

>>> worker = StepThread("labserve-step-lm.generate")
>>> worker.submit(print, "a step")
>>> worker.close(); worker.join(1.0)
a step
True
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["StepThread"]


class StepThread:
    """A worker of one's own: ``submit``'s jobs run in order on one daemon thread, ``name``.

    A job's exception is not caught here: the caller's job catches what it must answer
    (the driver's step always does); anything that still escapes ends the thread, after
    which ``submit`` starts a new one. A daemon thread, so that a model call that never
    returns cannot hang the interpreter's exit; :meth:`join` waits at most its timeout.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._jobs: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._ended: concurrent.futures.Future[None] = concurrent.futures.Future()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: new jobs are refused."""
        return self._closed

    @property
    def thread(self) -> threading.Thread | None:
        """The thread (None before the first job)."""
        return self._thread

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` after the jobs before it. RuntimeError once closed."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"the step thread {self.name} is closed")
            self._jobs.append((fn, args))
            if self._thread is None or not self._thread.is_alive():
                self._start()
            else:
                self._cond.notify()

    def close(self) -> None:
        """Refuse new jobs; the thread ends once the queued ones ran. Idempotent; never blocks."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            if self._thread is None or not self._thread.is_alive():  # nothing to end
                _settle(self._ended)

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end after :meth:`close`; True when it has (or never ran)."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return thread is None
        thread.join(timeout_s)
        return not thread.is_alive()

    async def wait_closed(self) -> None:
        """Until the thread ended after :meth:`close` (awaitable on any loop; never blocks it)."""
        await asyncio.wrap_future(self._ended)
        self.join()  # it ended its last statement: this returns at once

    def _main(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._jobs and not self._closed:
                        self._cond.wait()
                    if not self._jobs:
                        return
                    fn, args = self._jobs.popleft()
                fn(*args)
        finally:
            with self._cond:
                if self._jobs:  # a job raised out of the thread: the rest run on a new one
                    self._start()
                elif self._closed:
                    _settle(self._ended)

    def _start(self) -> None:
        """A new thread for the queued jobs (under the condition's lock)."""
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()


def _settle(future: concurrent.futures.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
