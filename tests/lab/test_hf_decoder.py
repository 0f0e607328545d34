"""A Hugging Face decoder wrapped in a page (labserve.lab.hf.HFDecoder), batched: one forward
per step over all its sequences, K/V in labserve's blocks. Each sequence's logits in a mixed
step equal its logits alone (to 1e-4), greedy tokens equal transformers' own ``generate``,
the KV memory is the tensors the model allocated, and a step that raised leaves nothing
behind (so ``isolate_errors`` fails only the poisoned sequence). Small GPT-2 and Llama
(grouped-query attention) models with seeded random weights: no network.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import labserve
from labserve.generation.batch import SeqBatch
from labserve.lab.steps import profile_steps

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from labserve.lab.hf import HFDecoder  # noqa: E402

ROOT = pathlib.Path(__file__).parents[2]
POISON = 96  # a prompt starting with this id makes its sequence's decode steps raise
VOCAB = 97
PROMPTS = [[5 + i, 17, 3 * i % 90 + 1, 42, 7 * i % 80][: 2 + i % 4] for i in range(10)]


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=128,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def llama():
    """Llama with grouped-query attention: 4 query heads share 2 K/V heads."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


MODELS = {"gpt2": gpt2(), "llama": llama()}


@pytest.fixture(params=sorted(MODELS))
def model(request):
    return MODELS[request.param]


class Blocks:
    """The scheduler's side, small: block ids handed out shuffled, so tables are
    non-contiguous and out of order."""

    def __init__(self, num_blocks, block_size, seed):
        self.block_size = block_size
        self.free = list(np.random.default_rng(seed).permutation(num_blocks))
        self.tables: dict[int, list[int]] = {}

    def step(self, rows, samples=None):
        """A SeqBatch of (seq_id, tokens, start) rows with tables covering the new tokens."""
        tables = []
        for seq_id, tokens, start in rows:
            table = self.tables.setdefault(seq_id, [])
            while len(table) * self.block_size < start + len(tokens):
                table.append(int(self.free.pop()))
            tables.append(tuple(table))
        ids, tokens, starts = zip(*rows, strict=True)
        arrays = tuple(np.asarray(t, dtype=np.int64) for t in tokens)
        samples = samples or (True,) * len(ids)
        return SeqBatch(ids, arrays, starts, tuple(samples), tuple(tables), self.block_size)


