"""Merging replicas' snapshots: counts and histograms exactly, percentiles from the buckets."""

from __future__ import annotations

import math

import numpy as np
import pytest

import labserve
from labserve.lab.demo import SleepModel
from labserve.ray.stats import bucket_quantile_ms, merge_snapshots, stats_payload


@pytest.fixture
def two_snapshots():
    # Two replicas of one runner "m": one after the other, each snapshot taken before the
    # next is made (a Runner of a name already running replaces it, as a re-run cell does).
    snaps = []
    for n in (5, 11):
        runner = labserve.Runner(SleepModel(a_ms=1, b_ms=0), name="m")
        try:
            for _ in range(n):
                runner.predict.run(np.ones((1, 2)))
            snaps.append(runner.stats("predict"))
        finally:
            runner.stop()
    return snaps


def test_counts_and_histograms_add_up_exactly(two_snapshots):
    a, b = two_snapshots
    merged = merge_snapshots([a, b])
    assert (merged.served, merged.admitted, merged.batches) == (16, 16, a.batches + b.batches)
    assert merged.batch_size_counts == {1: 16}
    assert sum(merged.fire_reasons.values()) == merged.batches
    assert [c for _, c in merged.latency_buckets] == [
        x + y for (_, x), (_, y) in zip(a.latency_buckets, b.latency_buckets, strict=True)
    ]
    assert merged.latency_sum_s == pytest.approx(a.latency_sum_s + b.latency_sum_s)
    assert merged.pending == 0
    # The window percentile is an upper bound: the larger of the parts'.
    assert merged.latency_ms_window.p99 == max(a.latency_ms_window.p99, b.latency_ms_window.p99)


def test_one_snapshot_merges_to_itself(two_snapshots):
    assert merge_snapshots(two_snapshots[:1]) is two_snapshots[0]
    with pytest.raises(ValueError, match="at least one"):
        merge_snapshots([])


def test_bucket_quantiles_interpolate_like_prometheus():
    buckets = ((0.001, 0), (0.002, 50), (0.005, 100))
    assert bucket_quantile_ms(buckets, 50, 100) == pytest.approx(2.0)
    assert bucket_quantile_ms(buckets, 25, 100) == pytest.approx(1.5)
    assert bucket_quantile_ms(buckets, 75, 100) == pytest.approx(3.5)
    assert bucket_quantile_ms(buckets, 99, 200) == pytest.approx(5.0)  # past the last bound
    assert math.isnan(bucket_quantile_ms(buckets, 50, 0))


def test_the_payload_has_the_merged_view_and_each_replica(two_snapshots):
    a, b = two_snapshots
    payload = stats_payload("m", {"r1": [a], "r2": [b]})
    assert payload["m"]["predict"]["served"] == 16
    assert [v["m"]["predict"]["served"] for v in payload["replicas"].values()] == [5, 11]
