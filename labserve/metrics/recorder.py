"""The recorder: bounded, O(1)-per-request records of a runner method's traffic.

Writes come from the queue's owner (the loop thread or the simulator), per request only
for counters and per batch for samples; reads build an immutable :class:`Snapshot`.
Not thread-safe: take snapshots on the owner's thread (the runner does).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from labserve.base.vocabulary import RUNNER_OUTCOMES
from labserve.config.batching import BatchingConfig
from labserve.metrics.histogram import LogHistogram
from labserve.metrics.snapshot import BatchRecord, CostFitView, Percentiles, Snapshot

__all__ = ["Recorder"]

_QS = (50.0, 95.0, 99.0, 99.9)
# Histogram bounds (seconds) exported to Prometheus.
LATENCY_BOUNDS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_KINDS = ("arrived", *RUNNER_OUTCOMES)  # counted per kind; a Snapshot field each
_ARRIVED, _SERVED, _REJECTED, _FAILED, _CANCELLED, _REFUSED, _TIMEOUT = map(
    _KINDS.index, ("arrived", "served", "rejected", "failed", "cancelled", "refused", "timeout")
)


class _RateBuckets:
    """Counts per kind in time buckets covering the sliding window (a ring over time)."""

    def __init__(self, window_s: float, width_s: float = 0.25) -> None:
        self.width = width_s
        self.n = math.ceil(window_s / width_s) + 1
        self.epoch = [-1] * self.n
        self.counts = [[0] * len(_KINDS) for _ in range(self.n)]
        self.start_s: float | None = None

    def add(self, now: float, kind: int, n: int = 1) -> None:
        if self.start_s is None:
            self.start_s = now
        b = int(now // self.width)
        i = b % self.n
        if self.epoch[i] != b:
            self.epoch[i] = b
            row = self.counts[i]
            for k in range(len(row)):
                row[k] = 0
        self.counts[i][kind] += n

    def rates(self, now: float, window_s: float) -> list[float]:
        b_now = int(now // self.width)
        first = b_now - self.n + 2  # whole buckets inside the window, plus the current one
        totals = [0] * len(_KINDS)
        for i in range(self.n):
            if first <= self.epoch[i] <= b_now:
                for k, c in enumerate(self.counts[i]):
                    totals[k] += c
        span = min(window_s, now - first * self.width)
        if self.start_s is not None:
            span = min(span, now - self.start_s)
        if span <= 0:
            return [0.0] * len(_KINDS)
        return [t / span for t in totals]


_QS_FRACTION = np.asarray(_QS) / 100.0

# Served requests held back before their latencies are filed (any read files them first).
_FILE_EVERY = 1024


def _percentiles_ms(samples: np.ndarray) -> Percentiles:
    """np.percentile's linear interpolation, from one partial sort (a dashboard asks often)."""
    n = len(samples)
    if n == 0:
        return Percentiles(math.nan, math.nan, math.nan, math.nan)
    position = _QS_FRACTION * (n - 1)
    below = np.floor(position).astype(np.intp)
    above = np.minimum(below + 1, n - 1)
    ordered = np.partition(samples, np.union1d(below, above))
    low, high = ordered[below], ordered[above]
    values = low + (high - low) * (position - below)
    return Percentiles(*(float(v) * 1000.0 for v in values))


