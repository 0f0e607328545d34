"""A Runner serving TinyLM by continuous batching, on the real loop, as a notebook uses it.

Greedy decoding on TinyLM is batch-invariant, so every concurrent caller's tokens must
equal the same prompt generated alone; the streams, whole generations, stop rules,
withdrawals, refusals at admission and the figures are checked against that.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import labserve
from labserve.lab.demo import TinyLM

PROMPTS = [f"prompt {i}: " + "ab" * (i % 7) for i in range(24)]


@pytest.fixture(scope="module")
def lm():
    runner = labserve.Runner(TinyLM, name="lm", max_num_seqs=8, max_num_batched_tokens=64)
    yield runner
    runner.stop()


@pytest.fixture(scope="module")
def solo(lm):
    """Each prompt's greedy tokens, generated alone."""
    return {p: lm.generate.run(p, max_tokens=12, temperature=0).token_ids for p in PROMPTS}


def test_a_stream_gives_the_text_of_the_whole_generation(lm):
    stream = lm.generate.stream("Hello", max_tokens=10, temperature=0)
    pieces = list(stream)
    whole = lm.generate.run("Hello", max_tokens=10, temperature=0)
    assert "".join(pieces) == whole.text
    assert len(pieces) == 10  # a byte-level model: one piece per token (ASCII here)
    assert whole.finish.reason == "length" and whole.finish.completion_tokens == 10
    assert whole.text.encode() == bytes(whole.token_ids)
    assert stream.finish == whole.finish


def test_concurrent_callers_get_what_each_gets_alone(lm, solo):
    async def together():
        return await asyncio.gather(
            *(lm.generate.async_run(p, max_tokens=12, temperature=0) for p in PROMPTS)
        )

    got = asyncio.run(together())  # another loop than labserve's: one hand-off per step
    assert [c.token_ids for c in got] == [solo[p] for p in PROMPTS]
    lm.generate.reset_stats()
    here = lm.bg.run(together())  # on labserve's loop: admitted in one iteration, one step
    assert [c.token_ids for c in here] == [solo[p] for p in PROMPTS]
    assert max(lm.generate.stats().steps.num_seqs) == 8  # they shared steps, up to the cap


def test_threads_streaming_at_once_get_their_own_tokens(lm, solo):
    out: dict[str, tuple[int, ...]] = {}

    def one(p):
        stream = lm.generate.stream(p, max_tokens=12, temperature=0)
        for _ in stream:
            pass
        out[p] = stream.token_ids

    threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS[:10]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {p: solo[p] for p in PROMPTS[:10]}


def test_a_seeded_sample_repeats_and_a_stop_string_ends_it(lm):
    a = lm.generate.run("Once", max_tokens=20, temperature=1.5, seed=3)
    b = lm.generate.run("Once", max_tokens=20, temperature=1.5, seed=3)
    assert a.token_ids == b.token_ids
    text = a.text
    stop = text[5:7]
    cut = lm.generate.run("Once", max_tokens=20, temperature=1.5, seed=3, stop=[stop])
    assert cut.finish.reason == "stop" and cut.text == text[: text.index(stop)]


def test_closing_a_stream_early_frees_its_sequence_and_counts_it_cancelled(lm, poll_until):
    before = lm.generate.stats().outcomes["cancelled"]
    stream = lm.generate.stream("a long one", max_tokens=500, temperature=0, ignore_eos=True)
    next(stream)
    stream.close()
    poll_until(lambda: lm.generate.stats().outcomes["cancelled"] == before + 1)
    poll_until(lambda: lm.generate.stats().num_running == 0)
    assert lm.generate.stats().kv_blocks_used == 0  # its blocks went back to the pool


