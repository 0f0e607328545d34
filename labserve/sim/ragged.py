"""A discrete-event run of a padded method: every arrival draws a length, every batch pays tokens.

The same :class:`~labserve.batching.queue.BatchQueue` (with a ragged axis) and strategies
as a real run; a batch costs ``cost(items, padded_tokens)`` seconds (a
:class:`~labserve.lab.surface.TokenCost`, a profiled
:class:`~labserve.lab.surface.CostSurface`, or any such callable). Each request is one row
of its drawn length. Deterministic for a seed. Slower than the fixed-shape simulator (it
polls after every arrival, as the real driver does): tens of thousands of requests a
second, not hundreds of thousands.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from labserve.base.clock import SimClock
from labserve.base.errors import InputError, LabServeError
from labserve.base.vocabulary import CLIENT_ERROR, REASONS, REFUSED, REJECTED, SERVED, TIMEOUT
from labserve.batching.containers import Codec
from labserve.batching.padding import Padding, Ragged
from labserve.batching.queue import BatchQueue
from labserve.batching.requests import Batch, Outcome, Request
from labserve.config.batching import BatchingConfig
from labserve.metrics.results import RunResult

__all__ = ["simulate_ragged"]

_DONE, _TIMER, _CHECK = 0, 1, 2
_REASON_CODE = {reason: code for code, reason in enumerate(REASONS)}
TokenCostLike = Callable[[int, int], float]


def simulate_ragged(
    times: np.ndarray,
    lengths: np.ndarray,
    *,
    cost: TokenCostLike,
    config: BatchingConfig,
    padding: Padding | None = None,
    duration_s: float,
    handoff_s: float = 0.0,
    label: str = "",
) -> RunResult:
    """Run arrivals at ``times``, one row of ``lengths[i]`` tokens each, on virtual time.

    ``padding`` is the method's ragged axis (default: axis 1, no multiple). Requests the
    queue refuses at admission end ``client_error`` (a row over ``max_batch_tokens``: a
    400) or ``refused`` (a full queue). The RunResult carries each batch's padded and
    padding tokens.
    """
    if len(lengths) != len(times):
        raise ValueError(f"one length per arrival: {len(times)} arrivals, {len(lengths)} lengths")
    run = _RaggedRun(times, lengths, cost, config, padding or Padding(lengths_arg=None))
    return run.go(duration_s, handoff_s, label)


class _RaggedRun:
    def __init__(
        self,
        times: np.ndarray,
        lengths: np.ndarray,
        cost: TokenCostLike,
        config: BatchingConfig,
        padding: Padding,
    ) -> None:
        self.times = times
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.cost = cost
        self.config = config
        self.codec = Codec("sim", padding=padding)
        self.queue = BatchQueue("sim", self.codec, config, runner="sim", record=False)
        self.clock = SimClock()
        n = len(times)
        self.start = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.outcome = np.full(n, -1, dtype=np.int8)
        self.batches: list[tuple[float, float, int, int, int, int, int]] = []
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.wake: float | None = None
        self.check: float | None = None
        self.targeted = config.latency_slo_ms > 0 and config.effective_strategy == "adaptive"
        self.handoff_s = 0.0

    def _request(self, i: int) -> Request:
        # What codec.admit makes of one row of this length, without building the row: the
        # simulation never calls a model, so the data is never read, only the lengths.
        length = int(self.lengths[i])
        ragged = Ragged(np.empty((1, 0), dtype=np.int8), np.array([length]), False, 1)
        r = Request(-1, (ragged,), 1, ("t", ragged.signature(0)), i)
        r.lengths = ragged.lengths
        return r

    def go(self, duration_s: float, handoff_s: float, label: str) -> RunResult:
        self.handoff_s = handoff_s
        times = self.times.tolist()
        heap, queue = self.heap, self.queue
        n, i = len(times), 0
        while i < n or heap:
            next_event = heap[0][0] if heap else math.inf
            if i < n and times[i] <= next_event:
                now = times[i]
                try:
                    queue.admit(self._request(i), now)
                except InputError:  # a row over max_batch_tokens: the caller's 400
                    self.outcome[i] = CLIENT_ERROR
                except LabServeError:
                    self.outcome[i] = REFUSED
                i += 1
            else:
                now, _, kind, what = heapq.heappop(heap)
                if kind == _TIMER:
                    if what != self.wake:
                        continue
                    self.wake = None
                elif kind == _CHECK:
                    if what != self.check:
                        continue
                    self.check = None
                else:
                    self._finished(what, now)
            self._carry_out(now)
        return self._result(duration_s, label)

    def _carry_out(self, now: float) -> None:
        self.clock.advance_to(now)
        step = self.queue.poll(now)
        if step.rejected:
            self._record(step.rejected, REJECTED, now)
        if step.timed_out:
            self._record(step.timed_out, TIMEOUT, now)
        for batch in step.fire:
            seconds = float(self.cost(batch.items, batch.tokens))
            padding = batch.tokens - batch.true_tokens
            reason = _REASON_CODE[batch.reason]
            self.batches.append(
                (now, seconds, batch.items, len(batch.parts), reason, batch.tokens, padding)
            )
            self.seq += 1
            heapq.heappush(self.heap, (now + seconds, self.seq, _DONE, batch))
        if step.wake_s is not None and step.wake_s != self.wake:
            self.wake = step.wake_s
            self.seq += 1
            heapq.heappush(self.heap, (step.wake_s, self.seq, _TIMER, step.wake_s))
        check = step.timeout_check_s
        if check is not None and check != self.check:
            self.check = check
            self.seq += 1
            heapq.heappush(self.heap, (check, self.seq, _CHECK, check))

    def _finished(self, batch: Batch, now: float) -> None:
        outputs = [[None] * (b - a) for _, a, b in batch.parts]
        done = self.queue.complete(batch, outputs, now)
        self.queue.release(batch, now, ok=True)
        if self.targeted:
            self.queue.answered(batch, now + self.handoff_s)
        self._record(done, SERVED, now + self.handoff_s)

    def _record(self, outcomes: list[Outcome], code: int, now: float) -> None:
        for r, _, _ in outcomes:
            k = r.handle
            self.outcome[k] = code
            if r.start_s is not None:
                self.start[k] = r.start_s
            if code == SERVED:
                self.finish[k] = now

    def _result(self, duration_s: float, label: str) -> RunResult:
        b = np.array(self.batches, dtype=float).reshape(-1, 7)
        return RunResult(
            arrival_s=self.times,
            start_s=self.start,
            finish_s=self.finish,
            outcome=self.outcome,
            items=np.ones(len(self.times), dtype=np.int64),
            batch_start_s=b[:, 0],
            batch_duration_s=b[:, 1],
            batch_items=b[:, 2].astype(np.int64),
            batch_requests=b[:, 3].astype(np.int64),
            batch_reason=b[:, 4].astype(np.int8),
            duration_s=float(duration_s),
            label=label,
            config=self.config.as_dict(),
            batch_tokens=b[:, 5].astype(np.int64),
            batch_padding_tokens=b[:, 6].astype(np.int64),
        )
