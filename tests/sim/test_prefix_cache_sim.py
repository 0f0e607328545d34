"""Prefix caching on virtual time: exact hit counts, and a step costs only computed tokens."""

from __future__ import annotations

import numpy as np

from labserve.config.generation import GenerationConfig
from labserve.sim.generation import StepCost, replay_generation

COST = StepCost(fixed_ms=1.0, per_batched_token_ms=0.1)


def replay(config: GenerationConfig, prompts: list[list[int]], gap_s: float = 1.0):
    return replay_generation(
        config,
        COST,
        arrival_s=[gap_s * i for i in range(len(prompts))],
        output_lens=[2] * len(prompts),
        prompt_ids=prompts,
    )


def prefill_tokens(result) -> int:
    return int(result.steps.num_prefill_tokens.sum())


def test_a_cache_that_holds_every_prefix_hits_what_the_block_floor_allows():
    # (A) Three prefixes, 30 requests, each done before the next arrives (1 s apart, steps
    # of ms), a pool that never evicts: each later request of a prefix hits
    # block_size * floor(min(shared, prompt - 1) / block_size) tokens.
    size = 4
    rng = np.random.default_rng(3)
    prefixes = [list(range(100 * k, 100 * k + n)) for k, n in enumerate((10, 13, 16))]
    prompts, expected, seen = [], 0, set()
    for i in range(30):
        k = int(rng.integers(3))
        suffix = [10_000 + 50 * i + j for j in range(int(rng.integers(0, 7)))]  # shared by none
        prompt = prefixes[k] + suffix
        if k in seen:
            shared = len(prefixes[k])
            expected += size * (min(shared, len(prompt) - 1) // size)
        seen.add(k)
        prompts.append(prompt)
    config = GenerationConfig(block_size=size, num_kv_blocks=1000, enable_prefix_caching=True)
    on = replay(config, prompts)
    off = replay(config.replace(enable_prefix_caching=False), prompts)
    assert expected > 0
    assert int(on.steps.num_cache_hits.sum()) == expected
    assert int(on.steps.num_cache_queries.sum()) == sum(map(len, prompts))
    assert int(off.steps.num_cache_hits.sum()) == 0
    assert prefill_tokens(off) - prefill_tokens(on) == expected  # hits are not computed
    # and cost nothing: the TTFTs differ by 0.1 ms per hit token (the context term is 0)
    saved_ms = (off.ttft_s.sum() - on.ttft_s.sum()) * 1000
    assert abs(saved_ms - 0.1 * expected) < 1e-6


def test_evictions_cost_exactly_the_hits_worked_out_by_hand():
    # (B) block_size 2, a pool of 4 blocks, one request at a time (A, B, A, B; 5 tokens,
    # 1 output: 3 blocks each, two full). Free queue after A: [2 (A's partial, uncached:
    # front), 3 (never used), 1 (A's tail), 0 (A's head)]. B takes 2, then 3 (after its
    # last, uncached), then 1 from the front: A's tail is evicted. After B: [1 (B's partial),
    # 0, 3 (B's tail), 2 (B's head)]. A again hits block 0 (2 tokens), takes 1 (after 0,
    # uncached) and 3 from the front: B's tail is evicted. B again hits block 2: 2 tokens.
    a, b = [1, 2, 3, 4, 5], [7, 8, 9, 10, 11]
    config = GenerationConfig(block_size=2, num_kv_blocks=4, enable_prefix_caching=True)
    result = replay_generation(
        config,
        COST,
        arrival_s=[0.0, 1.0, 2.0, 3.0],
        output_lens=[1] * 4,
        prompt_ids=[a, b, a, b],
    )
    assert result.steps.num_cache_hits.tolist() == [0, 0, 2, 2]
    roomy = config.replace(num_kv_blocks=6)  # room for both: each hits both full blocks
    again = replay_generation(
        roomy, COST, arrival_s=[0.0, 1.0, 2.0, 3.0], output_lens=[1] * 4, prompt_ids=[a, b, a, b]
    )
    assert again.steps.num_cache_hits.tolist() == [0, 0, 4, 4]


def test_a_later_turn_hits_the_reply_it_resends_when_outputs_are_given():
    first = list(range(8))
    reply = [50, 51, 52, 53, 54]
    second = first + reply + [60, 61]
    config = GenerationConfig(block_size=4, num_kv_blocks=64, enable_prefix_caching=True)
    kw = {"arrival_s": [0.0, 1.0], "output_lens": [5, 1], "prompt_ids": [first, second]}
    with_outputs = replay_generation(config, COST, output_ids=[reply, [0]], **kw)
    prompts_only = replay_generation(config, COST, **kw)
    # The first turn computed 8 prompt tokens + 4 of its reply (the last output is never
    # fed back): blocks [0..3], [4..7] and, with its outputs known, [50..53].
    assert int(with_outputs.steps.num_cache_hits.sum()) == 12
    assert int(prompts_only.steps.num_cache_hits.sum()) == 8
