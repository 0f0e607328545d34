"""A discrete-event run of the real BatchQueue and strategies on virtual time.

Nothing here re-implements batching: arrivals, batch completions and the queue's own
timer are fed to the same :class:`~labserve.batching.queue.BatchQueue` the asyncio driver
runs, and its decisions are carried out on virtual time. Same seed, same result.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from labserve.base.clock import SimClock
from labserve.base.vocabulary import REASONS, REFUSED, REJECTED, SERVED, TIMEOUT, Reason
from labserve.batching.bulk import BulkQueue
from labserve.batching.containers import Codec
from labserve.batching.estimators import RateEstimator
from labserve.batching.requests import Batch, Outcome, Request
from labserve.config.batching import BatchingConfig
from labserve.metrics.results import RunResult
from labserve.sim.batch_cost import BatchCost
from labserve.sim.handoff import delayed, handed_off, quantiles_s, restored

__all__ = ["LinearCost", "simulate"]

_DONE, _TIMER, _CHECK = 0, 1, 2  # heap events: a batch ends; the wake; a timeout check
_REASON_CODE = {reason: code for code, reason in enumerate(REASONS)}


@dataclass(frozen=True)
class LinearCost:
    """Model cost of a batch: ``a_ms + b_ms * items``, optionally with seeded jitter.

    ``jitter`` scales each batch's time by a uniform factor in ``[1 - jitter, 1 + jitter]``.

    >>> LinearCost(2.0, 0.1).seconds(10)
    0.003
    """

    a_ms: float
    b_ms: float = 0.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a_ms", "b_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"jitter must be a number in [0, 1), got {self.jitter!r}")

    def seconds(self, items: int) -> float:
        """The batch's time without jitter, in seconds."""
        return (self.a_ms + self.b_ms * items) / 1000.0


CostLike = LinearCost | BatchCost | tuple[float, float] | Callable[[int], float]


def _cost_function(cost: CostLike, seed: int) -> Callable[[int], float]:
    if isinstance(cost, tuple):
        cost = LinearCost(*cost)
    if isinstance(cost, BatchCost):
        return cost.timer(seed)
    if isinstance(cost, LinearCost):
        if cost.jitter == 0.0:
            return cost.seconds
        rng = np.random.default_rng([seed, 1])
        low, high = 1.0 - cost.jitter, 1.0 + cost.jitter
        linear = cost
        return lambda items: linear.seconds(items) * float(rng.uniform(low, high))
    if callable(cost):
        return cost
    raise TypeError(
        "cost must be LinearCost, BatchCost, (a_ms, b_ms) or a callable items -> seconds,"
        f" got {cost!r}"
    )


