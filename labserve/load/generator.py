"""Putting load on a runner method: open loop (arrivals on schedule) or closed loop (N clients).

Runs on labserve's background loop, so the calls are in-process and the notebook's own loop
is left alone. Latency is measured from each request's *intended* send time, so a generator
that falls behind cannot hide the queueing it caused (no coordinated omission); when it
falls behind it says so with a :class:`~labserve.base.errors.LoadWarning`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import warnings
from typing import Any

import numpy as np

from labserve.base.errors import LabServeError, OverloadError, QueueFullError
from labserve.base.vocabulary import CANCELLED, FAILED, REASONS, REFUSED, REJECTED, SERVED
from labserve.load.arrivals import Arrivals
from labserve.metrics.results import RunResult
from labserve.runtime.loop import BackgroundLoop, background_loop
from labserve.runtime.runner import RunnerMethod
from labserve.wire.datatypes import datatype

__all__ = ["LoadRun", "LoadWarning", "load_test", "start_load"]

# Behind schedule by more than this (p99), the run says it could not keep the rate.
_LAG_LIMIT_S = 0.005


class LoadWarning(UserWarning):
    """Warned when a load generator could not keep the asked rate (it fell behind schedule).

    Latencies stay measured from the intended send times, so they include the lag.
    """


def load_test(
    target: RunnerMethod | str,
    *,
    example: Any,
    duration_s: float,
    arrivals: Arrivals | None = None,
    concurrency: int | None = None,
    think_s: float = 0.0,
    seed: int = 0,
    label: str = "",
) -> RunResult:
    """Drive ``target`` with ``example`` requests for ``duration_s``; return the RunResult.

    ``target`` is a runner method (in-process) or a URL: the simple route
    (``.../runners/{name}/{method}``) or a v2 infer URL (``.../v2/models/{name}/infer``).
    Over HTTP, per-request batch starts and the batch arrays are unknown (NaN, empty).

    Open loop with ``arrivals`` (an arrival process: requests go out on schedule whatever
    the replies), or closed loop with ``concurrency`` clients, each sending its next
    request ``think_s`` after its last reply. Blocks until the last reply; call it from a
    notebook cell or a script (not from labserve's loop). The batch arrays hold the
    run's batches as far as the runner's recorder still holds them (its last 4,096).
    :func:`start_load` is the same without blocking.

    >>> import labserve                                        # doctest: +SKIP
    >>> r = labserve.load_test(runner.predict, example=x, duration_s=5,
    ...                        arrivals=labserve.arrivals("poisson", rate_rps=2000))
    """
    run = start_load(
        target,
        example=example,
        duration_s=duration_s,
        arrivals=arrivals,
        concurrency=concurrency,
        think_s=think_s,
        seed=seed,
        label=label,
    )
    return run._wait(None, stacklevel=3)


def start_load(
    target: RunnerMethod | str,
    *,
    example: Any,
    duration_s: float,
    arrivals: Arrivals | None = None,
    concurrency: int | None = None,
    think_s: float = 0.0,
    seed: int = 0,
    label: str = "",
) -> LoadRun:
    """Start the load :func:`load_test` describes and return at once with its :class:`LoadRun`.

    The load runs on labserve's background loop, so the calling cell (or thread) is free:
    this is what a dashboard's start button uses. Same arguments and errors as
    :func:`load_test`.
    """
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a finite number > 0, got {duration_s!r}")
    if (arrivals is None) == (concurrency is None):
        raise TypeError("load_test needs exactly one of arrivals= (open loop) or concurrency=")
    if concurrency is not None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if think_s < 0:
            raise ValueError(f"think_s must be >= 0, got {think_s!r}")
    sender: _Sender
    if isinstance(target, str):
        sender = _HttpSender(target, example)
        bg = background_loop()
        batches_before = 0
    else:
        if not target.batchable:
            raise TypeError(f"{target!r} is not batchable: load_test drives a batch queue")
        sender = _MethodSender(target, example)
        bg = target.runner.bg
        target.start()  # the loop and the driver start before the clock does
        batches_before = target.stats().batches
    control = _Control()
    if arrivals is not None:
        times = np.asarray(arrivals.times(duration_s, seed=seed), dtype=float)
        future = bg.submit(_open_loop(sender, times, control))
    else:
        assert concurrency is not None
        future = bg.submit(_closed_loop(sender, concurrency, think_s, duration_s, control))
    method = target if isinstance(target, RunnerMethod) else None
    return LoadRun(bg, future, control, method, float(duration_s), batches_before, label)


class LoadRun:
    """A load run started by :func:`start_load`. Thread-safe.

    ``stop()`` ends the sending early (requests already sent still get their replies);
    ``result()`` waits for the last reply and returns the RunResult.
    """

    def __init__(
        self,
        bg: BackgroundLoop,
        future: concurrent.futures.Future[_Record],
        control: _Control,
        method: RunnerMethod | None,
        duration_s: float,
        batches_before: int,
        label: str,
    ) -> None:
        self._bg = bg
        self._future = future
        self._control = control
        self._method = method
        self._duration_s = duration_s
        self._batches_before = batches_before
        self._label = label
        self._result: RunResult | None = None

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

    def result(self, timeout: float | None = None) -> RunResult:
        """Wait for the last reply (up to ``timeout`` seconds) and return the RunResult.

        Warns :class:`LoadWarning` when the sends fell behind schedule. Raises
        ``TimeoutError`` when the run is still going after ``timeout``.
        """
        return self._wait(timeout, stacklevel=3)

    def _wait(self, timeout: float | None, stacklevel: int) -> RunResult:
        if self._result is None:
            try:
                rec = self._future.result(timeout)
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"the load run is still going after {timeout} s") from None
            duration_s = self._duration_s
            if self._control.stopped_at is not None:
                duration_s = max(min(self._control.stopped_at - rec.t0, duration_s), 1e-9)
            self._result = _result(self._method, rec, duration_s, self._batches_before, self._label)
            result = self._result
            if result.send_lag_s is not None and len(result.send_lag_s):
                _warn_if_behind(result.send_lag_s, len(result.arrival_s) / duration_s, stacklevel)
        return self._result

    def __repr__(self) -> str:
        state = "running" if self.running else "done"
        return f"<LoadRun {state}, {self.sent} sent>"


class _Control:
    """Stops a run's sending. Loop-only."""

    def __init__(self) -> None:
        self.sent = 0
        self.stopped_at: float | None = None
        self.sending: asyncio.Task[None] | None = None

    def stop(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = asyncio.get_running_loop().time()
            if self.sending is not None:
                self.sending.cancel()


class _Record:
    """Per-request records of one run, filled on the loop."""

    def __init__(self) -> None:
        self.arrival: list[float] = []
        self.start: list[float] = []
        self.finish: list[float] = []
        self.outcome: list[int] = []
        self.items: list[int] = []
        self.lag: list[float] = []
        self.t0 = 0.0


class _Sender:
    """Sends one request and records its outcome in a _Record. Loop-only."""

    async def open(self) -> None:
        """Get ready to send (on the loop)."""

    async def close(self) -> None:
        """Release what open() took."""

    async def send(self, rec: _Record, k: int) -> None:
        raise NotImplementedError


class _MethodSender(_Sender):
    def __init__(self, method: RunnerMethod, example: Any) -> None:
        self.method = method
        self.example = example

    async def send(self, rec: _Record, k: int) -> None:
        loop = asyncio.get_running_loop()
        request, future = self.method.submit_on_loop((self.example,))
        rec.items[k] = request.items
        try:
            await future
            rec.outcome[k] = SERVED
        except (OverloadError, QueueFullError) as exc:
            rec.outcome[k] = REFUSED if isinstance(exc, QueueFullError) else REJECTED
        except LabServeError:
            rec.outcome[k] = FAILED
        rec.finish[k] = loop.time() - rec.t0
        if request.start_s is not None:
            rec.start[k] = request.start_s - rec.t0


class _HttpSender(_Sender):
    """POSTs to the simple route or a v2 infer URL, with no cap on connections in flight."""

    def __init__(self, url: str, example: Any) -> None:
        arr = np.asarray(example)
        self.url = url
        self.items = int(arr.shape[0]) if arr.ndim else 1
        if "/v2/models/" in url:
            tensor = {
                "name": "input__0",
                "shape": list(arr.shape),
                "datatype": datatype(arr.dtype),
                "data": arr.reshape(-1).tolist(),
            }
            self.body = json.dumps({"inputs": [tensor]}).encode()
        else:
            self.body = json.dumps(arr.tolist()).encode()
        self.client: Any = None

    async def open(self) -> None:
        from tornado.httpclient import AsyncHTTPClient

        # tornado's default client allows 10 requests at a time: batches would cap at 10.
        self.client = AsyncHTTPClient(force_instance=True, max_clients=100_000)

    async def close(self) -> None:
        if self.client is not None:
            self.client.close()

    async def send(self, rec: _Record, k: int) -> None:
        loop = asyncio.get_running_loop()
        rec.items[k] = self.items
        try:
            reply = await self.client.fetch(
                self.url,
                method="POST",
                body=self.body,
                headers={"Content-Type": "application/json"},
                raise_error=False,
                request_timeout=60,
            )
            code = reply.code
        except OSError:
            code = 599
        rec.outcome[k] = SERVED if code == 200 else REJECTED if code == 503 else FAILED
        rec.finish[k] = loop.time() - rec.t0


def _new_slot(rec: _Record, intended_s: float) -> int:
    rec.arrival.append(intended_s)
    rec.start.append(math.nan)
    rec.finish.append(math.nan)
    rec.outcome.append(CANCELLED)
    rec.items.append(0)
    return len(rec.arrival) - 1


async def _open_loop(sender: _Sender, times: np.ndarray, control: _Control) -> _Record:
    loop = asyncio.get_running_loop()
    await sender.open()
    rec = _Record()
    rec.t0 = loop.time() + 0.005
    # Finished tasks are dropped at once: thousands kept alive make the GC's pauses long
    # enough to push the sends behind schedule.
    in_flight: set[asyncio.Task[None]] = set()

    async def send_on_schedule() -> None:
        for t in times.tolist():
            due = rec.t0 + t
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            k = _new_slot(rec, t)
            rec.lag.append(max(loop.time() - due, 0.0))
            control.sent += 1
            task = asyncio.ensure_future(sender.send(rec, k))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)

    control.sending = asyncio.ensure_future(send_on_schedule())
    try:
        await control.sending
    except asyncio.CancelledError:
        if control.stopped_at is None:
            raise  # the run itself was cancelled, not stopped
    while in_flight:
        await asyncio.wait(set(in_flight))
    await sender.close()
    return rec


async def _closed_loop(
    sender: _Sender, clients: int, think_s: float, duration_s: float, control: _Control
) -> _Record:
    loop = asyncio.get_running_loop()
    await sender.open()
    rec = _Record()
    rec.t0 = loop.time()
    end = rec.t0 + duration_s

    async def client() -> None:
        while loop.time() < end and control.stopped_at is None:
            k = _new_slot(rec, loop.time() - rec.t0)
            control.sent += 1
            await sender.send(rec, k)
            if think_s:
                await asyncio.sleep(think_s)

    await asyncio.gather(*(client() for _ in range(clients)))
    await sender.close()
    return rec


def _result(
    method: RunnerMethod | None,
    rec: _Record,
    duration_s: float,
    batches_before: int,
    label: str,
) -> RunResult:
    if method is not None:
        snap = method.stats()
        snap_config = snap.config.as_dict()
        held = method.batch_records(snap.batches - batches_before)
    else:
        snap_config, held = {}, []
    return RunResult(
        arrival_s=np.asarray(rec.arrival, dtype=float),
        start_s=np.asarray(rec.start, dtype=float),
        finish_s=np.asarray(rec.finish, dtype=float),
        outcome=np.asarray(rec.outcome, dtype=np.int8),
        items=np.asarray(rec.items, dtype=np.int64),
        batch_start_s=np.asarray([b.start_s - rec.t0 for b in held], dtype=float),
        batch_duration_s=np.asarray([b.duration_s for b in held], dtype=float),
        batch_items=np.asarray([b.items for b in held], dtype=np.int64),
        batch_requests=np.asarray([b.requests for b in held], dtype=np.int64),
        batch_reason=np.asarray([REASONS.index(b.reason) for b in held], dtype=np.int8),
        duration_s=float(duration_s),
        label=label,
        config=snap_config,
        send_lag_s=np.asarray(rec.lag, dtype=float) if rec.lag else None,
    )


def _warn_if_behind(lag_s: np.ndarray, rate_rps: float, stacklevel: int = 1) -> None:
    p99 = float(np.percentile(lag_s, 99))
    if p99 > _LAG_LIMIT_S:
        warnings.warn(
            LoadWarning(
                f"the load generator could not keep {rate_rps:,.0f} req/s: sends fell behind "
                f"schedule by up to {lag_s.max() * 1000:.1f} ms (p99 {p99 * 1000:.1f} ms); "
                "latencies are measured from the intended send times"
            ),
            stacklevel=stacklevel + 1,
        )
