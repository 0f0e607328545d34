"""The generation recorder's histograms: TPOT beside TTFT, ITL and e2e, as vLLM defines it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.config.generation import GenerationConfig
from labserve.generation.results import GenerationResult
from labserve.generation.sequence import Finished
from labserve.generation.stats import GenerationRecorder


def finished(seq_id, arrival_s, gaps_s, outcome="served"):
    times = tuple(arrival_s + float(t) for t in np.cumsum(gaps_s))
    end = times[-1] if times else arrival_s + 0.01
    return Finished(seq_id, outcome, "length", arrival_s, end, 4, times, 0)


def snapshot(recorder):
    return recorder.snapshot(
        100.0, GenerationConfig(), runner="r", method="m", running=0, waiting=0, kv_blocks_used=0
    )


@settings(max_examples=60, deadline=None)  # a recorder per example: ~20 ms each, loaded
@given(st.lists(st.lists(st.floats(0.0005, 0.5), min_size=1, max_size=6), min_size=1, max_size=30))
def test_the_tpot_histogram_counts_each_served_sequence_of_two_tokens_once(all_gaps):
    recorder = GenerationRecorder(window_s=1000.0)
    done = [finished(i, float(i), gaps) for i, gaps in enumerate(all_gaps)]
    for f in done:
        recorder.finished(f)
    recorder.finished(finished(99, 0.0, [0.1, 0.1], outcome="cancelled"))  # not served
    hist = snapshot(recorder).histograms["tpot"]
    expected = GenerationResult.from_finished(done, ()).tpot_s
    assert hist.count == len(expected) == sum(len(g) > 1 for g in all_gaps)
    assert hist.sum == pytest.approx(float(expected.sum()))
    assert hist.buckets[-1][1] <= hist.count  # cumulative: the last bound's count is the most
    for bound, count in hist.buckets:  # exact but for the recorder's 1% buckets
        low, high = int((expected <= bound * 0.99).sum()), int((expected <= bound * 1.01).sum())
        assert low <= count <= high


def test_reset_empties_the_tpot_histogram():
    recorder = GenerationRecorder()
    recorder.finished(finished(1, 0.0, [0.01, 0.02, 0.03]))
    assert snapshot(recorder).histograms["tpot"].count == 1
    recorder.reset(50.0)
    assert snapshot(recorder).histograms["tpot"].count == 0
