"""A Hugging Face decoder wrapped in a page (labserve.lab.hf.HFDecoder), served by
continuous batching: its greedy tokens under concurrent load equal transformers' own
``generate`` for each prompt alone. A small GPT-2 with seeded random weights: no network.
"""

from __future__ import annotations

import asyncio

import pytest

import labserve

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from labserve.lab.hf import HFDecoder  # noqa: E402

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
