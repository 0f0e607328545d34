"""labserve.lab.generation.paged_kv: both layouts of a step (packed, padded) give each
sequence its logits alone, and the planner picks the one that computes less."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from labserve.lab.generation.paged_kv import PagedKVCache, plan_step, step_groups  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, vocab_size=61, max_position_embeddings=64,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def run(model, cache, tokens, starts, tables, layout):
    plan = plan_step(
        tokens, starts, (True,) * len(tokens), tables, 2,
        hidden_size=32, dtype=torch.float32, layout=layout,
    )  # fmt: skip
    cache.bind(plan)
    with torch.inference_mode():
        out = model(
            input_ids=plan.input_ids, position_ids=plan.position_ids, attention_mask=plan.mask,
            cache=cache, use_cache=True, logits_to_keep=plan.keep,
        )  # fmt: skip
    cache.check_all_layers_ran()
    return plan, out.logits.reshape(-1, 61)[plan.pick].numpy()


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_each_layout_gives_every_sequence_its_logits_alone(model, layout):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 61, n) for n in (9, 3, 6)]
    tables = [(7, 2, 11, 0, 5), (9, 1), (3, 10, 4)]  # shuffled, interleaved blocks of 2
    cache = PagedKVCache(2, 24, 1, 8, torch.float32)
    splits = [(4, 2, 1), (9, 3, 6)]  # a prefill chunk each, then the rest (a decode for one)
    done = [0, 0, 0]
    for ends in splits:
        tokens = [s[d:e] for s, d, e in zip(seqs, done, ends, strict=True)]
        plan, got = run(model, cache, tokens, done, tables, layout)
        assert plan.packed == (layout == "packed")
        for s, e, row in zip(seqs, ends, got, strict=True):
            with torch.inference_mode():
                want = model(input_ids=torch.tensor(s[:e])[None]).logits[0, -1].numpy()
            np.testing.assert_allclose(row, want, atol=1e-5, rtol=0)
        done = list(ends)


def test_decodes_pad_and_a_chunk_beside_decodes_packs():
    tables = [tuple(range(i * 70, i * 70 + 70)) for i in range(32)]
    decodes = [np.array([1])] * 32
    plan = plan_step(
        decodes, [127] * 32, [True] * 32, tables, 2, hidden_size=256, dtype=torch.float32
    )
    assert not plan.packed and plan.input_ids.shape == (32, 1)
    mixed = [np.arange(64), *decodes[:31]]
    plan = plan_step(
        mixed, [0] + [127] * 31, [True] * 32, tables, 2, hidden_size=256, dtype=torch.float32
    )
    assert plan.packed and plan.input_ids.shape == (1, 95)


def test_a_chunk_beside_many_decodes_runs_apart_from_them_when_that_is_less_work():
    decodes, starts = [np.array([1])] * 31, [100] * 31
    mixed = [*decodes[:15], np.arange(64), *decodes[15:]]
    groups = step_groups(mixed, [*starts[:15], 0, *starts[15:]], hidden_size=256)
    assert groups == [[*range(15), *range(16, 32)], [15]]  # decodes in step order, the chunk
    assert step_groups(decodes, starts, hidden_size=256) == [list(range(31))]
    assert step_groups([np.arange(64)] * 2, [0, 64], hidden_size=256) == [[0, 1]]
    # One decode beside the chunk: a second forward's own cost is more than it saves.
    assert step_groups([np.arange(64), np.array([1])], [0, 100], hidden_size=256) == [[0, 1]]
    assert step_groups(
        [np.arange(64), np.array([1])], [0, 100], hidden_size=256, forward_tokens=0
    ) == [[1], [0]]


def test_a_model_whose_layers_skip_the_cache_is_named():
    cache = PagedKVCache(2, 4, 1, 8, torch.float32)
    cache.bind(
        plan_step([np.array([1])], [0], [True], [(0,)], 4, hidden_size=8, dtype=torch.float32)
    )
    with pytest.raises(RuntimeError, match=r"layers \[0, 1\] never stored K/V"):
        cache.check_all_layers_ran()
    with pytest.raises(ValueError, match="layout must be None, 'packed' or 'padded'"):
        plan_step(
            [np.array([1])], [0], [True], [(0,)], 4, hidden_size=8, dtype=torch.float32, layout="x"
        )
