"""The simulator's fast path (runs of decode steps at once) gives the step-by-step result.

Hypothesis draws small workloads and settings (chunked prefill, prefix caching on shared
prompts, preemption in a small KV pool, static batches, priorities, timeouts, a cost with
a spread) and compares every per-request and per-step column, exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.config.generation import GenerationConfig
from labserve.generation.results import GenerationResult
from labserve.sim.generation import StepCost, replay_generation, simulate_generation


@st.composite
def configs(draw: st.DrawFn) -> GenerationConfig:
    return GenerationConfig(
        strategy=draw(st.sampled_from(["continuous", "continuous", "static"])),
        scheduling_policy=draw(st.sampled_from(["fcfs", "fcfs", "priority", "lpm"])),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(4, 64)),
        enable_chunked_prefill=draw(st.booleans()),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5])),
        block_size=draw(st.sampled_from([1, 2, 4, 16])),
        num_kv_blocks=draw(st.sampled_from([0, 0, 12, 40])),
        request_timeout_ms=draw(st.sampled_from([0.0, 0.0, 90.0])),
        enable_prefix_caching=draw(st.booleans()),
    )


@st.composite
def costs(draw: st.DrawFn) -> StepCost:
    spread = draw(st.sampled_from([(), (), (0.9, 1.0, 1.6)]))
    return StepCost(
        fixed_ms=draw(st.sampled_from([0.5, 2.0, 5.0])),
        per_seq_ms=draw(st.sampled_from([0.0, 0.07])),
        per_batched_token_ms=draw(st.sampled_from([0.0, 0.023])),
        per_context_token_ms=draw(st.sampled_from([0.0, 0.00006, 0.01])),
        spread=spread,
        spread_memory=draw(st.sampled_from([0.0, 0.7])) if spread else 0.0,
    )


@st.composite
def workloads(draw: st.DrawFn) -> dict:
    """Arrivals, and prompts that share prefixes (so that cached blocks hit)."""
    n = draw(st.integers(1, 14))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.002, 0.01, 0.05, 0.3]), min_size=n, max_size=n))
    prefixes = [[7] * 8, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    prompts = []
    for _ in range(n):
        head = prefixes[draw(st.integers(0, 1))] if draw(st.booleans()) else []
        tail = draw(st.lists(st.integers(0, 50), min_size=1, max_size=20))
        prompts.append(head + tail)
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    with_outputs = draw(st.booleans())
    return {
        "arrival_s": np.cumsum(gaps).tolist(),
        "prompt_ids": prompts,
        "output_lens": outputs,
        "output_ids": [[(i * 31 + k) % 50 for k in range(m)] for i, m in enumerate(outputs)]
        if with_outputs
        else None,
    }


def assert_same(a: GenerationResult, b: GenerationResult) -> None:
    """Every column of both results equal, exactly (floats included), NaN where NaN."""
    assert a.refused == b.refused
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "steps":
            for g in dataclasses.fields(x):
                u, v = getattr(x, g.name), getattr(y, g.name)
                assert u.dtype == v.dtype, g.name
                np.testing.assert_array_equal(u, v, err_msg=f"steps.{g.name}")
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)


@settings(max_examples=60, deadline=None)
@given(configs(), costs(), workloads(), st.integers(0, 3))
def test_fast_path_equals_step_by_step(config, cost, workload, seed):
    runs = [
        replay_generation(config, cost, seed=seed, step_by_step=sbs, **workload)
        for sbs in (True, False)
    ]
    assert_same(*runs)


def test_fast_path_equals_step_by_step_on_lesson_10s_workload():
    """Seconds of lesson 10's workload (32-token prompts, 128 outputs) near capacity: the
    run that made the fast path worth having, with the shipped TinyLM cost."""
    cost = StepCost(0.443, 0.0685, 0.02264, 0.0000595)
    config = GenerationConfig(max_num_seqs=16, max_num_batched_tokens=512)
    kw = dict(n_requests=150, input_len=32, output_len="uniform:64:128", rate=45.0)
    fast = simulate_generation(config, cost, **kw)
    assert_same(simulate_generation(config, cost, step_by_step=True, **kw), fast)
    assert len(fast.steps) > 1000 and fast.served.all()


def test_a_cost_with_a_spread_draws_the_same_factors():
    """Each step draws its factor in order on both paths, so the times agree exactly."""
    cost = StepCost(1.0, per_seq_ms=0.1, spread=(0.8, 1.0, 1.5, 3.0))
    config = GenerationConfig(max_num_seqs=4)
    kw = dict(n_requests=40, input_len=8, output_len=30, rate=80.0, seed=5)
    fast = simulate_generation(config, cost, **kw)
    assert_same(simulate_generation(config, cost, step_by_step=True, **kw), fast)
    gaps = np.diff(fast.steps.start_s)
    assert len(np.unique(np.round(gaps, 9))) > 10  # the spread did vary the steps


@settings(max_examples=40, deadline=None)
@given(
    configs(),
    costs(),
    st.integers(1, 8),
    st.integers(1, 3),
    st.sampled_from([0.0, 0.0, 0.05]),
    st.lists(st.sampled_from([0.0, 0.002, 0.05]), min_size=1, max_size=6),
    st.integers(0, 3),
)
def test_fast_path_equals_step_by_step_for_sessions(config, cost, prefix, turns, think, gaps, seed):
    """Multi-turn sessions (a turn's history resent, the simulated reply token by token,
    the next turn ``think`` after the last token): the same turns, steps and prompts."""
    from labserve.generation.workload import SharedPrefixWorkload
    from labserve.sim.generation import simulate_workload

    work = SharedPrefixWorkload(
        prefix_len=prefix,
        num_prefixes=2,
        input_len="uniform:1:12",
        output_len="uniform:1:20",
        turns=turns,
        think_time_s=think,
        seed=seed,
    )
    runs = [
        simulate_workload(config, cost, work, arrival_s=np.cumsum(gaps), seed=seed, step_by_step=s)
        for s in (True, False)
    ]
    assert_same(runs[0].generation, runs[1].generation)
    assert runs[0].prompts == runs[1].prompts
    np.testing.assert_array_equal(runs[0].turn, runs[1].turn)
    np.testing.assert_array_equal(runs[0].session, runs[1].session)