def solo_logits(model, ids):
    """The next-token logits after ``ids``, the model run on them alone with no cache."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)])).logits[0, -1].float().numpy()


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_each_sequences_logits_in_a_batched_step_are_its_logits_alone(model, data):
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(seed)
    block_size = data.draw(st.sampled_from([1, 4, 16]), label="block_size")
    decoder = HFDecoder(model)
    # Mixed steps as one forward, or as two (decodes apart) whenever that is less work.
    decoder.forward_tokens = data.draw(st.sampled_from([0, 10**9]), label="forward_tokens")
    decoder.allocate_kv(256 // block_size + 8, block_size)
    blocks = Blocks(256 // block_size + 8, block_size, seed)
    lengths = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=6), label="lengths")
    seqs = {i: rng.integers(0, VOCAB, n) for i, n in enumerate(lengths)}
    done = dict.fromkeys(seqs, 0)
    while any(done[i] < len(s) for i, s in seqs.items()):
        going = [i for i in seqs if done[i] < len(seqs[i])]
        chosen = [i for i in going if rng.random() < 0.7] or going[:1]
        rows, samples = [], []
        for i in rng.permutation(chosen):
            n = int(rng.integers(1, len(seqs[i]) - done[i] + 1))  # a chunk, or one decode
            rows.append((int(i), seqs[i][done[i] : done[i] + n], done[i]))
            samples.append(bool(rng.random() < 0.8))
        got = decoder.generate(blocks.step(rows, samples))
        expected = [
            solo_logits(model, seqs[i][: s + len(t)])
            for (i, t, s), k in zip(rows, samples, strict=True)
            if k
        ]
        assert got.shape == (sum(samples), VOCAB)
        for row, want in zip(got, expected, strict=True):
            np.testing.assert_allclose(row, want, atol=1e-4, rtol=0)
        for i, t, s in rows:
            done[i] = s + len(t)


def reference(model, prompt, n):
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
            pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )  # fmt: skip
    return tuple(out[0, len(prompt) :].tolist())


def near_ties(model, prompts, got, n):
    """Each prompt whose tokens differ from ``generate``'s, asserted a near-tie (the top two
    logits at the first differing token within 1e-5), and reported."""
    ties = []
    for prompt, tokens in zip(prompts, got, strict=True):
        want = reference(model, prompt, n)
        if tuple(tokens) == want:
            continue
        k = next(j for j, (a, b) in enumerate(zip(tokens, want, strict=True)) if a != b)
        top = np.sort(solo_logits(model, [*prompt, *want[:k]]))[-2:]
        assert top[1] - top[0] <= 1e-5, f"{prompt}: {tokens} != generate's {want} at {k}"
        ties.append((prompt, k, float(top[1] - top[0])))
    for tie in ties:
        print(f"near-tie: prompt {tie[0]} differs at token {tie[1]}, top-two gap {tie[2]:.2e}")
    return ties


def test_greedy_tokens_on_the_runtimes_block_tables_equal_transformers_generate(model):
    decoder = HFDecoder(model)
    decoder.allocate_kv(64, 4)
    blocks = Blocks(64, 4, seed=1)
    out = {i: [] for i in range(len(PROMPTS))}
    step = blocks.step([(i, p, 0) for i, p in enumerate(PROMPTS)])
    for _ in range(8):
        nxt = decoder.generate(step).argmax(axis=1)
        rows = []
        for i, token in zip(step.seq_ids, nxt, strict=True):
            out[i].append(int(token))
            rows.append((i, [int(token)], len(PROMPTS[i]) + len(out[i]) - 1))
        step = blocks.step(rows)
    near_ties(model, PROMPTS, [out[i] for i in range(len(PROMPTS))], 8)


def test_concurrent_greedy_generations_match_transformers_alone(model):
    runner = labserve.Runner(HFDecoder(model), name="lm", max_num_batched_tokens=8)
    try:

        async def together():
            return await asyncio.gather(
                *(runner.generate.async_run(p, max_tokens=6, temperature=0) for p in PROMPTS)
            )

        got = runner.bg.run(together())  # on labserve's loop: all admitted in one iteration
        near_ties(model, PROMPTS, [c.token_ids for c in got], 6)
        snap = runner.generate.stats()
        assert max(snap.steps.num_seqs) > 1
        # The runtime hands labserve's block tables: the pool is the decoder's memory.
        assert runner.instance._own is None and snap.kv_memory == "model"
        assert snap.kv_bytes == sum(t.nbytes for t in runner.instance._cache.tensors)
        assert snap.kv_blocks_used == 0  # every block given back
    finally:
        runner.stop()


def test_kv_memory_is_the_tensors_allocated_and_the_step_writes_into_them(model):
    decoder = HFDecoder(model)
    tensors = decoder.allocate_kv(10, 4)
    assert sum(t.nbytes for t in tensors) == 10 * 4 * decoder.kv_bytes_per_token
    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = config.hidden_size // config.num_attention_heads
    assert decoder.kv_bytes_per_token == 2 * config.num_hidden_layers * kv_heads * head_dim * 4
    step = Blocks(10, 4, seed=3).step([(1, [5, 6, 7], 0), (2, [8], 0)])
    decoder.generate(step)
    written = np.zeros(40, dtype=bool)
    written[step.slot_mapping()] = True
    for t in tensors:  # exactly the step's slots hold K/V, in the very tensors returned
        held = t.abs().sum(dim=(1, 2)).numpy() > 0
        np.testing.assert_array_equal(held, written)


def test_the_pool_refuses_a_size_below_one(model):
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        HFDecoder(model).allocate_kv(4, 0)


def test_transformers_is_the_version_labserve_pins():
    # HFDecoder drives transformers' Cache and mask handling from the outside: another
    # release can change either (5.x renamed past_key_values to cache). Move the pin in
    # pyproject's text extra and constraints.txt together, after this file passes on it.
    pins = {
        re.search(r"transformers==([\w.]+)", (ROOT / name).read_text()).group(1)
        for name in ("pyproject.toml", "constraints.txt")
    }
    assert pins == {transformers.__version__}, (
        f"transformers {transformers.__version__} is installed; labserve pins {pins}:"
        " HFDecoder's paged cache is tested on the pinned release only"
    )


@contextlib.contextmanager
def raising_inside_the_model(model):
    """The model's second layer raises on its next forward, after the first layer wrote
    that forward's K/V."""
    layers = model.transformer.h if hasattr(model, "transformer") else model.model.layers

    def hook(module, args):
        raise RuntimeError("poisoned inside the model")

    handle = layers[1].register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