@pytest.mark.parametrize(
    ("prompt", "params", "error", "words"),
    [
        ("hi", {"max_tokens": 0}, labserve.InputError, "max_tokens must be an integer >= 1"),
        ("x" * 1000, {"max_tokens": 100}, labserve.LengthLimitError, "max_model_len"),
        ([1, 2, 300], {}, labserve.InputError, "outside the vocabulary 0..255"),
        ("hi", {"top_k": 3}, labserve.InputError, "does not take top_k"),
        ("", {}, labserve.InputError, "at least one token"),
        ([1, 2.5], {}, labserve.InputError, "must be an integer"),
        (
            "x" * 80,
            {"config": {"enable_chunked_prefill": False}},
            labserve.LengthLimitError,
            "chunked prefill is off",
        ),
    ],
)
def test_a_bad_call_is_a_typed_error_at_once_and_harms_nothing(lm, prompt, params, error, words):
    params = dict(params)
    config = params.pop("config", {})
    before = lm.generate.config
    lm.generate.configure(**config)
    try:
        with pytest.raises(error, match=words):
            lm.generate.stream(prompt, **params)
    finally:
        lm.generate.configure(**before.as_dict())
    assert lm.generate.run("still fine", max_tokens=3, temperature=0).finish.reason == "length"


def test_a_sequence_longer_than_the_models_kv_pool_is_refused_at_once():
    # TinyLM stores K/V in labserve's blocks: its pool (2 blocks of 16) is its memory, set
    # at start; 40 + 10 - 1 tokens need 4 blocks.
    runner = labserve.Runner(TinyLM(d_model=32, d_ff=64), name="small-kv", num_kv_blocks=2)
    try:
        with pytest.raises(labserve.LengthLimitError, match="KV pool in blocks of 2"):
            runner.generate.stream("x" * 40, max_tokens=10)
        assert runner.generate.run("fits", max_tokens=3).finish.reason == "length"
        with pytest.raises(labserve.ConfigError, match=r"num_kv_blocks .*start-time"):
            runner.generate.configure(num_kv_blocks=4)
    finally:
        runner.stop()


def test_settings_change_live_and_the_figures_say_what_ran(lm):
    lm.configure("generate", max_num_seqs=2, ttft_slo_ms=10_000, tpot_slo_ms=10_000)
    lm.generate.reset_stats()
    asyncio.run(_many(lm, 6))
    snap = lm.generate.stats()
    assert snap.config.max_num_seqs == 2 and max(snap.steps.num_seqs) <= 2
    assert snap.outcomes["served"] == 6 and snap.output_tokens == 6 * 5
    assert snap.goodput > 0 and snap.percentiles_ms["ttft"]["p50"] > 0
    assert "6 served" in str(snap)
    lm.configure("generate", max_num_seqs=8, ttft_slo_ms=0, tpot_slo_ms=0)


async def _many(lm, n):
    return await asyncio.gather(
        *(lm.generate.async_run(f"n{i}", max_tokens=5, temperature=0) for i in range(n))
    )


def test_stop_answers_a_running_generation_and_refuses_new_ones():
    runner = labserve.Runner(TinyLM, name="stopping")
    stream = runner.generate.stream("go", max_tokens=50, temperature=0, ignore_eos=True)
    next(stream)
    runner.stop()  # drains: the running generation ends with all its tokens
    rest = list(stream)
    assert stream.finish is not None and stream.finish.reason == "length"
    assert 1 + len(rest) == 50
    with pytest.raises(labserve.RunnerStoppedError):
        runner.generate.stream("late")


