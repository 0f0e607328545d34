"""Putting load on a runner method: open loop (arrivals on schedule) or closed loop (N clients).

Runs on labserve's background loop, so the calls are in-process and the notebook's own loop
is left alone. Latency is measured from each request's *intended* send time, so a generator
that falls behind cannot hide the queueing it caused (no coordinated omission); when it
falls behind it says so with a :class:`~labserve.errors.LoadWarning`.
"""

from __future__ import annotations

import asyncio
import math
import warnings
from typing import Any

import numpy as np

from labserve.batching.policy import REASONS
from labserve.errors import LabServeError, OverloadError, QueueFullError
from labserve.load.arrivals import Arrivals
from labserve.results import OUTCOMES, RunResult
from labserve.runner import RunnerMethod

__all__ = ["LoadWarning", "load_test"]

_SERVED, _REJECTED, _FAILED, _CANCELLED, _REFUSED = range(len(OUTCOMES))
# Behind schedule by more than this (p99), the run says it could not keep the rate.
_LAG_LIMIT_S = 0.005


class LoadWarning(UserWarning):
    """Warned when a load generator could not keep the asked rate (it fell behind schedule).

    Latencies stay measured from the intended send times, so they include the lag.
    """


def load_test(
    method: RunnerMethod,
    *,
    example: Any,
    duration_s: float,
    arrivals: Arrivals | None = None,
    concurrency: int | None = None,
    think_s: float = 0.0,
    seed: int = 0,
    label: str = "",
) -> RunResult:
    """Drive ``method`` with ``example`` requests for ``duration_s``; return the RunResult.

    Open loop with ``arrivals`` (an arrival process: requests go out on schedule whatever
    the replies), or closed loop with ``concurrency`` clients, each sending its next
    request ``think_s`` after its last reply. Blocks until the last reply; call it from a
    notebook cell or a script (not from labserve's loop). The batch arrays hold the
    run's batches as far as the runner's recorder still holds them (its last 4,096).

    >>> import labserve                                        # doctest: +SKIP
    >>> r = labserve.load_test(runner.predict, example=x, duration_s=5,
    ...                        arrivals=labserve.arrivals("poisson", rate_rps=2000))
    """
    if not method.batchable:
        raise TypeError(f"{method!r} is not batchable: load_test drives a batch queue")
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a finite number > 0, got {duration_s!r}")
    if (arrivals is None) == (concurrency is None):
        raise TypeError("load_test needs exactly one of arrivals= (open loop) or concurrency=")
    bg = method.runner.bg
    method._driver_started()  # start the loop and the driver before the clock does
    batches_before = _batch_count(method)
    if arrivals is not None:
        times = np.asarray(arrivals.times(duration_s, seed=seed), dtype=float)
        run = bg.run(_open_loop(method, example, times))
    else:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if think_s < 0:
            raise ValueError(f"think_s must be >= 0, got {think_s!r}")
        run = bg.run(_closed_loop(method, example, concurrency, think_s, duration_s))
    result = _result(method, run, duration_s, batches_before, label)
    if result.send_lag_s is not None and len(result.send_lag_s):
        _warn_if_behind(result.send_lag_s, len(result.arrival_s) / duration_s)
    return result


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


async def _one(method: RunnerMethod, example: Any, rec: _Record, k: int) -> None:
    """Send one request on labserve's loop and record its outcome."""
    loop = asyncio.get_running_loop()
    request, future = method._submit_on_loop((example,))
    rec.items[k] = request.items
    try:
        await future
        rec.outcome[k] = _SERVED
    except (OverloadError, QueueFullError) as exc:
        rec.outcome[k] = _REFUSED if isinstance(exc, QueueFullError) else _REJECTED
    except LabServeError:
        rec.outcome[k] = _FAILED
    rec.finish[k] = loop.time() - rec.t0
    if request.start_s is not None:
        rec.start[k] = request.start_s - rec.t0


def _new_slot(rec: _Record, intended_s: float) -> int:
    rec.arrival.append(intended_s)
    rec.start.append(math.nan)
    rec.finish.append(math.nan)
    rec.outcome.append(_CANCELLED)
    rec.items.append(0)
    return len(rec.arrival) - 1


async def _open_loop(method: RunnerMethod, example: Any, times: np.ndarray) -> _Record:
    loop = asyncio.get_running_loop()
    rec = _Record()
    rec.t0 = loop.time() + 0.005
    # Finished tasks are dropped at once: thousands kept alive make the GC's pauses long
    # enough to push the sends behind schedule.
    in_flight: set[asyncio.Task[None]] = set()
    for t in times.tolist():
        due = rec.t0 + t
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        k = _new_slot(rec, t)
        rec.lag.append(max(loop.time() - due, 0.0))
        task = asyncio.ensure_future(_one(method, example, rec, k))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    while in_flight:
        await asyncio.wait(set(in_flight))
    return rec


async def _closed_loop(
    method: RunnerMethod, example: Any, clients: int, think_s: float, duration_s: float
) -> _Record:
    loop = asyncio.get_running_loop()
    rec = _Record()
    rec.t0 = loop.time()
    end = rec.t0 + duration_s

    async def client() -> None:
        while loop.time() < end:
            k = _new_slot(rec, loop.time() - rec.t0)
            await _one(method, example, rec, k)
            if think_s:
                await asyncio.sleep(think_s)

    await asyncio.gather(*(client() for _ in range(clients)))
    return rec


def _batch_count(method: RunnerMethod) -> int:
    return method.stats().batches


def _result(
    method: RunnerMethod, rec: _Record, duration_s: float, batches_before: int, label: str
) -> RunResult:
    snap = method.stats()
    new = snap.batches - batches_before
    held = method._batch_records(new)
    reason_code: dict[str, int] = {r: i for i, r in enumerate(REASONS)}
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
        batch_reason=np.asarray([reason_code[b.reason] for b in held], dtype=np.int8),
        duration_s=float(duration_s),
        label=label,
        config=dict(snap.config),
        send_lag_s=np.asarray(rec.lag, dtype=float) if rec.lag else None,
    )


def _warn_if_behind(lag_s: np.ndarray, rate_rps: float) -> None:
    p99 = float(np.percentile(lag_s, 99))
    if p99 > _LAG_LIMIT_S:
        warnings.warn(
            LoadWarning(
                f"the load generator could not keep {rate_rps:,.0f} req/s: sends fell behind "
                f"schedule by up to {lag_s.max() * 1000:.1f} ms (p99 {p99 * 1000:.1f} ms); "
                "latencies are measured from the intended send times"
            ),
            stacklevel=3,
        )
