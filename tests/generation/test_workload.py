"""Shared-prefix workloads: seeded prompts, prefixes really shared, sessions on virtual time."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.config.generation import GenerationConfig
from labserve.generation.workload import SharedPrefixWorkload, parse_prefix_dist, ttft_by_turn
from labserve.sim.generation import StepCost, simulate_workload


def test_a_seed_gives_the_same_prompts_whatever_the_order_they_are_asked_in():
    a = SharedPrefixWorkload(prefix_len=40, num_prefixes=3, input_len="uniform:4:20", seed=7)
    b = SharedPrefixWorkload(prefix_len=40, num_prefixes=3, input_len="uniform:4:20", seed=7)
    forward = [a.prompt_ids(k) for k in range(20)]
    backward = [b.prompt_ids(k) for k in reversed(range(20))][::-1]
    assert forward == backward
    other = SharedPrefixWorkload(prefix_len=40, num_prefixes=3, input_len="uniform:4:20", seed=8)
    assert [other.prompt_ids(k) for k in range(20)] != forward


def test_requests_of_a_tenant_share_its_prefix_and_nothing_more():
    w = SharedPrefixWorkload(prefix_len=64, num_prefixes=4, input_len=16, output_len=4)
    prompts = [w.prompt_ids(k) for k in range(40)]
    tenants = [w.tenant(k) for k in range(40)]
    assert set(tenants) == {0, 1, 2, 3}
    for k, p in enumerate(prompts):
        assert len(p) == 64 + 16
        assert p[:64] == list(w.prefix(tenants[k]))
        assert bytes(p) == w.prompt_text(k).encode("ascii")  # one char, one token id
    # Two requests share exactly their tenant's prefix, give or take a chance letter.
    first, second = [k for k, t in enumerate(tenants) if t == tenants[0]][:2]
    pairs = zip(prompts[first], prompts[second], strict=True)
    common = next(i for i, (x, y) in enumerate(pairs) if x != y)
    assert 64 <= common < 64 + 4
    assert len({bytes(w.prefix(j)) for j in range(4)}) == 4


def test_zipf_makes_a_hot_tenant_and_uniform_does_not():
    n = 4000
    zipf = SharedPrefixWorkload(prefix_len=4, num_prefixes=8, prefix_dist="zipf:1.1")
    counts = Counter(zipf.tenant(k) for k in range(n))
    weights = 1 / np.arange(1, 9) ** 1.1
    assert counts[0] / n == pytest.approx(weights[0] / weights.sum(), abs=0.03)
    assert counts[0] > 3 * counts[7]
    uniform = Counter(SharedPrefixWorkload(num_prefixes=8).tenant(k) for k in range(n))
    assert max(uniform.values()) / n < 0.16  # 1/8 = 0.125 each


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="prefix_dist"):
        parse_prefix_dist("zipf:0")
    with pytest.raises(ValueError, match="prefix_dist"):
        SharedPrefixWorkload(prefix_dist="pareto")
    with pytest.raises(ValueError, match="num_prefixes"):
        SharedPrefixWorkload(num_prefixes=0)
    with pytest.raises(TypeError, match="turns"):
        SharedPrefixWorkload(turns=1.5)
    with pytest.raises(ValueError, match="think_time_s"):
        SharedPrefixWorkload(think_time_s=-1)
    with pytest.raises(ValueError, match="input_len"):
        SharedPrefixWorkload(input_len="nope")


def test_a_turn_resends_the_history_with_the_replies_given():
    w = SharedPrefixWorkload(prefix_len=10, input_len=5, output_len=3, turns=3)
    r0, r1 = [1, 2, 3], [4, 5, 6]
    ids = w.prompt_ids(0, 2, [r0, r1])
    assert ids == list(w.prefix(w.tenant(0))) + list(w.user(0, 0)) + r0 + list(
        w.user(0, 1)
    ) + r1 + list(w.user(0, 2))
    messages = w.messages(0, 2, ["abc", "def"])
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert "".join(m["content"] for m in messages) == w.prompt_text(0, 2, ["abc", "def"])
    with pytest.raises(ValueError, match="earlier replies"):
        w.prompt_ids(0, 2, [r0])


def test_ttft_by_turn_groups_and_skips_what_did_not_come():
    got = ttft_by_turn(np.array([0.1, np.nan, 0.3, 0.5]), np.array([0, 0, 1, 1]))
    assert got[0]["n"] == 1 and got[0]["p50"] == pytest.approx(100.0)
    assert got[1]["n"] == 2 and got[1]["mean"] == pytest.approx(400.0)


def test_the_simulator_sends_each_session_its_own_replies_after_the_think_time():
    w = SharedPrefixWorkload(
        prefix_len=32, num_prefixes=2, input_len=8, output_len=4, turns=3, think_time_s=0.5
    )
    r = simulate_workload(GenerationConfig(), StepCost(10.0), w, arrival_s=[0.0, 0.0, 2.0])
    g = r.generation
    assert len(g) == 9 and g.served.all()
    assert sorted(r.turn.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for k in range(3):
        mine = zip(r.session, r.turn, strict=True)
        rows = sorted((t, i) for i, (s, t) in enumerate(mine) if s == k)
        (_, a), (_, b), (_, c) = rows
        assert list(r.prompts[a]) == w.prompt_ids(k, 0)
        reply0 = w.simulated_reply(k, 0, 4)
        assert list(r.prompts[b]) == w.prompt_ids(k, 1, [reply0])
        assert list(r.prompts[c]) == w.prompt_ids(k, 2, [reply0, w.simulated_reply(k, 1, 4)])
        # The next turn arrives a think time after the last token of the one before.
        assert g.arrival_s[b] == pytest.approx(g.end_s[a] + 0.5)
        assert g.arrival_s[c] == pytest.approx(g.end_s[b] + 0.5)
    per_turn = r.per_turn()
    assert set(per_turn) == {0, 1, 2} and all(v["n"] == 3 for v in per_turn.values())
    # Two sessions arrive together at 0: their first turns share the prefill step (10 ms).
    assert per_turn[0]["p50"] == pytest.approx(10.0)


def test_the_simulator_gives_the_same_run_for_the_same_seeds():
    def run():
        w = SharedPrefixWorkload(
            prefix_len=16,
            num_prefixes=3,
            prefix_dist="zipf:1.1",
            input_len="uniform:2:9",
            output_len="uniform:1:6",
            turns=2,
            think_time_s=0.1,
            seed=3,
        )
        times = np.cumsum(np.random.default_rng(3).exponential(0.05, 30))
        return simulate_workload(
            GenerationConfig(max_num_seqs=4),
            StepCost(5.0, per_batched_token_ms=0.1),
            w,
            arrival_s=times,
        )

    a, b = run(), run()
    assert a.prompts == b.prompts
    np.testing.assert_array_equal(a.generation.first_token_s, b.generation.first_token_s)


@settings(max_examples=25, deadline=None)
@given(
    prefix_len=st.integers(0, 40),
    num_prefixes=st.integers(1, 5),
    zipf=st.booleans(),
    turns=st.integers(1, 3),
    max_num_seqs=st.integers(1, 4),
    max_queue_size=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    gaps=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=8),
)
def test_every_turn_of_every_session_gets_one_outcome_and_its_tenants_prefix(
    prefix_len, num_prefixes, zipf, turns, max_num_seqs, max_queue_size, seed, gaps
):
    w = SharedPrefixWorkload(
        prefix_len=prefix_len, num_prefixes=num_prefixes,
        prefix_dist="zipf:1.2" if zipf else "uniform", input_len="uniform:1:12",
        output_len="uniform:1:5", turns=turns, think_time_s=0.01, seed=seed,
    )  # fmt: skip
    config = GenerationConfig(max_num_seqs=max_num_seqs, max_queue_size=max_queue_size)
    r = simulate_workload(config, StepCost(2.0), w, arrival_s=np.cumsum(gaps), max_model_len=80)
    g = r.generation
    # A session's turns are 0, 1, ...: each served turn but its last was followed by the next.
    for k in range(len(gaps)):
        mine = sorted(r.turn[r.session == k].tolist())
        assert mine == list(range(len(mine))) and len(mine) <= turns
        served = set(r.turn[(r.session == k) & g.served].tolist())
        assert set(mine[:-1]) <= served  # a turn not served ends its session
    # Each session's first turn has one outcome: in the result, or refused at admission.
    first = int((r.turn == 0).sum())
    assert first <= len(gaps) <= first + g.refused
    for k, prompt in zip(r.session.tolist(), r.prompts, strict=True):
        assert list(prompt[:prefix_len]) == list(w.prefix(w.tenant(k)))


def test_next_sessions_keep_the_tenants_prefixes_and_draw_new_users():
    w = SharedPrefixWorkload(prefix_len=24, num_prefixes=3, input_len=12, seed=4)
    later = w.next_sessions(5)
    assert [later.prefix(j) for j in range(3)] == [w.prefix(j) for j in range(3)]
    assert [later.user(k) for k in range(5)] != [w.user(k) for k in range(5)]
    assert SharedPrefixWorkload(prefix_len=24, seed=5).prefix(0) != w.prefix(0)