def test_a_config_files_generation_section_sets_the_knobs_and_names_a_bad_key(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("runners:\n  filed:\n    generation:\n      max_num_seqs: 3\n")
    runner = labserve.Runner(TinyLM, name="filed", config=good, max_num_batched_tokens=128)
    try:
        assert runner.generate.config.max_num_seqs == 3  # the file, over the decorator's 32
        assert runner.generate.config.max_num_batched_tokens == 128  # the arguments, over both
    finally:
        runner.stop()
    bad = tmp_path / "bad.yaml"
    bad.write_text("runners:\n  filed:\n    generation:\n      max_num_seqs: 0\n")
    with pytest.raises(labserve.ConfigError, match=r"bad\.yaml: runners\.filed\.generation"):
        labserve.Runner(TinyLM, name="filed", config=bad)


def test_the_settings_both_kinds_share_reach_a_generative_method_from_the_runner():
    from labserve.lab.demo import TinyLM

    runner = labserve.Runner(
        TinyLM, name="shared", isolate_errors=True, request_timeout_ms=1234, max_queue_size=7
    )
    try:
        config = runner.generate.config
        assert (config.isolate_errors, config.request_timeout_ms, config.max_queue_size) == (
            True,
            1234,
            7,
        )
    finally:
        runner.stop()


class OwnCaches(labserve.Runnable):
    """A generative model that keeps its own caches (no allocate_kv): its KV is an account."""

    @labserve.method(generative=True)
    def generate(self, batch):
        return np.zeros((batch.num_sampling, 4))


def test_a_byte_budget_sizes_a_paged_models_pool_and_is_refused_for_one_with_its_own():
    lm = TinyLM(d_model=32, d_ff=64)
    budget = 100 * 16 * lm.kv_bytes_per_token + 123  # 100 blocks of 16, and change
    runner = labserve.Runner(lm, name="budget", kv_cache_bytes=budget)
    try:
        snap = runner.generate.stats()
        assert snap.kv_blocks_total == 100 and snap.kv_bytes == 100 * 16 * lm.kv_bytes_per_token
    finally:
        runner.stop()
    with pytest.raises(labserve.ConfigError, match="keeps its own caches"):
        labserve.Runner(OwnCaches, name="own", kv_cache_bytes=1 << 20)


def test_prefix_caching_is_on_for_a_paged_model_and_refused_for_one_with_its_own():
    own = labserve.Runner(OwnCaches, name="own_default")
    try:
        assert own.generate.config.enable_prefix_caching is False
        with pytest.raises(labserve.ConfigError, match="keeps its own caches"):
            own.configure("generate", enable_prefix_caching=True)
    finally:
        own.stop()
    with pytest.raises(labserve.ConfigError, match="enable_prefix_caching"):
        labserve.Runner(OwnCaches, name="own", enable_prefix_caching=True)


class NoCacheLM(TinyLM):
    @labserve.method(generative=True, enable_prefix_caching=False)
    def generate(self, batch):
        return self._step(batch)


def test_enable_prefix_caching_from_the_decorator_the_file_and_the_arguments(tmp_path):
    filed = tmp_path / "cache.yaml"
    filed.write_text("runners:\n  cache:\n    generation:\n      enable_prefix_caching: true\n")
    for kwargs, want in (
        ({}, False),
        ({"config": filed}, True),
        ({"config": filed, "enable_prefix_caching": False}, False),
    ):
        runner = labserve.Runner(NoCacheLM, name="cache", **kwargs)
        try:
            assert runner.generate.config.enable_prefix_caching is want
            assert runner.generate.stats().config.enable_prefix_caching is want
        finally:
            runner.stop()
    bad = tmp_path / "bad.yaml"
    bad.write_text("runners:\n  cache:\n    generation:\n      enable_prefix_caching: 1\n")
    with pytest.raises(labserve.ConfigError, match="enable_prefix_caching"):
        labserve.Runner(NoCacheLM, name="cache", config=bad)


def test_a_cache_hit_gives_tinylm_the_same_tokens_as_computing_the_prompt(lm):
    system = "You are a helpful assistant. Answer briefly and well. " * 2  # 108 bytes
    prompts = [system + q for q in ("Why?", "How so?", "When is it?")]
    assert lm.generate.config.enable_prefix_caching is True
    lm.generate.configure(enable_prefix_caching=False)
    try:
        cold = [lm.generate.run(p, max_tokens=8, temperature=0).token_ids for p in prompts]
    finally:
        lm.generate.configure(enable_prefix_caching=True)
    before = lm.generate.stats().prefix_cache_hits
    warm = [lm.generate.run(p, max_tokens=8, temperature=0).token_ids for p in prompts]
    assert warm == cold
    # The first warm prompt computes all (the cache was dropped); the next two hit the
    # system prompt's 6 full blocks of 16 bytes (96 of its 108).
    assert lm.generate.stats().prefix_cache_hits - before == 2 * 96
