"""The generation simulator: the real scheduler on virtual time, with named step costs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from labserve.base.lengths import EmpiricalLengths
from labserve.config.generation import GenerationConfig
from labserve.sim.generation import StepCost, replay_generation, simulate_generation

CFG = GenerationConfig(request_timeout_ms=0, max_queue_size=100_000)


def test_one_request_alone_has_the_latencies_the_step_cost_gives():
    r = simulate_generation(CFG, StepCost(5.0), n_requests=1, input_len=8, output_len=4)
    assert r.ttft_s == pytest.approx([0.005])  # the prefill step samples the first token
    assert r.served_itl_s == pytest.approx([0.005] * 3)
    assert r.tpot_s == pytest.approx([0.005])
    assert r.e2e_s == pytest.approx([0.020])
    assert len(r.steps) == 4
    assert r.steps.num_prefill_tokens.tolist() == [8, 0, 0, 0]
    assert r.steps.num_decode_tokens.tolist() == [0, 1, 1, 1]


def test_every_cost_term_counts_what_it_names():
    cost = StepCost(1.0, per_seq_ms=0.5, per_batched_token_ms=0.1, per_context_token_ms=0.01)
    r = simulate_generation(CFG, cost, n_requests=2, input_len=4, output_len=2)
    # Step 1: 2 sequences, 8 prompt tokens; each prompt's tokens read 1+2+3+4 = 10.
    # Step 2: 2 decodes at position 4, each reading 5 tokens.
    first = 1.0 + 0.5 * 2 + 0.1 * 8 + 0.01 * 20
    second = 1.0 + 0.5 * 2 + 0.1 * 2 + 0.01 * 10
    steps_ms = (r.steps.end_s - r.steps.start_s) * 1000
    assert steps_ms == pytest.approx([first, second])


def test_a_seed_fixes_the_run_and_another_seed_changes_it():
    kw = dict(n_requests=200, input_len="uniform:1:64", output_len="lognormal:32:200:400")
    a = simulate_generation(CFG, StepCost(5.0, per_batched_token_ms=0.01), rate=50, **kw)
    b = simulate_generation(CFG, StepCost(5.0, per_batched_token_ms=0.01), rate=50, **kw)
    c = simulate_generation(CFG, StepCost(5.0, per_batched_token_ms=0.01), rate=50, seed=1, **kw)
    np.testing.assert_array_equal(a.end_s, b.end_s)
    assert not np.array_equal(a.end_s, c.end_s)


def test_tokens_are_conserved_across_steps():
    r = simulate_generation(
        CFG.replace(max_num_batched_tokens=100),
        StepCost(5.0),
        n_requests=300,
        rate=200,
        input_len="uniform:1:300",
        output_len="uniform:1:50",
    )
    assert r.served.all()
    computed = r.steps.num_prefill_tokens.sum() + r.steps.num_decode_tokens.sum()
    # Every prompt token once, every output but the last fed back once (no preemption).
    assert computed == r.prompt_len.sum() + (r.num_output - 1).sum()
    assert (r.steps.num_prefill_tokens + r.steps.num_decode_tokens).max() <= 100


def test_chunked_prefill_spreads_a_long_prompt_over_steps():
    cfg = CFG.replace(max_num_batched_tokens=512)
    r = simulate_generation(cfg, StepCost(5.0), n_requests=1, input_len=2048, output_len=2)
    assert r.steps.num_prefill_tokens.tolist() == [512, 512, 512, 512, 0]
    assert r.ttft_s == pytest.approx([0.020])


def test_continuous_beats_static_and_refills_slots():
    kw = dict(n_requests=640, input_len=8, output_len="uniform:1:512")
    cont = simulate_generation(CFG, StepCost(5.0), **kw)
    static = simulate_generation(CFG.replace(strategy="static"), StepCost(5.0), **kw)
    assert cont.output_tokens_per_s > 1.5 * static.output_tokens_per_s
    # Continuous keeps all 32 slots busy while requests wait; static lets them empty.
    busy = cont.steps.num_waiting > 0
    assert np.all(cont.steps.num_seqs[busy] == 32)
    assert np.mean(static.steps.num_seqs[static.steps.num_waiting > 0]) < 24


def test_a_kv_budget_preempts_and_still_serves_everyone():
    cfg = CFG.replace(num_kv_blocks=64, block_size=16)
    r = simulate_generation(
        cfg, StepCost(5.0), n_requests=100, input_len=64, output_len="uniform:100:300"
    )
    assert r.served.all()
    assert r.num_preemptions.sum() > 0
    assert r.steps.kv_blocks_used.max() <= 64
    assert r.steps.num_preempted.sum() == r.num_preemptions.sum()


def test_requests_over_the_context_are_refused_and_counted():
    r = simulate_generation(
        CFG,
        StepCost(5.0),
        n_requests=10,
        input_len=EmpiricalLengths((10, 100)),
        output_len=10,
        max_model_len=50,
    )
    assert r.refused + len(r) == 10 and r.refused > 0
    assert (r.prompt_len == 10).all()


def test_a_full_waiting_queue_refuses_and_counts_the_overflow():
    # Ten arrive at once, before the first step: three wait, the other seven are refused.
    config = CFG.replace(max_num_seqs=2, max_queue_size=3)
    r = simulate_generation(config, StepCost(5.0), n_requests=10, input_len=4, output_len=3)
    assert r.refused == 7
    assert len(r) == 3 and r.served.all()


def test_goodput_counts_requests_meeting_both_targets():
    r = simulate_generation(CFG, StepCost(5.0), n_requests=40, input_len=8, output_len=10)
    span = r.span_s
    assert r.goodput(0, 0) == pytest.approx(40 / span)
    assert r.goodput(4.0, 0) == 0.0  # nobody's first token comes before 5 ms
    # 32 run at once; the other 8 start when the first batch ends, 50 ms later.
    assert r.goodput(5.01, 5.01) == pytest.approx(32 / span)
    assert r.goodput(0, 5.01) == pytest.approx(40 / span)
    assert r.goodput(0, 4.9) == 0.0


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"n_requests": -1}, "n_requests must be an integer >= 0"),
        ({"rate": 0}, "rate must be a number of requests/s > 0"),
        ({"input_len": "uniform:0:3"}, "input_len 'uniform:0:3' is not a length spec"),
    ],
)
def test_bad_arguments_are_refused(kw, words):
    args = dict(n_requests=1, input_len=8, output_len=8) | kw
    with pytest.raises(ValueError, match=words):
        simulate_generation(CFG, StepCost(5.0), **args)


def test_step_cost_refuses_negative_terms():
    with pytest.raises(ValueError, match="per_seq_ms must be a finite number >= 0"):
        StepCost(5.0, per_seq_ms=-1)
    with pytest.raises(ValueError, match="fixed_ms"):
        StepCost(math.nan)
    with pytest.raises(ValueError, match="spread must be finite factors >= 0 in order"):
        StepCost(5.0, spread=(2.0, 1.0))
    with pytest.raises(ValueError, match="wake_ms"):
        StepCost(5.0, wake_ms=-0.1)


def test_a_cost_shows_its_wake_and_spread_only_when_it_has_them():
    # Lesson 09 prints the shipped cost: a profile's cost reads as it did before issue 35.
    plain = (
        "StepCost(fixed_ms=1.0, per_seq_ms=0.0, per_batched_token_ms=0.0, per_context_token_ms=0.0)"
    )
    assert repr(StepCost(1.0)) == plain
    spread = tuple(1.0 + i / 10 for i in range(101))
    text = repr(StepCost(1.0, wake_ms=0.5, spread=spread))
    assert text.endswith("wake_ms=0.5, spread=<101 quantiles: p50 6.00x, p99 10.90x>)")


def test_the_spread_is_drawn_from_the_seed_and_scales_the_step():
    kw = dict(n_requests=400, input_len=8, output_len=32)
    plain = simulate_generation(CFG, StepCost(1.0), **kw)
    spread = StepCost(1.0, spread=(0.5, 1.0, 1.0, 1.0, 5.0))  # mean factor 1.5
    a = simulate_generation(CFG, spread, **kw)
    b = simulate_generation(CFG, spread, **kw)
    c = simulate_generation(CFG, spread, seed=1, **kw)
    assert np.array_equal(a.end_s, b.end_s) and not np.array_equal(a.end_s, c.end_s)
    step = (a.steps.end_s - a.steps.start_s) * 1000.0
    assert step.mean() == pytest.approx(1.5, rel=0.1)
    assert step.min() >= 0.5 - 1e-9 and step.max() <= 5.0 + 1e-9
    assert (plain.steps.end_s - plain.steps.start_s).max() == pytest.approx(0.001)


def test_a_replay_of_a_runs_own_arrivals_and_lengths_gives_the_same_run():
    kw = dict(input_len="uniform:1:64", output_len="uniform:1:32", rate=200.0, seed=4)
    config = CFG.replace(max_num_seqs=8, max_num_batched_tokens=64)
    run = simulate_generation(
        config, StepCost(2.0, per_batched_token_ms=0.05), n_requests=300, **kw
    )
    again = replay_generation(
        config,
        StepCost(2.0, per_batched_token_ms=0.05),
        arrival_s=run.arrival_s,
        prompt_lens=run.prompt_len,
        output_lens=run.num_output,
    )
    np.testing.assert_array_equal(again.end_s, run.end_s)
    np.testing.assert_array_equal(again.itl_s, run.itl_s)
    assert len(again.steps) == len(run.steps)


def test_a_replay_keeps_the_given_times():
    # The second arrives during the first's step 5-10 ms; it joins the next, 10-15 ms.
    r = replay_generation(
        CFG, StepCost(5.0), arrival_s=[0.0, 0.007], prompt_lens=[4, 4], output_lens=[3, 1]
    )
    assert r.ttft_s == pytest.approx([0.005, 0.015 - 0.007])
    assert r.e2e_s == pytest.approx([0.015, 0.015 - 0.007])
    assert r.steps.num_seqs.tolist() == [1, 1, 2]


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"arrival_s": [0.0, 1.0], "prompt_lens": [1], "output_lens": [1]}, "of one length"),
        ({"arrival_s": [1.0, 0.0], "prompt_lens": [1, 1], "output_lens": [1, 1]}, "order"),
        ({"arrival_s": [0.0], "prompt_lens": [0], "output_lens": [1]}, "prompt_lens must be"),
        ({"arrival_s": [0.0], "prompt_lens": [1], "output_lens": [1.5]}, "output_lens must be"),
    ],
)
def test_a_bad_replay_is_refused(kw, words):
    with pytest.raises(ValueError, match=words):
        replay_generation(CFG, StepCost(5.0), **kw)
