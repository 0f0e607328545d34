"""One view of a generative method served by several replicas, each replica's kept beside it.

Counts (outcomes, tokens, preemptions), gauges (running, waiting, KV blocks) and rates add
up exactly, and so do the histograms (TTFT, ITL, TPOT, e2e and tokens per step, since the
last reset) and the prefix cache's counts. Percentiles do not add: the merged ones are read
from the summed latency buckets (Prometheus's ``histogram_quantile``, linear within a
bucket), so they cover the time since the last reset, not the window, and are as coarse as
the bounds (13, from 0.5 ms to 5 s); the merged prefix-cache hit rate is hits over queries
since the last reset too. One replica's snapshot is its own view, unchanged. Pure functions
of immutable snapshots; thread-safe.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from labserve.generation.results import StepSeries
from labserve.generation.stats import GenerationSnapshot, Histogram
from labserve.ray.stats import bucket_quantile_ms

__all__ = ["generation_payload", "merge_generation_snapshots"]

_SUMMED = (
    "num_running",
    "num_waiting",
    "kv_blocks_used",
    "kv_bytes",
    "num_preemptions",
    "prompt_tokens",
    "output_tokens",
    "output_tokens_per_s",
    "prompt_tokens_per_s",
    "requests_per_s",
    "goodput",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prefill_tokens_saved_per_s",
    "kv_blocks_cached",
)
_QS = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}
_LATENCIES = ("ttft", "itl", "tpot", "e2e")


def _sum_histograms(parts: Sequence[Histogram]) -> Histogram:
    bounds = [b for b, _ in parts[0].buckets]
    if any([b for b, _ in p.buckets] != bounds for p in parts):
        raise ValueError("replicas report generation histograms at different bounds")
    buckets = tuple((b, sum(p.buckets[i][1] for p in parts)) for i, b in enumerate(bounds))
    return Histogram(buckets, sum(p.sum for p in parts), sum(p.count for p in parts))


def _steps(snaps: Sequence[GenerationSnapshot]) -> StepSeries:
    """Every replica's last steps in one series by start time (as many as one replica keeps)."""
    keep = max(len(s.steps.start_s) for s in snaps)
    fields = [f.name for f in dataclasses.fields(StepSeries)]
    columns = {f: np.concatenate([getattr(s.steps, f) for s in snaps]) for f in fields}
    order = np.argsort(columns["start_s"], kind="stable")[-keep:] if keep else np.zeros(0, int)
    return StepSeries(**{f: c[order] for f, c in columns.items()})


def _hit_rate(snaps: Sequence[GenerationSnapshot]) -> float:
    """All replicas' prefix-cache hits over their queries since the last reset (NaN: none).

    A replica's window hit rate cannot be added up (a window with queries and no hit
    leaves no trace of how many queries), so the merged one covers the time since the last
    reset, as the merged percentiles do.
    """
    queries = sum(s.prefix_cache_queries for s in snaps)
    return sum(s.prefix_cache_hits for s in snaps) / queries if queries else math.nan


def merge_generation_snapshots(snaps: Sequence[GenerationSnapshot]) -> GenerationSnapshot:
    """One snapshot of a generative method served by several replicas (see the module's rules).

    The config is the first snapshot's (every replica runs the same one once a change
    has reached them all; the per-replica views show each one's).

    Raises:
        ValueError: no snapshot, or histograms at different bounds.
    """
    if not snaps:
        raise ValueError("merge_generation_snapshots needs at least one snapshot")
    if len(snaps) == 1:
        return snaps[0]
    names = set.intersection(*(set(s.histograms) for s in snaps))
    hists = {n: _sum_histograms([s.histograms[n] for s in snaps]) for n in sorted(names)}
    percentiles = {
        m: {k: bucket_quantile_ms(hists[m].buckets, q, hists[m].count) for k, q in _QS.items()}
        for m in _LATENCIES
        if m in hists
    }
    outcomes: Counter[str] = Counter()
    for s in snaps:
        outcomes.update(s.outcomes)
    first = snaps[0]
    return dataclasses.replace(
        first,
        time_s=max(s.time_s for s in snaps),
        window_s=max(s.window_s for s in snaps),
        outcomes=dict(outcomes),
        percentiles_ms={**first.percentiles_ms, **percentiles},
        histograms=hists,
        steps=_steps(snaps),
        # A model with its own caches reports 0 and its config's pool: the fleet's is the sum.
        kv_blocks_total=sum(s.kv_blocks_total or s.config.num_kv_blocks for s in snaps),
        prefix_cache_hit_rate=_hit_rate(snaps),
        **{f: sum(getattr(s, f) for s in snaps) for f in _SUMMED},
    )


def generation_payload(
    runner: str, per_replica: Mapping[str, Sequence[GenerationSnapshot]]
) -> dict[str, Any]:
    """``/stats``'s generation part: ``{runner: {method: merged}}`` and each replica's view."""
    by_method: dict[str, list[GenerationSnapshot]] = {}
    for snaps in per_replica.values():
        for s in snaps:
            by_method.setdefault(s.method, []).append(s)
    return {
        runner: {m: merge_generation_snapshots(v).as_dict() for m, v in by_method.items()},
        "replicas": {
            rid: {runner: {s.method: s.as_dict() for s in snaps}}
            for rid, snaps in sorted(per_replica.items())
        },
    }
