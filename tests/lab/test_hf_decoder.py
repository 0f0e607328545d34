"""A Hugging Face decoder wrapped in a page (labserve.lab.hf.HFDecoder), served by
continuous batching: its greedy tokens under concurrent load equal transformers' own
``generate`` for each prompt alone, and a step that raises is rolled back exactly (so
``isolate_errors`` fails only the poisoned sequence). A small GPT-2 with seeded random
weights: no network.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

import labserve
from labserve.generation.batch import SeqBatch
from labserve.lab.steps import profile_steps

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from labserve.lab.hf import HFDecoder  # noqa: E402

POISON = 96  # a prompt starting with this id makes its sequence's decode steps raise

PROMPTS = [[5 + i, 17, 3 * i % 90 + 1, 42][: 2 + i % 3] for i in range(10)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=97,
        n_positions=64,
        bos_token_id=None,
        eos_token_id=None,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def reference(model, prompt, n):
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )
    return tuple(out[0, len(prompt) :].tolist())


def test_concurrent_greedy_generations_match_transformers_alone(model):
    runner = labserve.Runner(HFDecoder(model), name="gpt2", max_num_batched_tokens=8)
    try:

        async def together():
            return await asyncio.gather(
                *(runner.generate.async_run(p, max_tokens=6, temperature=0) for p in PROMPTS)
            )

        got = runner.bg.run(together())  # on labserve's loop: all admitted in one iteration
        assert [c.token_ids for c in got] == [reference(model, p, 6) for p in PROMPTS]
        assert max(runner.generate.stats().steps.num_seqs) > 1
        assert runner.instance._past == {}  # every cache freed
    finally:
        runner.stop()


def batch(*rows):
    """A SeqBatch of (seq_id, tokens, start) rows, every row sampling."""
    ids, tokens, starts = zip(*rows, strict=True)
    arrays = tuple(np.asarray(t, dtype=np.int64) for t in tokens)
    return SeqBatch(ids, arrays, starts, (True,) * len(ids))


@contextlib.contextmanager
def raising_inside_the_model(model, on_call):
    """The model's second layer raises on its ``on_call``-th forward (1-based), after the
    first layer has put that forward's tokens in the cache."""
    calls = 0

    def hook(module, args):
        nonlocal calls
        calls += 1
        if calls == on_call:
            raise RuntimeError("poisoned inside the model")

    handle = model.transformer.h[1].register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


PREFILL = batch((1, [5, 17, 3], 0), (2, [9, 9], 0), (3, [40, 41, 42, 43], 0))
# Decodes, a prefill chunk after a cached one, and a first prefill, in one step.
STEP = batch((1, [7], 3), (2, [11, 12, 13], 2), (3, [8], 4), (4, [60, 61], 0))


@pytest.mark.parametrize("on_call", [1, 2, 3, 4])
def test_a_step_that_raised_rolls_back_to_the_logits_of_one_that_never_did(model, on_call):
    clean, failing = HFDecoder(model), HFDecoder(model)
    for decoder in (clean, failing):
        decoder.generate(PREFILL)
    expected = clean.generate(STEP)
    with raising_inside_the_model(model, on_call), pytest.raises(RuntimeError, match="poisoned"):
        failing.generate(STEP)
    failing.rollback_step(STEP)
    assert failing._past.keys() == {1, 2, 3}  # sequence 4 (at start 0) lost its cache
    np.testing.assert_array_equal(failing.generate(STEP), expected)
    np.testing.assert_array_equal(
        failing.generate(batch((4, [1], 2))), clean.generate(batch((4, [1], 2)))
    )


def test_a_cache_that_cannot_be_cut_fails_its_next_step_naming_why(model):
    class Uncroppable:
        def get_seq_length(self):
            return 5

        def crop(self, n):
            raise RuntimeError("cannot go back past the sliding window")

    decoder = HFDecoder(model)
    decoder.generate(PREFILL)
    decoder._past[1].layers[0] = Uncroppable()
    decoder.rollback_step(batch((1, [7], 3)))
    assert 1 not in decoder._past
    with pytest.raises(
        RuntimeError, match=r"sequence 1 has no cache for its 3 tokens \(a rollback"
    ):
        decoder.generate(batch((1, [7], 3)))
    decoder.generate(batch((2, [11], 2)))  # the others go on
    decoder.free_sequences([1, 2, 3])
    assert decoder._past == {} and decoder._lost == {}


def test_a_step_whose_start_does_not_match_the_cache_raises_before_running_any(model):
    decoder = HFDecoder(model)
    decoder.generate(PREFILL)
    with pytest.raises(RuntimeError, match="cache holds 2 tokens; its step starts at 3"):
        decoder.generate(batch((1, [7], 3), (2, [11], 3)))
    assert decoder._past[1].get_seq_length() == 3  # sequence 1 did not run


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


def test_isolate_errors_fails_only_the_poisoned_sequence_of_a_hugging_face_model(model):
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
        assert [c.token_ids for c in healthy] == [
            reference(model, p, 6) for i, p in enumerate(prompts) if i != 4
        ]
        assert max(runner.generate.stats().steps.num_seqs) > 1
        assert runner.instance._past == {}
    finally:
        runner.stop()


def test_profile_steps_runs_on_a_hugging_face_model(model):
    # Each timed step is rolled back to the cached context: this needs rollback_step.
    profile = profile_steps(
        HFDecoder(model), shapes=[(1, 1, 0), (2, 1, 4), (2, 3, 4), (1, 2, 8)], repeats=2, warmup=0
    )
    assert len(profile.points) == 4


def test_one_torch_thread_by_default_none_leaves_it(model):
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
