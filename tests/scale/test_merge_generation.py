"""Merging replicas' generation snapshots: counts and histograms exactly, percentiles from them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.config.generation import GenerationConfig
from labserve.generation.sequence import Finished, StepRecord
from labserve.generation.stats import GenerationRecorder
from labserve.ray.generation.stats import generation_payload, merge_generation_snapshots
from labserve.ray.stats import bucket_quantile_ms

gaps = st.lists(st.floats(0.0005, 2.0), min_size=1, max_size=5)


def finished(seq_id, arrival_s, gaps_s, outcome="served"):
    times = tuple(arrival_s + float(t) for t in np.cumsum(gaps_s))
    return Finished(seq_id, outcome, "length", arrival_s, times[-1], 3, times, 0)


def step(index, start_s):
    return StepRecord(index, start_s, start_s + 0.01, 2, 0, 2, 2, 0, 1, 0, "empty")


def recorded(done, steps, *, running=0, kv=0, config=None):
    config = config or GenerationConfig()
    recorder = GenerationRecorder(window_s=1000.0)
    for f in done:
        recorder.finished(f)
    for s in steps:
        recorder.step(s)
    return recorder.snapshot(
        500.0, config, runner="lm", method="generate", running=running, waiting=1, kv_blocks_used=kv
    )


@settings(max_examples=60, deadline=None)  # a recorder per example: ~20 ms each, loaded
@given(st.lists(gaps, min_size=1, max_size=20), st.lists(gaps, min_size=1, max_size=20))
def test_two_replicas_merge_to_what_one_recorder_of_all_their_sequences_holds(a, b):
    left = [finished(i, float(i), g) for i, g in enumerate(a)]
    right = [finished(100 + i, float(i) + 0.5, g) for i, g in enumerate(b)]
    merged = merge_generation_snapshots([recorded(left, ()), recorded(right, ())])
    whole = recorded(left + right, ())
    assert merged.outcomes == whole.outcomes
    assert merged.output_tokens == whole.output_tokens
    assert merged.prompt_tokens == whole.prompt_tokens
    for name in ("ttft", "itl", "tpot", "e2e", "iteration_tokens"):
        assert merged.histograms[name].buckets == whole.histograms[name].buckets
        assert merged.histograms[name].count == whole.histograms[name].count
        assert merged.histograms[name].sum == pytest.approx(whole.histograms[name].sum)
    for name in ("ttft", "itl", "tpot", "e2e"):
        hist = whole.histograms[name]
        for key, q in (("p50", 50.0), ("p99", 99.0)):
            expected = bucket_quantile_ms(hist.buckets, q, hist.count)
            assert merged.percentiles_ms[name][key] == pytest.approx(expected, nan_ok=True)


def test_gauges_add_up_and_the_steps_interleave_by_start():
    config = GenerationConfig(num_kv_blocks=40)  # a model with its own caches: its account
    one = recorded([], [step(0, 1.0), step(1, 3.0)], running=2, kv=5, config=config)
    two = recorded([], [step(0, 2.0)], running=3, kv=7, config=config)
    merged = merge_generation_snapshots([one, two])
    assert (merged.num_running, merged.num_waiting, merged.kv_blocks_used) == (5, 2, 12)
    assert merged.kv_blocks_total == 80 and merged.kv_cache_usage == pytest.approx(12 / 80)
    assert merged.steps.start_s.tolist() == [2.0, 3.0]  # as many as one replica keeps, newest
    assert merge_generation_snapshots([one]) is one


def test_the_payload_keeps_each_replicas_view_beside_the_merged_one():
    one = recorded([finished(1, 0.0, [0.1, 0.1])], ())
    two = recorded([finished(2, 0.0, [0.2])], ())
    out = generation_payload("lm", {"b": [two], "a": [one]})
    assert out["lm"]["generate"]["outcomes"]["served"] == 2
    assert list(out["replicas"]) == ["a", "b"]
    assert out["replicas"]["a"]["lm"]["generate"]["outcomes"]["served"] == 1


def test_histograms_at_other_bounds_are_refused():
    one = recorded([finished(1, 0.0, [0.1])], ())
    other = dataclasses.replace(one.histograms["ttft"], buckets=((1.0, 1),))
    two = dataclasses.replace(one, histograms={**one.histograms, "ttft": other})
    with pytest.raises(ValueError, match="different bounds"):
        merge_generation_snapshots([one, two])
    with pytest.raises(ValueError, match="at least one"):
        merge_generation_snapshots([])


def test_the_prefix_cache_counts_add_up_and_the_hit_rate_is_hits_over_queries():
    one = dataclasses.replace(
        recorded([], ()), prefix_cache_queries=100, prefix_cache_hits=0, kv_blocks_cached=3
    )
    two = dataclasses.replace(
        recorded([], ()), prefix_cache_queries=300, prefix_cache_hits=240, kv_blocks_cached=5
    )
    merged = merge_generation_snapshots([one, two])
    assert (merged.prefix_cache_queries, merged.prefix_cache_hits) == (400, 240)
    assert merged.kv_blocks_cached == 8
    assert merged.prefix_cache_hit_rate == pytest.approx(0.6)  # a cold replica counts too