PREFILL = [(1, [5, 17, 3], 0), (2, [9, 9], 0), (3, [40, 41, 42, 43], 0)]
# Decodes, a prefill chunk after a cached one, and a first prefill, in one step.
STEP = [(1, [7], 3), (2, [11, 12, 13], 2), (3, [8], 4), (4, [60, 61], 0)]


def own(rows):
    """A SeqBatch without block tables (the decoder keeps its own), every row sampling."""
    ids, tokens, starts = zip(*rows, strict=True)
    arrays = tuple(np.asarray(t, dtype=np.int64) for t in tokens)
    return SeqBatch(ids, arrays, starts, (True,) * len(ids))


def test_a_retried_subset_rewrites_its_slots_to_the_logits_of_a_step_that_never_raised(model):
    clean, failing = HFDecoder(model), HFDecoder(model)
    for decoder in (clean, failing):
        decoder.allocate_kv(32, 2)
    blocks = Blocks(32, 2, seed=5)
    prefill, step = blocks.step(PREFILL), blocks.step(STEP)
    clean.generate(prefill), failing.generate(prefill)
    expected = clean.generate(step)
    with raising_inside_the_model(model), pytest.raises(RuntimeError, match="poisoned"):
        failing.generate(step)
    # isolate_errors bisects: each half runs again on the same slots, with no rollback.
    halves = failing.generate(step.subset([0, 1])), failing.generate(step.subset([2, 3]))
    np.testing.assert_allclose(np.concatenate(halves), expected, atol=1e-5, rtol=0)
    after = blocks.step([(4, [1], 2)])
    np.testing.assert_allclose(failing.generate(after), clean.generate(after), atol=1e-5, rtol=0)


def test_a_step_that_raised_rolls_back_its_own_tables(model):
    clean, failing = HFDecoder(model), HFDecoder(model)
    for decoder in (clean, failing):
        decoder.generate(own(PREFILL))
    expected = clean.generate(own(STEP))
    with raising_inside_the_model(model), pytest.raises(RuntimeError, match="poisoned"):
        failing.generate(own(STEP))
    failing.rollback_step(own(STEP))
    assert 4 not in failing._own  # sequence 4 (at start 0) lost its blocks
    np.testing.assert_allclose(failing.generate(own(STEP)), expected, atol=1e-5, rtol=0)
    after = own([(4, [1], 2)])
    np.testing.assert_allclose(failing.generate(after), clean.generate(after), atol=1e-5, rtol=0)


def test_a_step_whose_start_does_not_match_its_blocks_raises_before_running_any(model):
    decoder = HFDecoder(model)
    decoder.generate(own(PREFILL))
    with pytest.raises(RuntimeError, match="cache holds 2 tokens; its step starts at 3"):
        decoder.generate(own([(1, [7], 3), (2, [11], 3)]))
    with pytest.raises(RuntimeError, match="sequence 9 has no cache for its 4 tokens"):
        decoder.generate(own([(9, [7], 4)]))
    decoder.generate(own([(1, [7], 3)]))  # sequence 1 did not run: it goes on at 3


def test_its_own_pool_grows_when_its_blocks_run_out(model):
    decoder = HFDecoder(model)
    long = list(range(1, 80))
    got = decoder.generate(own([(i, long, 0) for i in range(20)]))  # 100 blocks of 16
    assert decoder._own.num_blocks >= 100
    np.testing.assert_allclose(got[-1], solo_logits(model, long), atol=1e-4, rtol=0)
    decoder.free_sequences(range(20))
    assert decoder._own.num_free == decoder._own.num_blocks


def test_a_step_without_tables_after_the_runtime_allocated_the_pool_is_refused(model):
    decoder = HFDecoder(model)
    decoder.allocate_kv(8, 4)
    with pytest.raises(RuntimeError, match="it must hand every step its tables"):
        decoder.generate(own(PREFILL))


def test_a_sliding_window_model_is_refused_naming_why():
    config = transformers.MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, sliding_window=8,
    )  # fmt: skip
    with pytest.raises(TypeError, match="sliding window of 8 tokens"):
        HFDecoder(transformers.MistralForCausalLM(config))


