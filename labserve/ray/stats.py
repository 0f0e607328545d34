"""One view of many replicas: their snapshots merged, with each replica's own kept.

Counts, rates, histograms (the latency and queue-wait buckets, batch sizes, fire reasons)
add up exactly. Percentiles do not add: the all-time ones are read from the merged
latency buckets (Prometheus's ``histogram_quantile``, linear within a bucket); the
window ones are the highest replica's, an upper bound (a merged percentile never exceeds
the largest of the parts' same percentile). Pure functions of immutable snapshots;
thread-safe.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from labserve.metrics.snapshot import Percentiles, Snapshot

__all__ = ["bucket_quantile_ms", "merge_snapshots", "stats_payload"]

_SUMMED = (
    "queue_requests",
    "queue_items",
    "in_flight_batches",
    "tokens_total",
    "padding_tokens_total",
    "admitted",
    "served",
    "rejected",
    "failed",
    "cancelled",
    "refused",
    "timeout",
    "stuck_batches",
    "batches",
    "arrival_rate",
    "served_rate",
    "rejected_rate",
    "failed_rate",
    "latency_sum_s",
    "queue_wait_sum_s",
)
_QS = (50.0, 95.0, 99.0, 99.9)


def _sum_buckets(parts: Sequence[tuple[tuple[float, int], ...]]) -> tuple[tuple[float, int], ...]:
    parts = [p for p in parts if p]
    if not parts:
        return ()
    bounds = [b for b, _ in parts[0]]
    if any([b for b, _ in p] != bounds for p in parts):
        raise ValueError("replicas report latency buckets at different bounds")
    return tuple((b, sum(p[i][1] for p in parts)) for i, b in enumerate(bounds))


def bucket_quantile_ms(buckets: tuple[tuple[float, int], ...], q: float, total: int) -> float:
    """The ``q``-th percentile (0-100) from cumulative (bound_s, count) buckets, in ms.

    Linear within the bucket holding the rank, as Prometheus's ``histogram_quantile``;
    NaN with no samples; the last bound when the rank lies past it.
    """
    if total <= 0 or not buckets:
        return math.nan
    rank = q / 100.0 * total
    lower_bound, lower_count = 0.0, 0
    for bound, count in buckets:
        if count >= rank:
            inside = count - lower_count
            share = (rank - lower_count) / inside if inside else 1.0
            return 1000.0 * (lower_bound + (bound - lower_bound) * share)
        lower_bound, lower_count = bound, count
    return 1000.0 * buckets[-1][0]


def _weighted(values: Sequence[float], weights: Sequence[float]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if not math.isnan(v) and w > 0]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else math.nan


def _max_percentiles(parts: Sequence[Percentiles]) -> Percentiles:
    def top(i: int) -> float:
        seen = [p[i] for p in parts if not math.isnan(p[i])]
        return max(seen) if seen else math.nan

    return Percentiles(*(top(i) for i in range(4)))


def merge_snapshots(snaps: Sequence[Snapshot]) -> Snapshot:
    """One snapshot of a method served by several replicas (see the module's rules).

    The config is the first snapshot's (every replica runs the same one once a change has
    reached them all; the per-replica view shows each one's).
    """
    if not snaps:
        raise ValueError("merge_snapshots needs at least one snapshot")
    first = snaps[0]
    if len(snaps) == 1:
        return first
    sums: dict[str, Any] = {f: sum(getattr(s, f) for s in snaps) for f in _SUMMED}
    lat = _sum_buckets([s.latency_buckets for s in snaps])
    wait = _sum_buckets([s.queue_wait_buckets for s in snaps])
    served_total = lat[-1][1] if lat else 0  # requests with a latency (the last bucket's)
    overall_total = sums["served"]
    batch_sizes: Counter[int] = Counter()
    reasons: Counter[str] = Counter()
    for s in snaps:
        batch_sizes.update(s.batch_size_counts)
        reasons.update(s.fire_reasons)
    # Batches per second of a replica ~ its served rate / its mean batch (one row a request).
    batch_rates = [
        s.served_rate / s.mean_batch_size if s.mean_batch_size > 0 else 0.0 for s in snaps
    ]
    recent = sorted((b for s in snaps for b in s.recent_batches), key=lambda b: b.start_s)
    keep = max(len(s.recent_batches) for s in snaps)
    served_rates = [s.served_rate for s in snaps]
    return dataclasses.replace(
        first,
        time_s=max(s.time_s for s in snaps),
        **sums,
        latency_buckets=lat,
        queue_wait_buckets=wait,
        latency_ms_overall=_overall(lat, max(served_total, overall_total)),
        queue_wait_ms_overall=_overall(wait, max(served_total, overall_total)),
        latency_ms_window=_max_percentiles([s.latency_ms_window for s in snaps]),
        queue_wait_ms_window=_max_percentiles([s.queue_wait_ms_window for s in snaps]),
        mean_batch_size=_weighted([s.mean_batch_size for s in snaps], batch_rates),
        max_batch_size_seen=max(s.max_batch_size_seen for s in snaps),
        batch_size_counts=dict(sorted(batch_sizes.items())),
        fire_reasons=dict(reasons),
        recent_batches=tuple(recent[-keep:]) if keep else (),
        cost_fit=max((s.cost_fit for s in snaps), key=lambda f: f.samples),
        model_ms_per_request=_weighted([s.model_ms_per_request for s in snaps], served_rates),
        model_busy_fraction=_weighted([s.model_busy_fraction for s in snaps], [1.0] * len(snaps)),
        latency_slo_met=_weighted([s.latency_slo_met for s in snaps], served_rates),
        latency_budget_ms=_weighted([s.latency_budget_ms for s in snaps], [1.0] * len(snaps)),
        tokens_per_batch=_weighted([s.tokens_per_batch for s in snaps], batch_rates),
        padding_fraction=_weighted(
            [s.padding_fraction for s in snaps],
            [r * _zero_nan(s.tokens_per_batch) for r, s in zip(batch_rates, snaps, strict=True)],
        ),
    )


def _zero_nan(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def _overall(buckets: tuple[tuple[float, int], ...], total: int) -> Percentiles:
    # The buckets count requests at or under the last bound; the rest lie past it.
    return Percentiles(*(bucket_quantile_ms(buckets, q, total) for q in _QS))


def stats_payload(runner: str, per_replica: Mapping[str, Sequence[Snapshot]]) -> dict[str, Any]:
    """The JSON of ``/stats`` on Ray: ``{runner: {method: merged}}`` and a per-replica view.

    ``per_replica`` maps a replica's id to its snapshots (one per batchable method).
    """
    by_method: dict[str, list[Snapshot]] = {}
    for snaps in per_replica.values():
        for s in snaps:
            by_method.setdefault(s.method, []).append(s)
    return {
        runner: {m: merge_snapshots(snaps).as_dict() for m, snaps in by_method.items()},
        "replicas": {
            rid: {runner: {s.method: s.as_dict() for s in snaps}}
            for rid, snaps in sorted(per_replica.items())
        },
    }
