"""What a batch queue records: arrivals (counted in bulk), outcomes, batches, and its snapshot.

:class:`Tally` owns the queue's :class:`~labserve.metrics.recorder.Recorder` (none when the
queue is built with ``record=False``: the simulator records its run elsewhere) and the
arrival rate the strategies plan with. Arrivals are counted in bulk, at the next poll or
snapshot (:meth:`Tally.flush`): they come in bursts, one event-loop iteration's worth. Not
thread-safe: the queue's one owner calls everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labserve.batching.estimators import CostModel, RateEstimator
from labserve.batching.requests import Batch, Outcome
from labserve.metrics.recorder import Recorder
from labserve.metrics.snapshot import BatchRecord, CostFitView, Snapshot

__all__ = ["Tally"]


class Tally:
    """One queue's records: its optional Recorder, the arrival rate, arrivals not yet counted."""

    __slots__ = ("label", "new_at", "new_items", "new_requests", "rate", "recorder")

    def __init__(self, label: str, recorder: Recorder | None, rate: RateEstimator) -> None:
        self.label = label
        self.recorder = recorder
        """Where traffic is recorded (None: nothing is kept but the rate)."""
        self.rate = rate
        self.new_requests = 0
        """Requests admitted since the last :meth:`flush` (with ``new_items`` and ``new_at``)."""
        self.new_items = 0
        self.new_at = 0.0

    def arrived(self, now: float, requests: int, items: int) -> None:
        """``requests`` holding ``items`` were admitted at ``now``: counted at the next flush."""
        self.new_requests += requests
        self.new_items += items
        self.new_at = now

    def flush(self) -> None:
        """Count the arrivals admitted since the last flush."""
        if self.new_requests:
            self.rate.observe(self.new_at, self.new_items, self.new_requests)
            if self.recorder is not None:
                self.recorder.arrived(self.new_at, self.new_requests)
            self.new_requests = self.new_items = 0

    def arrived_each(self, times: Sequence[float], items: int) -> None:
        """Requests of ``items`` each were admitted at each of ``times`` (counted now, in order)."""
        self.flush()  # earlier single admissions first
        self.rate.observe_each(times, items)
        if self.recorder is not None:
            self.recorder.arrived(times[-1], len(times))

    def refused(self, now: float) -> None:
        """A request was refused at admission."""
        if self.recorder is not None:
            self.recorder.refused(now)

    def rejected(self, now: float) -> None:
        """A queued request was rejected for overload."""
        if self.recorder is not None:
            self.recorder.rejected(now)

    def timed_out(self, now: float) -> None:
        """A request passed its request timeout."""
        if self.recorder is not None:
            self.recorder.timed_out(now)

    def cancelled(self, now: float) -> None:
        """A caller withdrew its request."""
        if self.recorder is not None:
            self.recorder.cancelled(now)

    def failed(self, now: float, n: int) -> None:
        """``n`` requests got an error from their batch (or from an abort)."""
        if self.recorder is not None:
            self.recorder.failed(now, n)

    def served(self, now: float, done: list[Outcome]) -> None:
        """The requests of ``done`` got their results at ``now``."""
        if self.recorder is not None:
            arrivals = [r.arrival_s for r, _, _ in done]
            starts = [now if r.start_s is None else r.start_s for r, _, _ in done]
            self.recorder.served(now, arrivals, starts)

    def batch(self, batch: Batch, duration_s: float) -> None:
        """``batch`` ended after ``duration_s`` and freed its slot."""
        if self.recorder is not None:
            tokens = batch.tokens
            padding = tokens - batch.true_tokens if tokens else 0
            record = BatchRecord(
                batch.start_s,
                duration_s,
                batch.items,
                len(batch.parts),
                batch.reason,
                tokens,
                padding,
            )
            self.recorder.batch(record)

    def kept(self) -> Recorder:
        """The Recorder; LookupError if the queue keeps none."""
        if self.recorder is None:
            raise LookupError(f"{self.label} keeps no records (built with record=False)")
        return self.recorder

    def snapshot(self, now: float, cost_model: CostModel, **state: Any) -> Snapshot:
        """The Recorder's snapshot at ``now``, with the queue's ``state`` and the cost fit."""
        recorder = self.kept()
        self.flush()
        fit = cost_model.fit
        items, _ = cost_model.observations()
        low, high = (int(items.min()), int(items.max())) if len(items) else (0, 0)
        view = CostFitView(
            fit.a_s * 1000.0, fit.b_s * 1000.0, fit.samples, low, high, fit.c_s * 1000.0, fit.width
        )
        return recorder.snapshot(now, cost_fit=view, **state)