class PoisonedDecoder(HFDecoder):
    """Runs the model on every sequence of the step, then raises if a poisoned one decodes."""

    @labserve.method(generative=True, max_num_seqs=16, max_num_batched_tokens=512)
    def generate(self, batch: SeqBatch) -> np.ndarray:
        rows = super().generate(batch)
        for seq_id, tokens, start, _ in batch:
            if start == 0 and tokens[0] == POISON:
                self.poisoned.add(seq_id)
            elif seq_id in self.poisoned:
                raise RuntimeError(f"sequence {seq_id} is poisoned")
        return rows

    poisoned: set[int]

    def __init__(self, model):
        super().__init__(model)
        self.poisoned = set()


def test_isolate_errors_fails_only_the_poisoned_sequence_of_a_hugging_face_model():
    model = MODELS["gpt2"]
    # Runner(isolate_errors=True) does not reach a generative method (its settings go by
    # method_configs, or the decorator): the same as the lead's driver reads.
    runner = labserve.Runner(
        PoisonedDecoder(model), name="gpt2", method_configs={"generate": {"isolate_errors": True}}
    )
    assert runner.generate.config.isolate_errors
    prompts = [*PROMPTS[:4], [POISON, 3, 4], *PROMPTS[4:8]]
    try:

        async def together():
            calls = (runner.generate.async_run(p, max_tokens=6, temperature=0) for p in prompts)
            return await asyncio.gather(*calls, return_exceptions=True)

        got = runner.bg.run(together())
        assert isinstance(got[4], labserve.ModelError)
        assert "poisoned" in str(got[4])
        healthy = [g for i, g in enumerate(got) if i != 4]
        near_ties(
            model, [p for i, p in enumerate(prompts) if i != 4], [c.token_ids for c in healthy], 6
        )
        assert max(runner.generate.stats().steps.num_seqs) > 1
        assert runner.generate.stats().kv_blocks_used == 0  # bisected without a rollback hook
    finally:
        runner.stop()


def test_profile_steps_runs_on_a_hugging_face_model():
    # Each timed step is rolled back to the cached context: this needs rollback_step.
    profile = profile_steps(
        HFDecoder(MODELS["gpt2"]),
        shapes=[(1, 1, 0), (2, 1, 4), (2, 3, 4), (1, 2, 8)],
        repeats=2,
        warmup=0,
    )
    assert len(profile.points) == 4


def test_one_torch_thread_by_default_none_leaves_it():
    model = MODELS["gpt2"]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        HFDecoder(model, threads=None)
        assert torch.get_num_threads() == 2
        HFDecoder(model)
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="threads must be an integer >= 1 or None, got 0"):
            HFDecoder(model, threads=0)
    finally:
        torch.set_num_threads(before)


def test_a_sequence_reading_another_sequences_cached_blocks_gets_its_logits_alone(model):
    # A prefix hit as the scheduler makes it: B's table starts with A's full blocks, and
    # B's first step starts after them.
    decoder = HFDecoder(model)
    decoder.allocate_kv(32, 4)
    blocks = Blocks(32, 4, seed=2)
    shared = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    decoder.generate(blocks.step([(0, [*shared, 40, 41], 0)]))
    blocks.tables[1] = list(blocks.tables[0][:2])  # A's two full blocks: 8 tokens
    b = [*shared, 70, 71, 72]
    got = decoder.generate(blocks.step([(1, b[8:], 8)]))
    np.testing.assert_allclose(got[0], solo_logits(model, b), atol=1e-4, rtol=0)


def test_greedy_tokens_with_prefix_cache_hits_match_transformers_alone(model):
    runner = labserve.Runner(HFDecoder(model), name="lm", block_size=4)
    shared = [5, 9, 13, 17, 21, 25, 29, 33, 37, 41]
    prompts = [[*shared, 60 + i] for i in range(3)]
    try:
        assert runner.generate.config.enable_prefix_caching is True
        got = [runner.generate.run(p, max_tokens=4, temperature=0).token_ids for p in prompts]
        near_ties(model, prompts, got, 4)
        assert runner.generate.stats().prefix_cache_hits == 2 * 8  # 2 full blocks, twice
    finally:
        runner.stop()
