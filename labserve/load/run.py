"""A load run, whatever it sends: the open and closed loops that drive it, and its handle.

Both kinds of load run here: request batching (a :class:`~labserve.metrics.results.RunResult`,
:mod:`labserve.load.generator`) and streamed generations (a
:class:`~labserve.load.generation.result.GenerationLoadResult`, :mod:`labserve.load.generation`).
A kind brings its :class:`~labserve.load.records.Sender` (what one request is, how it goes
out, what its record holds) and how a record becomes its result; the schedule, stopping,
interrupting, waiting and the warning when the sends fell behind are the same for both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from labserve.base.errors import LoadInterrupted, LoadWarning
from labserve.load.arrivals import Arrivals
from labserve.load.records import Control, RunRecord, Sender, clock_s
from labserve.metrics.results import RunResult
from labserve.runtime.loop import BackgroundLoop

__all__ = ["LoadRun", "closed_loop", "open_loop", "schedule_kept", "start_run"]

RecordT = TypeVar("RecordT", bound=RunRecord)
if TYPE_CHECKING:  # a bare ``LoadRun`` is a request run (TypeVar defaults: typing has them in 3.13)
    from typing_extensions import TypeVar as DefaultTypeVar

    ResultT = DefaultTypeVar("ResultT", default=RunResult)
else:
    ResultT = TypeVar("ResultT")

# A send later than this (or a tenth of the gap between sends) is late: see schedule_kept.
_LAG_LIMIT_S = 0.005
# How often a blocking wait wakes to let Ctrl-C in (a lock wait is not interruptible).
_WAKE_S = 0.05
# An open loop's clock starts this long after its sender is open (its first sends are due
# then, not already late).
_LEAD_S = 0.005


class LoadRun(Generic[ResultT]):
    """A load run: :func:`~labserve.start_load`'s, or a generation load's. Thread-safe.

    ``stop()`` ends the sending early (requests already sent still get their replies,
    streams their last token); ``result()`` waits for the last reply and returns the
    run's result: a :class:`~labserve.RunResult` for requests (a bare ``LoadRun``), a
    :class:`~labserve.GenerationLoadResult` for generations (``GenerationLoadRun``).
    """

    def __init__(
        self,
        bg: BackgroundLoop,
        future: concurrent.futures.Future[RecordT],
        control: Control,
        sender: Sender[RecordT],
        duration_s: float,
        report: Callable[[RecordT, float], ResultT],
        asked_rps: float | None = None,
    ) -> None:
        self._bg = bg
        self._future: concurrent.futures.Future[Any] = future
        self._control = control
        self._sender: Sender[Any] = sender
        self._duration_s = duration_s
        self._report: Callable[[Any, float], ResultT] = report
        self._result: ResultT | None = None
        self.asked_rps = asked_rps
        """The open loop's rate as asked (its arrivals' mean), which warnings quote."""

    @property
    def running(self) -> bool:
        """True until the last reply is in."""
        return not self._future.done()

    @property
    def sent(self) -> int:
        """Requests sent so far."""
        return self._control.sent

    def stop(self) -> None:
        """Send no more requests (idempotent; returns at once)."""
        if not self._future.done():
            self._bg.call_soon(self._control.stop)

    def add_done_callback(self, fn: Callable[[LoadRun[ResultT]], None]) -> None:
        """Call ``fn(run)`` when the last reply is in (at once if it is). Thread-safe.

        ``fn`` runs on the thread that ends the run (the load's loop) or on the caller's.
        """
        self._future.add_done_callback(lambda _: fn(self))

    def result(self, timeout: float | None = None) -> ResultT:
        """Wait for the last reply (up to ``timeout`` seconds) and return the run's result.

        Warns :class:`LoadWarning` when the sends fell behind schedule. Raises
        ``TimeoutError`` when the run is still going after ``timeout``, and
        :class:`LoadInterrupted` (with the result so far) when interrupted: the load stops.
        """
        return self._wait(timeout, stacklevel=3)

    def _wait(self, timeout: float | None, stacklevel: int) -> ResultT:
        if self._result is not None:
            return self._result
        try:
            rec = _wait_future(self._future, timeout)
        except KeyboardInterrupt:
            # Stop sending and give up what is in flight, at once; then report.
            if not self._future.done():
                self._bg.call_soon(self._control.stop, True)
            rec = _wait_future(self._future, None)
            raise LoadInterrupted(self._make_result(rec), self._control.sent) from None
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the load run is still going after {timeout} s") from None
        result = self._make_result(rec)
        if rec.lag:
            lag_s = np.asarray(rec.lag, dtype=float)
            rate_rps = self.asked_rps or len(rec.arrival) / self._run_s(rec)
            _warn_if_behind(lag_s, rate_rps, stacklevel, self._sender.why_behind(rec))
        self._result = result
        return result

    def _run_s(self, rec: RunRecord) -> float:
        """How long the run sent for: as asked, or until stop() if that came first."""
        if self._control.stopped_at is None:
            return self._duration_s
        return max(min(self._control.stopped_at - rec.t0, self._duration_s), 1e-9)

    def _make_result(self, rec: RunRecord) -> ResultT:
        return self._report(rec, self._run_s(rec))

    def __repr__(self) -> str:
        state = "running" if self.running else "done"
        return f"<LoadRun {state}, {self.sent} sent>"


def _wait_future(future: concurrent.futures.Future[Any], timeout: float | None) -> Any:
    """``future.result(timeout)``, waking every few ms so that Ctrl-C gets in at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait_s = _WAKE_S if deadline is None else min(_WAKE_S, max(deadline - time.monotonic(), 0))
        try:
            return future.result(wait_s)
        except concurrent.futures.TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise


def schedule_kept(lag_s: np.ndarray, rate_rps: float) -> tuple[bool, str]:
    """Whether an open loop kept its schedule, and by what that is judged, in words.

    A send is late when it went out more than a tenth of the mean gap between sends after
    its time (at least 5 ms): late by less, the next send's time is not reached. The
    schedule is kept unless more than one send, and more than 1% of them, were late: a
    generator that cannot keep a rate falls further behind with every send, while one
    pause (a collection, the machine's other work) delays one or two. A lone 94 ms pause
    at 4 req/s (9 sends) is kept; 2% of sends 20 ms late at 100 req/s is not.
    """
    limit_s = max(_LAG_LIMIT_S, 0.1 / rate_rps) if rate_rps > 0 else _LAG_LIMIT_S
    late = int(np.count_nonzero(lag_s > limit_s))
    kept = late <= max(1, 0.01 * len(lag_s))
    p50, p99 = np.percentile(lag_s, [50, 99]) * 1000.0 if len(lag_s) else (0.0, 0.0)
    said = (
        f"{late:,} of {len(lag_s):,} sends more than {limit_s * 1000:.3g} ms late "
        f"(send lag p50 {p50:.2f} ms, p99 {p99:.2f} ms, max "
        f"{float(lag_s.max(initial=0.0)) * 1000:.2f} ms)"
    )
    return kept, said


def _warn_if_behind(lag_s: np.ndarray, rate_rps: float, stacklevel: int = 1, why: str = "") -> None:
    kept, said = schedule_kept(lag_s, rate_rps)
    if not kept:
        rate = f"{rate_rps:,.0f}" if rate_rps >= 100 else f"{rate_rps:,.2f}"
        warnings.warn(
            LoadWarning(
                f"the load generator could not keep {rate} req/s: {said}; "
                f"latencies are measured from the intended send times{why}"
            ),
            stacklevel=stacklevel + 1,
        )


def start_run(
    bg: BackgroundLoop,
    sender: Sender[RecordT],
    report: Callable[[RecordT, float], ResultT],
    *,
    duration_s: float,
    arrivals: Arrivals | None,
    concurrency: int | None,
    think_s: float = 0.0,
    seed: int = 0,
) -> LoadRun[ResultT]:
    """Start an open loop (``arrivals``) or a closed one (``concurrency``) on ``bg``.

    Thread-safe. ``report`` makes the run's result from its record and how long it sent.
    """
    control = Control()
    asked_rps = None
    if arrivals is not None:
        times = np.asarray(arrivals.times(duration_s, seed=seed), dtype=float).tolist()
        future = bg.submit(open_loop(sender, times, control))
        asked_rps = float(arrivals.mean_rate(duration_s))
    else:
        assert concurrency is not None
        future = bg.submit(closed_loop(sender, concurrency, think_s, duration_s, control))
    return LoadRun(bg, future, control, sender, float(duration_s), report, asked_rps)


async def open_loop(sender: Sender[RecordT], times: list[float], control: Control) -> RecordT:
    """Send request k at ``times[k]`` (seconds from the start) whatever the replies."""

    async def on_schedule(rec: RecordT) -> None:
        control.sending = asyncio.create_task(_send_on_schedule(sender, rec, times, control))
        try:
            await control.sending
        except asyncio.CancelledError:
            if control.stopped_at is None:
                raise  # the run itself was cancelled, not stopped

    return await _drive(sender, control, on_schedule, open_loop=True)


async def closed_loop(
    sender: Sender[RecordT], clients: int, think_s: float, duration_s: float, control: Control
) -> RecordT:
    """``clients`` clients, each sending its next request ``think_s`` after its last reply."""

    async def client(rec: RecordT, end: float) -> None:
        while (now := clock_s()) < end and control.stopped_at is None:
            k = sender.new_slot(rec, now - rec.t0)
            control.sent += 1
            sent = sender.send_soon(rec, k)
            if sent is not None:
                await sent
            else:
                await sender.send(rec, k)
            if think_s:
                await asyncio.sleep(think_s)

    async def clients_start(rec: RecordT) -> None:
        for _ in range(clients):
            control.track(asyncio.create_task(client(rec, rec.t0 + duration_s)))

    return await _drive(sender, control, clients_start, open_loop=False)


async def _drive(
    sender: Sender[RecordT],
    control: Control,
    send: Callable[[RecordT], Awaitable[None]],
    *,
    open_loop: bool,
) -> RecordT:
    """Open the sender, start the clock, ``send``, wait for every reply, close the sender."""
    await sender.open()
    rec = sender.new_record()
    try:
        rec.t0 = clock_s() + (_LEAD_S if open_loop else 0.0)
        rec.track_lag = open_loop
        await send(rec)
        await _answered(control)
    finally:
        await _close(sender, control)
    if control.error is not None:
        raise control.error
    return rec


async def _send_on_schedule(
    sender: Sender[RecordT], rec: RecordT, times: list[float], control: Control
) -> None:
    loop = asyncio.get_running_loop()
    t0, n, i = rec.t0, len(times), 0
    while i < n and control.stopped_at is None:  # stopped while the sender was opening
        # Everything due goes out now; then one sleep until the next is due.
        now = clock_s()
        while i < n and t0 + times[i] <= now:
            k = sender.new_slot(rec, times[i])
            control.sent += 1
            # On an idle connection the request is written now, without a task. Either
            # way the sender reports when it went out (after any wait for a connection).
            sent = sender.send_soon(rec, k)
            if sent is None:
                sent = loop.create_task(sender.send(rec, k))
            control.track(sent)
            i += 1
        if i < n:
            await asyncio.sleep(t0 + times[i] - clock_s())


async def _answered(control: Control) -> None:
    """Wait until every request in flight has its outcome."""
    while control.in_flight:
        await asyncio.wait(set(control.in_flight))


async def _close(sender: Sender[Any], control: Control) -> None:
    """Cancel what is still in flight (the run was interrupted) and close the sender."""
    for task in control.in_flight:
        task.cancel()
    await sender.close()