class Recorder:
    """Counters, windowed samples and all-time histograms of one runner method."""

    def __init__(
        self, window_s: float = 10.0, capacity: int = 1 << 16, batch_capacity: int = 4096
    ) -> None:
        self.window_s = window_s
        self._capacity = capacity
        self._batch_capacity = batch_capacity
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded (counters, samples, histograms)."""
        self.counts = [0] * len(_KINDS)
        self._rates = _RateBuckets(self.window_s)
        self._finish = np.full(self._capacity, -np.inf)
        self._latency = np.zeros(self._capacity)
        self._wait = np.zeros(self._capacity)
        self._pos = 0
        self.latency_hist = LogHistogram()
        self.wait_hist = LogHistogram()
        self.latency_sum_s = 0.0
        self.wait_sum_s = 0.0
        # Batches served but not yet filed into the samples and histograms (see served()).
        self._unfiled: list[tuple[float, Sequence[float], Sequence[float]]] = []
        self._unfiled_n = 0
        self._batches: list[BatchRecord | None] = [None] * self._batch_capacity
        # Start times and sizes again, as arrays: the windowed mean batch is one vector op.
        self._batch_start = np.full(self._batch_capacity, -np.inf)
        self._batch_items = np.zeros(self._batch_capacity)
        self._batch_duration = np.zeros(self._batch_capacity)
        self._batch_requests = np.zeros(self._batch_capacity)
        self._batch_tokens = np.zeros(self._batch_capacity)
        self._batch_padding = np.zeros(self._batch_capacity)
        self.tokens_total = self.padding_tokens_total = 0
        self._batch_pos = 0
        self.batch_size_counts: dict[int, int] = {}
        self.fire_reasons: dict[str, int] = {}

    # -- writes (owner thread only) ---------------------------------------------------

    def arrived(self, now: float, n: int = 1) -> None:
        """``n`` requests were admitted."""
        self.counts[_ARRIVED] += n
        self._rates.add(now, _ARRIVED, n)

    def refused(self, now: float) -> None:
        """A request was refused at admission."""
        self.counts[_REFUSED] += 1
        self._rates.add(now, _REFUSED)

    def rejected(self, now: float) -> None:
        """An admitted request was rejected for overload."""
        self.counts[_REJECTED] += 1
        self._rates.add(now, _REJECTED)

    def cancelled(self, now: float) -> None:
        """An admitted request was withdrawn by its caller."""
        self.counts[_CANCELLED] += 1
        self._rates.add(now, _CANCELLED)

    def failed(self, now: float, n: int = 1) -> None:
        """``n`` admitted requests failed."""
        self.counts[_FAILED] += n
        self._rates.add(now, _FAILED, n)

    def timed_out(self, now: float) -> None:
        """An admitted request outlived its request timeout."""
        self.counts[_TIMEOUT] += 1
        self._rates.add(now, _TIMEOUT)

    def served(self, now: float, arrivals: Sequence[float], starts: Sequence[float]) -> None:
        """Requests answered at ``now``, with their admission and first-batch-start times."""
        n = len(arrivals)
        if n == 0:
            return
        self.counts[_SERVED] += n
        self._rates.add(now, _SERVED, n)
        if n <= 8 and not self._unfiled:  # small: scalar Python beats numpy's per-call cost
            cap = self._capacity
            for arrival, start in zip(arrivals, starts, strict=True):
                latency_s, wait_s = now - arrival, start - arrival
                self.latency_hist.add(latency_s)
                self.wait_hist.add(wait_s)
                self.latency_sum_s += latency_s
                self.wait_sum_s += wait_s
                i = self._pos
                self._finish[i] = now
                self._latency[i] = latency_s
                self._wait[i] = wait_s
                self._pos = (i + 1) % cap
            return
        # Filed in bulk, later: numpy's cost per call is paid once for many batches, not
        # once per batch on the path that answers callers. Every read files first.
        self._unfiled.append((now, arrivals, starts))
        self._unfiled_n += n
        if self._unfiled_n >= _FILE_EVERY:
            self._file()

    def _file(self) -> None:
        """Add the unfiled batches' latencies and waits to the samples and histograms."""
        unfiled = self._unfiled
        if not unfiled:
            return
        n = self._unfiled_n
        self._unfiled = []
        self._unfiled_n = 0
        if len(unfiled) == 1:
            finish: float | np.ndarray = unfiled[0][0]
            arr = np.asarray(unfiled[0][1], dtype=float)
            started = np.asarray(unfiled[0][2], dtype=float)
        else:
            finish = np.repeat([u[0] for u in unfiled], [len(u[1]) for u in unfiled])
            arr = np.fromiter(itertools.chain.from_iterable(u[1] for u in unfiled), float, n)
            started = np.fromiter(itertools.chain.from_iterable(u[2] for u in unfiled), float, n)
        latency = finish - arr
        wait = started - arr
        self.latency_hist.add_many(latency)
        self.wait_hist.add_many(wait)
        self.latency_sum_s += float(latency.sum())
        self.wait_sum_s += float(wait.sum())
        cap = self._capacity
        if n >= cap:
            latency, wait, n = latency[-cap:], wait[-cap:], cap
            if isinstance(finish, np.ndarray):
                finish = finish[-cap:]
        pos = self._pos
        if pos + n <= cap:  # one slice, no wrap
            self._finish[pos : pos + n] = finish
            self._latency[pos : pos + n] = latency
            self._wait[pos : pos + n] = wait
        else:
            idx = (pos + np.arange(n)) % cap
            self._finish[idx] = finish
            self._latency[idx] = latency
            self._wait[idx] = wait
        self._pos = (pos + n) % cap

    def batch(self, record: BatchRecord) -> None:
        """A batch finished running."""
        slot = self._batch_pos % self._batch_capacity
        self._batches[slot] = record
        self._batch_start[slot] = record.start_s
        self._batch_items[slot] = record.items
        self._batch_duration[slot] = record.duration_s
        self._batch_requests[slot] = record.requests
        if record.tokens:
            self._tokens(slot, record)
        self._batch_pos += 1
        self.batch_size_counts[record.items] = self.batch_size_counts.get(record.items, 0) + 1
        self.fire_reasons[record.reason] = self.fire_reasons.get(record.reason, 0) + 1

    def _tokens(self, slot: int, record: BatchRecord) -> None:
        """A padded batch's tokens (only a method with a ragged axis has any)."""
        self._batch_tokens[slot] = record.tokens
        self._batch_padding[slot] = record.padding_tokens
        self.tokens_total += record.tokens
        self.padding_tokens_total += record.padding_tokens

    # -- reads ------------------------------------------------------------------------

    def window_tokens(self, now: float) -> tuple[float, float]:
        """(mean padded tokens per batch, padding fraction) of the window's batches (NaN: none)."""
        if not self.tokens_total:
            return math.nan, math.nan
        mask = self._batch_start >= now - self.window_s
        tokens = self._batch_tokens[mask]
        total = float(tokens.sum())
        if not total:
            return math.nan, math.nan
        return float(tokens.mean()), float(self._batch_padding[mask].sum()) / total

    @property
    def batches(self) -> int:
        """Batches recorded since start."""
        return self._batch_pos

    def batch_records(self, last: int | None = None) -> list[BatchRecord]:
        """The recorded batches still held, oldest first (at most ``last``)."""
        held = min(self._batch_pos, self._batch_capacity)
        if last is not None:
            held = min(held, last)
        start = self._batch_pos - held
        out = [self._batches[i % self._batch_capacity] for i in range(start, self._batch_pos)]
        return [r for r in out if r is not None]

    def rates(self, now: float) -> dict[str, float]:
        """Per-second rates over the window, by kind."""
        return dict(zip(_KINDS, self._rates.rates(now, self.window_s), strict=True))

    def window_percentiles(self, now: float) -> tuple[Percentiles, Percentiles]:
        """(latency, queue wait) percentiles in ms of requests served in the window."""
        self._file()
        mask = self._finish >= now - self.window_s
        return _percentiles_ms(self._latency[mask]), _percentiles_ms(self._wait[mask])

    def overall_percentiles(self) -> tuple[Percentiles, Percentiles]:
        """(latency, queue wait) percentiles in ms since start, from the histograms."""
        self._file()
        lat = self.latency_hist.percentiles(_QS)
        wait = self.wait_hist.percentiles(_QS)
        return (
            Percentiles(*(v * 1000.0 for v in lat)),
            Percentiles(*(v * 1000.0 for v in wait)),
        )

    def window_mean_batch(self, now: float) -> float:
        """Mean items per batch that started in the window (NaN without batches)."""
        items = self._batch_items[self._batch_start >= now - self.window_s]
        return float(items.mean()) if len(items) else math.nan

    def model_time(self, now: float, slots: int) -> tuple[float, float]:
        """(model ms per request, busy fraction) of the batches started in the window.

        Busy fraction: model time / (the window, or the time since the first record if
        shorter, x ``slots`` batch slots). NaN for both without batches.
        """
        mask = self._batch_start >= now - self.window_s
        requests = float(self._batch_requests[mask].sum())
        if not requests:
            return math.nan, math.nan
        busy_s = float(self._batch_duration[mask].sum())
        start = self._rates.start_s if self._rates.start_s is not None else now
        span = min(self.window_s, now - start)
        busy = busy_s / (span * slots) if span > 0 else math.nan
        return 1000.0 * busy_s / requests, busy

    def slo_met(self, now: float, target_s: float) -> float:
        """The share of requests served in the window within ``target_s`` (NaN: none)."""
        self._file()
        latency = self._latency[self._finish >= now - self.window_s]
        return float(np.mean(latency <= target_s)) if len(latency) else math.nan

    def buckets(self) -> tuple[tuple[tuple[float, int], ...], tuple[tuple[float, int], ...]]:
        """Cumulative (bound, count) pairs of latency and queue wait at LATENCY_BOUNDS_S."""
        self._file()
        lat = self.latency_hist.cumulative(LATENCY_BOUNDS_S)
        wait = self.wait_hist.cumulative(LATENCY_BOUNDS_S)
        return (
            tuple(zip(LATENCY_BOUNDS_S, lat, strict=True)),
            tuple(zip(LATENCY_BOUNDS_S, wait, strict=True)),
        )

    def counters(self) -> dict[str, int]:
        """Totals since start, by kind."""
        return dict(zip(_KINDS, self.counts, strict=True))

    def snapshot(
        self,
        now: float,
        *,
        runner: str,
        method: str,
        config: BatchingConfig,
        queue_requests: int,
        queue_items: int,
        in_flight_batches: int,
        stuck_batches: int,
        cost_fit: CostFitView,
        budget_s: float = 0.0,
    ) -> Snapshot:
        """What was recorded, with the queue's state as given, as one immutable Snapshot."""
        self._file()
        rates = self.rates(now)
        lat_w, wait_w = self.window_percentiles(now)
        lat_o, wait_o = self.overall_percentiles()
        counts = self.counters()
        lat_buckets, wait_buckets = self.buckets()
        model_ms, busy = self.model_time(now, config.max_concurrent_batches)
        target = config.latency_slo_s
        tokens_per_batch, padding_fraction = self.window_tokens(now)
        return Snapshot(
            runner=runner,
            method=method,
            time_s=now,
            window_s=self.window_s,
            config=config,
            queue_requests=queue_requests,
            queue_items=queue_items,
            in_flight_batches=in_flight_batches,
            admitted=counts["arrived"],
            served=counts["served"],
            rejected=counts["rejected"],
            failed=counts["failed"],
            cancelled=counts["cancelled"],
            refused=counts["refused"],
            timeout=counts["timeout"],
            stuck_batches=stuck_batches,
            model_ms_per_request=model_ms,
            model_busy_fraction=busy,
            latency_slo_met=self.slo_met(now, target) if target else math.nan,
            latency_budget_ms=budget_s * 1000.0 if budget_s else math.nan,
            arrival_rate=rates["arrived"],
            served_rate=rates["served"],
            rejected_rate=rates["rejected"] + rates["refused"],
            failed_rate=rates["failed"],
            latency_ms_window=lat_w,
            latency_ms_overall=lat_o,
            queue_wait_ms_window=wait_w,
            queue_wait_ms_overall=wait_o,
            batches=self.batches,
            mean_batch_size=self.window_mean_batch(now),
            max_batch_size_seen=max(self.batch_size_counts, default=0),
            batch_size_counts=dict(sorted(self.batch_size_counts.items())),
            fire_reasons=dict(self.fire_reasons),
            recent_batches=tuple(self.batch_records(last=64)),
            cost_fit=cost_fit,
            latency_buckets=lat_buckets,
            latency_sum_s=self.latency_sum_s,
            queue_wait_buckets=wait_buckets,
            queue_wait_sum_s=self.wait_sum_s,
            tokens_per_batch=tokens_per_batch,
            padding_fraction=padding_fraction,
            tokens_total=self.tokens_total,
            padding_tokens_total=self.padding_tokens_total,
        )