def simulate(
    arrivals: Any,
    *,
    duration_s: float | None = None,
    seed: int = 0,
    cost: CostLike = (2.0, 0.1),
    items_per_request: int = 1,
    handoff_ms: float | Sequence[float] = 0.0,
    arrival_delay_ms: float | Sequence[float] = 0.0,
    label: str = "",
    input_len: Any = None,
    pad: Any = None,
    **batching: Any,
) -> RunResult:
    """Run a trace through the batching core on virtual time; return its RunResult.

    ``input_len`` (a length distribution or its string, ``"lognormal:16:128"``; see
    :mod:`labserve.base.lengths`) simulates a method with a ragged axis: each arrival draws
    its length, batches pad (``pad``: a Padding, default axis 1), ``batching`` may set
    ``max_batch_tokens``, ``length_buckets`` and ``padding``, and ``cost`` takes
    ``(items, padded_tokens)`` (a :class:`~labserve.lab.surface.TokenCost` or a profiled
    surface; see :mod:`labserve.sim.ragged`).

    ``arrivals`` is a sorted sequence of arrival times (seconds), or anything with a
    ``times(duration_s, seed=...)`` method (an arrival process: then ``duration_s`` is
    required). ``batching`` takes BatchingConfig settings (strategy, max_batch_size,
    max_latency_ms, on_overload, max_queue_size, max_concurrent_batches). Deterministic:
    the same arguments give the same result, on any machine.

    ``handoff_ms`` is each request's time outside the queue and the model in a real
    run: getting from the caller to the queue, and its result from the finished batch
    back to the caller (thread hand-overs, the event loop, waking the caller). It is
    added to each served request's finish time and holds no batch slot, so batching is
    unchanged. Measure it on a real run (``finish_s`` minus its batch's end, plus the
    send lag): it is a property of the runtime and the machine, not of the model.
    A sequence is that time's quantiles as measured (evenly spaced in probability, first
    the minimum): each served request draws its own (seeded), so a run's tail of late
    hand-offs (the loop busy when a batch ends) reaches the simulated p99 too.
    ``arrival_delay_ms`` (a number or quantiles, one drawn per request) is how long after
    its arrival a request reaches the queue (a load generator's send lag, the hop to the
    loop): it moves the request's entry into the queue, not its answer (a request late into
    a queue that holds it anyway, while a batch runs, loses nothing), and its latency and
    queue wait still count from the arrival. :func:`labserve.calibrate`
    measures it, the hand-off and ``cost`` on a live ``load_test``:
    ``simulate(arrivals, **cal.simulate_kwargs())``.

    >>> r = simulate([0.0, 0.0005, 0.001], cost=(2.0, 0.1), strategy="greedy")
    >>> r.summary()["batches"]
    2
    """
    if hasattr(arrivals, "times"):
        if duration_s is None:
            raise TypeError("simulate() needs duration_s to draw times from an arrival process")
        times = np.asarray(arrivals.times(duration_s, seed=seed), dtype=float)
    else:
        times = np.asarray(arrivals, dtype=float)
        if duration_s is None:
            duration_s = float(times[-1]) if len(times) else 0.0
    if times.ndim != 1 or (len(times) and (np.any(np.diff(times) < 0) or times[0] < 0)):
        raise ValueError("arrivals must be increasing times in seconds from 0")
    if isinstance(items_per_request, bool) or not isinstance(items_per_request, int):
        raise TypeError(f"items_per_request must be an integer >= 1, got {items_per_request!r}")
    if items_per_request < 1:
        raise ValueError(f"items_per_request must be an integer >= 1, got {items_per_request}")
    handoff_q = quantiles_s(handoff_ms, "handoff_ms")
    delay_q = quantiles_s(arrival_delay_ms, "arrival_delay_ms")
    config = BatchingConfig(**batching)
    queued, order = delayed(times, delay_q, seed)
    if input_len is not None:
        if isinstance(input_len, (list, tuple, np.ndarray)) and order is not None:
            input_len = np.asarray(input_len)[order]  # each length stays with its request
        result = _simulate_ragged(queued, duration_s, seed, cost, input_len, pad, config, label)
    else:
        cost_s = _cost_function(cost, seed)
        # A latency target plans for the mean hand-off; each request gets its own after.
        mean_s = float(np.mean(handoff_q))
        result = _Run(queued, duration_s, cost_s, items_per_request, config, mean_s).go(label)
    return handed_off(restored(result, times, order), handoff_q, seed)


def _simulate_ragged(
    times: np.ndarray,
    duration_s: float,
    seed: int,
    cost: Any,
    input_len: Any,
    pad: Any,
    config: BatchingConfig,
    label: str,
) -> RunResult:
    """simulate() for a padded method: one drawn length per arrival (sim/ragged.py)."""
    from labserve.base.lengths import parse_length
    from labserve.sim.ragged import simulate_ragged

    if isinstance(input_len, (list, tuple, np.ndarray)):
        lengths = np.asarray(input_len, dtype=np.int64)
    else:
        dist = parse_length(input_len, name="input_len")
        lengths = dist.sample(np.random.default_rng([seed, 2]), len(times))
    if isinstance(cost, (tuple, LinearCost)) or not callable(cost):
        raise TypeError(
            "with input_len, cost must price (items, padded_tokens): a TokenCost"
            f" (labserve.lab.surface), a BatchCost or a profiled CostSurface, got {cost!r}"
        )
    if isinstance(cost, BatchCost):
        cost = cost.timer(seed)  # its spread drawn per batch
    return simulate_ragged(
        times, lengths, cost=cost, config=config, padding=pad, duration_s=duration_s, label=label
    )


