"""The rate search: bisection on a known edge, a seeded search on a tiny workload, apply/export.

The search runs the real scheduler on virtual time (no wall clock); the workload is small
(8-token prompts and outputs, 4 simulated seconds a point) so the module stays fast.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import labserve
from labserve.base.errors import ConfigError
from labserve.generation.batch import SeqBatch
from labserve.lab.bisection import highest_rate
from labserve.lab.generation.search import PoissonWorkload, search_generation

COST = labserve.StepCost(2.0, per_seq_ms=0.2)
TINY = dict(cost=COST, duration_s=4.0, warmup_s=0.5, probe_s=1.5)


@settings(max_examples=200, deadline=None)
@given(
    edge=st.floats(0.01, 1e5),
    start=st.floats(0.01, 1e5),
    tolerance=st.sampled_from([0.001, 0.02, 0.1]),
)
def test_bisection_brackets_a_known_edge_within_the_tolerance(edge, start, tolerance):
    found = highest_rate(lambda r: r <= edge, start=start, tolerance=tolerance)
    assert found.rate <= edge < found.miss
    assert found.miss <= found.rate * (1 + tolerance) * (1 + 1e-12)


def test_bisection_finds_an_exact_edge_when_it_lies_on_the_grid_of_tries():
    # Halving [10, 40] geometrically tries 20 first: an edge exactly there is found exactly.
    found = highest_rate(lambda r: r <= 20.0, start=10.0, step=4.0, tolerance=0.01)
    assert found.tried[:3] == (10.0, 40.0, 20.0)
    assert found.rate == 20.0


def test_bisection_gives_up_past_its_limits():
    assert highest_rate(lambda r: False, start=1.0, floor=0.5).rate == 0.0
    assert highest_rate(lambda r: True, start=1.0, ceiling=8.0).miss == math.inf


def test_bisection_refuses_a_start_outside_its_limits():
    with pytest.raises(ValueError, match="start must be within"):
        highest_rate(lambda r: True, start=0.0)


@pytest.fixture(scope="module")
def found():
    return search_generation(
        PoissonWorkload(8, 8), "ttft:60 tpot:5", grid={"max_num_seqs": [1, 8]}, **TINY
    )


def test_search_is_seeded_and_repeats_exactly(found):
    again = search_generation(
        PoissonWorkload(8, 8), "ttft:60 tpot:5", grid={"max_num_seqs": [1, 8]}, **TINY
    )
    assert again.rows == found.rows


def test_search_best_setting_beats_a_deliberately_bad_one(found):
    one, eight = found.rows
    assert found.best is eight
    # One sequence a step shares nothing: capacity about 1 / (8 steps x 2.2 ms) = 57 req/s,
    # TTFT queueing first; eight share the 2 ms fixed part several-fold.
    assert 0 < one["max_rate"] < 57
    assert eight["max_rate"] > 2 * one["max_rate"]
    assert eight["attainment"] >= 0.9
    assert found.frontier()  # at least one point is on the Pareto frontier
    assert "max_rate" in found.table().splitlines()[0]


def test_search_a_tighter_target_lowers_the_rate(found):
    work = PoissonWorkload(8, 8)
    tight = search_generation(work, "ttft:20 tpot:5", grid={"max_num_seqs": [8]}, **TINY)
    assert 0 < tight.best["max_rate"] < found.rows[1]["max_rate"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(grid={"block_size": [8]}), "grid keys must be among"),
        (dict(grid={"max_num_seqs": []}), "non-empty lists"),
        (dict(grid={"max_num_seqs": [1]}, attainment=1.5), "attainment must be"),
        (dict(grid={"max_num_seqs": [1]}, warmup_s=5.0), "warmup_s must be"),
    ],
)
def test_search_refuses_bad_arguments_before_running(kwargs, message):
    with pytest.raises(ValueError, match=message):
        search_generation(PoissonWorkload(8, 8), "ttft:60", **{**TINY, **kwargs})


def test_search_refuses_a_grid_value_the_config_refuses():
    with pytest.raises(ConfigError, match="max_num_seqs"):
        search_generation(PoissonWorkload(8, 8), "ttft:60", grid={"max_num_seqs": [0]}, **TINY)


class Echo(labserve.Runnable):
    vocab_size = 256

    @labserve.method(generative=True, max_num_seqs=4)
    def generate(self, batch: SeqBatch) -> np.ndarray:
        return np.array([len(t) % 256 for _, t, _, ok in batch if ok], dtype=np.int64)


def test_apply_configures_a_runner_with_the_best_setting_and_the_targets(found):
    runner = labserve.Runner(Echo, name="echo")
    try:
        got = found.apply(runner)
        assert runner.generate.config == got
        assert (got.max_num_seqs, got.ttft_slo_ms, got.tpot_slo_ms) == (8, 60.0, 5.0)
        with pytest.raises(ConfigError, match="method"):
            found.apply(runner, method="nope")  # the runner's own error
    finally:
        runner.stop()


def test_apply_leaves_prefix_caching_alone_unless_the_search_set_it(found):
    from labserve.lab.demo import TinyLM

    runner = labserve.Runner(TinyLM, name="tiny")  # K/V in labserve's blocks: None means on
    try:
        runner.configure("generate", enable_prefix_caching=False)
        assert found.best_config.enable_prefix_caching is None  # the search's base: unset
        assert found.apply(runner).enable_prefix_caching is False
        searched = search_generation(
            PoissonWorkload(8, 8), "ttft:60 tpot:5",
            grid={"max_num_seqs": [8], "enable_prefix_caching": [True]}, **TINY,
        )  # fmt: skip
        assert searched.apply(runner).enable_prefix_caching is True
    finally:
        runner.stop()


def test_export_writes_the_best_setting_as_engine_flags(found):
    assert "--max-num-seqs 8" in found.export("vllm")


@pytest.fixture(scope="module")
def batching():
    return labserve.search_batching(
        20.0, grid={"max_batch_size": [1, 16]}, cost=(2.0, 0.1), duration_s=5, warmup_s=0.5
    )


def test_batching_search_repeats_and_ranks_a_real_cap_over_one(batching):
    again = labserve.search_batching(
        20.0, grid={"max_batch_size": [1, 16]}, cost=(2.0, 0.1), duration_s=5, warmup_s=0.5
    )
    assert again.rows == batching.rows
    one, sixteen = batching.rows
    # Batches of one: at most 1 / 2.1 ms = 476 req/s; sixteen share the 2 ms fixed part.
    assert 0 < one["max_rate"] < 476 < sixteen["max_rate"]
    assert sixteen["latency_p99_ms"] <= 20.0
    assert batching.best is sixteen


class Doubler(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=4)
    def predict(self, x: np.ndarray) -> np.ndarray:
        return x * 2


def test_batching_apply_and_export_carry_the_best_caps(batching):
    runner = labserve.Runner(Doubler, name="doubler")
    try:
        assert batching.apply(runner).max_batch_size == 16
        assert runner.predict.config.max_batch_size == 16
    finally:
        runner.stop()
    assert "max_batch_size: 16" in batching.export("labserve")
