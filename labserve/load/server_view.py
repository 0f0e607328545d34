"""A labserve server's own view of a load run: its /stats before and after, subtracted.

Over HTTP the load generator sees only replies; a labserve server also knows how it
batched them. Its snapshot counters (requests by outcome, batches by size and by reason,
latency and queue-wait histograms) are cumulative, so the difference of two snapshots is
the interval between them. Pure functions over the JSON of ``GET /stats``; thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["find_method", "server_view"]

# (summary key, the snapshot window's key, percentile)
_QS = (("p50", "p50", 50.0), ("p95", "p95", 95.0), ("p99", "p99", 99.0), ("p99_9", "p999", 99.9))


def find_method(stats: Any, runner: str, method: str | None) -> dict[str, Any] | None:
    """The snapshot of ``runner.method`` in a /stats reply (``method`` None: the only one).

    None when the reply is not labserve's or does not hold that method.
    """
    if not isinstance(stats, Mapping):
        return None
    methods = stats.get(runner)
    if not isinstance(methods, Mapping):
        return None
    if method is None:
        if len(methods) != 1:
            return None
        (snap,) = methods.values()
    else:
        snap = methods.get(method)
    if not isinstance(snap, Mapping) or "batch_size_counts" not in snap:
        return None
    return dict(snap)


def server_view(
    before: Mapping[str, Any], after: Mapping[str, Any], duration_s: float
) -> dict[str, Any]:
    """What the server counted between two snapshots of one method.

    Counts, batches, mean and largest batch and fire reasons are exact for the interval
    (anything else the server served meanwhile is counted too). Latency (admission to
    result) and queue-wait percentiles come from the server's sliding window when the run
    covered the whole window (``percentiles_from: "window"``); otherwise they are
    interpolated within the server's histogram buckets (``"buckets"``: 0.5, 1, 2, 5, 10,
    20, 50 ms...), coarse but confined to the interval. Means are exact.
    """

    def delta(key: str) -> int:
        return int(after.get(key) or 0) - int(before.get(key) or 0)

    sizes = _delta_counts(before.get("batch_size_counts"), after.get("batch_size_counts"))
    reasons = _delta_counts(before.get("fire_reasons"), after.get("fire_reasons"))
    batches = sum(sizes.values())
    items = sum(int(size) * count for size, count in sizes.items())
    served = delta("served")
    view: dict[str, Any] = {
        "runner": after.get("runner"),
        "method": after.get("method"),
        "served": served,
        "rejected": delta("rejected"),
        "failed": delta("failed"),
        "refused": delta("refused"),
        "cancelled": delta("cancelled"),
        "batches": batches,
        "mean_batch": items / batches if batches else math.nan,
        "max_batch": max((int(s) for s, c in sizes.items() if c > 0), default=0),
        "fire_reasons": {r: c for r, c in reasons.items() if c > 0},
    }
    tokens = delta("tokens_total")
    if tokens > 0:  # a method with a ragged axis: what padding cost over the interval
        view["tokens_per_batch"] = tokens / batches if batches else math.nan
        view["padding_pct"] = 100.0 * delta("padding_tokens_total") / tokens
    window_s = float(after.get("window_s") or math.inf)
    from_window = duration_s >= window_s
    view["percentiles_from"] = "window" if from_window else "buckets"
    for name in ("latency", "queue_wait"):
        total_s = float(after.get(f"{name}_sum_s") or 0.0) - float(
            before.get(f"{name}_sum_s") or 0.0
        )
        view[f"{name}_mean_ms"] = 1000.0 * total_s / served if served > 0 else math.nan
        window = after.get(f"{name}_ms_window") or {}
        counts = _bucket_counts(before.get(f"{name}_buckets"), after.get(f"{name}_buckets"))
        for key, window_key, q in _QS:
            if from_window:
                view[f"{name}_{key}_ms"] = _num(window.get(window_key))
            else:
                view[f"{name}_{key}_ms"] = _bucket_percentile(counts, served, q)
    return view


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def _delta_counts(before: Any, after: Any) -> dict[str, int]:
    b = dict(before or {})
    return {str(k): int(v) - int(b.get(k, 0)) for k, v in dict(after or {}).items()}


def _bucket_counts(before: Any, after: Any) -> list[tuple[float, int]]:
    """Cumulative (bound_s, count) pairs of the interval."""
    b = {float(bound): int(count) for bound, count in before or ()}
    return [(float(bound), int(count) - b.get(float(bound), 0)) for bound, count in after or ()]


def _bucket_percentile(cumulative: list[tuple[float, int]], total: int, q: float) -> float:
    """The q-th percentile (ms), interpolated within its bucket; NaN without samples.

    Geometric interpolation between a bucket's bounds (linear in the first, from 0);
    a rank past the last bound gives the last bound: the histogram knows no more.
    """
    if total <= 0 or not cumulative:
        return math.nan
    rank = q / 100.0 * total
    lower_bound, lower_count = 0.0, 0
    for bound, count in cumulative:
        if count >= rank and count > lower_count:
            share = (rank - lower_count) / (count - lower_count)
            if lower_bound <= 0.0:
                value = bound * share
            else:
                value = lower_bound * (bound / lower_bound) ** share
            return 1000.0 * value
        lower_bound, lower_count = bound, count
    return 1000.0 * cumulative[-1][0]