class _Run:
    """One simulation's state: the queue, the event heap and the per-request records."""

    def __init__(
        self,
        times: np.ndarray,
        duration_s: float,
        cost: Callable[[int], float],
        items: int,
        config: BatchingConfig,
        handoff_s: float,
    ) -> None:
        n = len(times)
        self.handoff_s = handoff_s  # what a latency target expects (finishes: _handed_off)
        self.times = times
        self.duration_s = duration_s
        self.cost = cost
        self.items = items
        self.config = config
        # Only a latency target reads the arrival rate, and a simulation's config never
        # changes: otherwise its arrivals need not be folded into an estimate nobody reads.
        unread = config.effective_strategy != "adaptive" or not config.latency_slo_ms
        # A simulation's record is its RunResult: the queue keeps none (the live recorder's
        # ring buffers and histograms feed snapshots nobody can take of a simulation, and
        # would cost it a third of its time).
        self.queue = BulkQueue(
            "sim",
            Codec("sim"),
            config,
            runner="sim",
            record=False,
            rate=RateEstimator(fold_every=None) if unread else None,
        )
        self.clock = SimClock()
        self.targeted = config.latency_slo_ms > 0 and config.effective_strategy == "adaptive"
        self.start = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.outcome = np.full(n, -1, dtype=np.int8)
        self.batches: list[tuple[float, float, int, int, Reason]] = []
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.wake: float | None = None
        self.check: float | None = None  # the queue's timeout check (request_timeout_ms)
        # Served runs of consecutive requests: (first, stop, batch start, finish), written
        # into the per-request arrays in one go at the end.
        self.runs: list[tuple[int, int, float, float]] = []
        self.quiet: int | None = 0  # items the queue may take before it must decide again
        # Set while every slot is busy and nothing queued waits for a deadline: the first
        # arrival only sets the queue's wake to its time plus this (its arrival_wake_s).
        self.arrival_wake: float | None = None
        # A request larger than the cap is split across batches; otherwise every request
        # of a batch started with it, and its results need no rejoining.
        self.whole = items <= config.max_batch_size
        self.nones: dict[int, list[None]] = {}

    def go(self, label: str) -> RunResult:
        heap, queue = self.heap, self.queue
        times = self.times.tolist()  # floats: indexing a list beats indexing an array
        # Every simulated request carries the same payload (a list: nothing to stack, only
        # items to count), so it is checked once, not once per request.
        request = queue.new_request(([None] * self.items,))
        n = len(times)
        i = 0
        while i < n or heap:
            next_event = heap[0][0] if heap else math.inf
            if i < n and times[i] < next_event:
                # Arrivals before the next event. While the queue says they cannot change
                # its decision, they are admitted together and it is asked once, after.
                quiet = self.quiet
                if quiet is None or quiet >= self.items:
                    i = self._admit_quiet(times, n, i, next_event, request)
                    continue
                now = times[i]
                admitted = queue.admit_many(request, times[i : i + 1], range(i, i + 1))
                i += 1
                if not admitted:
                    self.outcome[i - 1] = REFUSED
                    continue
            else:
                now, _, kind, what = heapq.heappop(heap)
                if kind == _TIMER:
                    if what != self.wake:
                        continue  # superseded by a later decision
                    self.wake = None
                elif kind == _CHECK:
                    if what != self.check:
                        continue
                    self.check = None
                else:
                    self._finished(what, now)
            self._carry_out(now)
        self._write_runs()
        return self._result(label)

    def _admit_quiet(
        self, times: list[float], n: int, i: int, next_event: float, request: Request
    ) -> int:
        """Admit with no poll the arrivals from ``times[i]`` that leave the decision standing.

        Those before ``next_event`` (the next batch end or timer), and no more than the
        queue's ``quiet_items`` allow. Returns the index of the first arrival not taken.
        """
        quiet, heap = self.quiet, self.heap
        wake_at = None
        if quiet is None:
            # Every slot is busy: every arrival up to the next live event goes in this one
            # call. Superseded timers before it would be popped and skipped in between
            # (nothing can revive them), so they are skipped now.
            if self.arrival_wake is not None:
                # The first arrival brings a deadline: the poll after it would only set
                # the wake there, so set it here, and admit no arrival past it.
                wake_at = times[i] + self.arrival_wake
            bound = math.inf if wake_at is None else wake_at
            wake = self.wake
            while heap and heap[0][2] == _TIMER and heap[0][3] != wake and heap[0][0] < bound:
                heapq.heappop(heap)
            next_event = heap[0][0] if heap else math.inf
            if wake_at is not None and wake_at < next_event:
                next_event = wake_at
            last = n
        else:
            last = min(n, i + quiet // self.items)  # quiet >= items: at least one
        j = bisect_left(times, next_event, i + 1, last)
        admitted = self.queue.admit_many(request, times[i:j], range(i, j))
        if admitted < j - i:
            self.outcome[i + admitted : j] = REFUSED
        if quiet is not None:
            self.quiet = quiet - admitted * self.items
        elif wake_at is not None and admitted:
            self.arrival_wake = None
            self._set_wake(wake_at)
        return j

    def _result(self, label: str) -> RunResult:
        b = np.array([row[:4] for row in self.batches], dtype=float).reshape(-1, 4)
        reasons = np.array([_REASON_CODE[row[4]] for row in self.batches], dtype=np.int8)
        return RunResult(
            arrival_s=self.times,
            start_s=self.start,
            finish_s=self.finish,
            outcome=self.outcome,
            items=np.full(len(self.times), self.items, dtype=np.int64),
            batch_start_s=b[:, 0],
            batch_duration_s=b[:, 1],
            batch_items=b[:, 2].astype(np.int64),
            batch_requests=b[:, 3].astype(np.int64),
            batch_reason=reasons,
            duration_s=float(self.duration_s),
            label=label,
            config=self.config.as_dict(),
        )

    def _carry_out(self, now: float) -> None:
        self.clock.advance_to(now)  # virtual time: never backwards, or the run is wrong
        step = self.queue.poll(now)
        self.quiet = self.queue.quiet_items
        self.arrival_wake = self.queue.arrival_wake_s
        if step.rejected:
            self._record(step.rejected, REJECTED, now)
        if step.timed_out:
            self._record(step.timed_out, TIMEOUT, now)
        for batch in step.fire:
            seconds = self.cost(batch.items)
            self.batches.append((now, seconds, batch.items, len(batch.parts), batch.reason))
            self.seq += 1
            heapq.heappush(self.heap, (now + seconds, self.seq, _DONE, batch))
        if step.wake_s is not None:
            self._set_wake(step.wake_s)
        check = step.timeout_check_s
        if check is not None and check != self.check:
            # Its own timer: set only when it moves (rarely), not alternating with wake_s.
            self.check = check
            self.seq += 1
            heapq.heappush(self.heap, (check, self.seq, _CHECK, check))

    def _set_wake(self, wake_s: float) -> None:
        if wake_s != self.wake:
            self.wake = wake_s
            self.seq += 1
            heapq.heappush(self.heap, (wake_s, self.seq, _TIMER, wake_s))

    def _finished(self, batch: Batch, now: float) -> None:
        parts = batch.parts
        outputs: list[Any]
        if self.whole:
            # Whole requests' outputs are only handed back in the outcomes: one list of
            # Nones per length serves every batch.
            outputs = self.nones.get(len(parts)) or self.nones.setdefault(
                len(parts), [None] * len(parts)
            )
        else:
            outputs = [[None] * (b - a) for _, a, b in parts]
        done = self.queue.complete(batch, outputs, now)
        self.queue.release(batch, now, ok=True)
        if self.targeted:
            self.queue.answered(batch, now + self.handoff_s)
        if not done:
            return
        first, last = done[0][0].handle, done[-1][0].handle
        if self.whole and last - first == len(done) - 1:
            # Handles rise through a batch: these are one run of requests, all started
            # with this batch.
            self.runs.append((first, last + 1, batch.start_s, now))
        else:
            self._record(done, SERVED, now)

    def _write_runs(self) -> None:
        if not self.runs:
            return
        runs = np.array(self.runs)
        first, stop = runs[:, 0].astype(np.int64), runs[:, 1].astype(np.int64)
        lengths = stop - first
        # Every index of every run: a ramp, shifted at each run's start to its first.
        shift = np.repeat(first - (np.cumsum(lengths) - lengths), lengths)
        index = np.arange(int(lengths.sum())) + shift
        self.outcome[index] = SERVED
        self.start[index] = np.repeat(runs[:, 2], lengths)
        self.finish[index] = np.repeat(runs[:, 3], lengths)

    def _record(self, outcomes: Sequence[Outcome], code: int, now: float) -> None:
        for r, _, _ in outcomes:
            k = r.handle
            self.outcome[k] = code
            if r.start_s is not None:
                self.start[k] = r.start_s
            if code == SERVED:
                self.finish[k] = now
