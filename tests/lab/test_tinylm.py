"""TinyLM: a real KV cache, and greedy tokens that do not depend on the batch or the chunking."""

from __future__ import annotations

import numpy as np
import pytest

from labserve.generation.batch import SeqBatch
from labserve.lab.demo import TinyLM

TOKENS = 12


@pytest.fixture(scope="module")
def lm():
    return TinyLM()


def _prompts(n, seed=0, low=1, high=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, rng.integers(low, high + 1)) for _ in range(n)]


def greedy(lm, prompts, *, chunk=10_000, join_every=0, seed=0):
    """Generate TOKENS greedy tokens for every prompt, batched, with prefill chunks of at
    most ``chunk`` tokens; with ``join_every`` > 0, prompt i joins at step i * join_every
    (so each one runs beside others at different stages). Returns the token lists."""
    rng = np.random.default_rng(seed)
    ids = [1000 + i for i in range(len(prompts))]
    known = [list(map(int, p)) for p in prompts]
    computed = [0] * len(prompts)
    out = [[] for _ in prompts]
    step = 0
    while any(len(o) < TOKENS for o in out):
        rows = [i for i in range(len(prompts)) if len(out[i]) < TOKENS and step >= i * join_every]
        rng.shuffle(rows)  # the order within the batch must not matter either
        tokens, starts, samples = [], [], []
        for i in rows:
            n = min(len(known[i]) - computed[i], chunk)
            tokens.append(np.asarray(known[i][computed[i] : computed[i] + n], np.int64))
            starts.append(computed[i])
            samples.append(computed[i] + n == len(known[i]))
        if rows:
            logits = lm.generate(
                SeqBatch(tuple(ids[i] for i in rows), tuple(tokens), tuple(starts), tuple(samples))
            )
            assert logits.shape == (sum(samples), 256)
            it = iter(np.argmax(logits, axis=1))
            for i, t, s in zip(rows, tokens, samples, strict=True):
                computed[i] += len(t)
                if s:
                    tok = int(next(it))
                    out[i].append(tok)
                    known[i].append(tok)
        step += 1
    lm.free_sequences(ids)
    return out


def test_greedy_tokens_are_the_same_alone_and_in_any_batch_or_chunking(lm):
    prompts = _prompts(24, seed=1)
    alone = [greedy(lm, [p])[0] for p in prompts]
    mixes = [
        greedy(lm, prompts),  # all at once
        greedy(lm, prompts, chunk=3, seed=2),  # prefills in chunks of 3
        greedy(lm, prompts, chunk=7, join_every=1, seed=3),  # joining one by one
        greedy(lm, prompts[::-1], chunk=1, join_every=2, seed=4)[::-1],  # token by token
    ]
    for mix in mixes:
        assert mix == alone
    assert lm.num_cached_sequences == 0


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_invariance_holds_on_long_prompts_in_mixed_batches(lm, seed):
    prompts = _prompts(8, seed=seed, low=60, high=200)
    alone = [greedy(lm, [p], chunk=64)[0] for p in prompts]
    assert greedy(lm, prompts, chunk=37, join_every=3, seed=seed) == alone


def test_the_model_is_not_trivial(lm):
    # Different prompts lead to different continuations, and the cache is used: the same
    # last token after different contexts gives different logits.
    outs = greedy(lm, _prompts(10, seed=9))
    assert len({tuple(o) for o in outs}) > 5
    a = lm.generate(SeqBatch((1,), (np.array([5, 9, 200, 7]),), (0,), (True,)))
    b = lm.generate(SeqBatch((2,), (np.array([80, 1, 33, 7]),), (0,), (True,)))
    assert not np.allclose(a, b)
    lm.free_sequences([1, 2])


def test_a_rolled_back_step_leaves_the_cache_as_before(lm):
    p = np.array([10, 20, 30, 40], np.int64)
    first = lm.generate(SeqBatch((1,), (p,), (0,), (True,)))
    tok = np.array([int(first.argmax())], np.int64)
    ok = lm.generate(SeqBatch((1,), (tok,), (4,), (True,)))
    lm.free_sequences([1])
    lm.generate(SeqBatch((1,), (p,), (0,), (True,)))
    step = SeqBatch((1,), (tok,), (4,), (True,))
    lm.generate(step)
    lm.rollback_step(step)
    again = lm.generate(step)
    np.testing.assert_array_equal(again, ok)
    lm.rollback_step(SeqBatch((1,), (p,), (0,), (True,)))  # a first step's rollback drops it
    assert lm.num_cached_sequences == 0


def test_a_step_past_the_context_raises():
    small = TinyLM(max_model_len=8)
    with pytest.raises(ValueError, match="max_model_len"):
        small.generate(SeqBatch((1,), (np.arange(9),), (0,), (True,)))


def test_encode_is_utf8_bytes(lm):
    assert lm.encode("hé") == [104, 195, 169]
    assert b"".join(lm.token_bytes(t) for t in lm.encode("hé")).decode() == "hé"


def test_logits_are_bit_identical_alone_and_batched_not_just_their_argmax(lm):
    prompts = _prompts(16, seed=11, low=5, high=90)
    alone = []
    for i, p in enumerate(prompts):
        alone.append(lm.generate(SeqBatch((i,), (p,), (0,), (True,)))[0])
        lm.free_sequences([i])
    # The same prompts in one batch, the odd ones split into two chunks.
    ids, toks, starts, samples = [], [], [], []
    for i, p in enumerate(prompts):
        if i % 2 and len(p) > 1:
            cut = len(p) // 2
            lm.generate(SeqBatch((i,), (p[:cut],), (0,), (False,)))
            ids.append(i), toks.append(p[cut:]), starts.append(cut), samples.append(True)
        else:
            ids.append(i), toks.append(p), starts.append(0), samples.append(True)
    batched = lm.generate(SeqBatch(tuple(ids), tuple(toks), tuple(starts), tuple(samples)))
    lm.free_sequences(ids)
    for i, row in zip(ids, batched, strict=True):
        assert np.array_equal(row, alone[i]), f"prompt {i}: logits differ"


def paged_greedy(prompts, *, chunk, seed, num_blocks=256, block_size=4):
    """greedy() on a TinyLM that stores K/V in a pool whose blocks this test hands out (a
    shuffled free list, so that tables are scattered), with a preemption midway: the
    sequence that started last drops its blocks and is recomputed from its first token."""
    lm = TinyLM()
    lm.allocate_kv(num_blocks, block_size)
    rng = np.random.default_rng(seed)
    free = rng.permutation(num_blocks).tolist()
    tables = [[] for _ in prompts]
    known = [list(map(int, p)) for p in prompts]
    computed = [0] * len(prompts)
    out = [[] for _ in prompts]
    step = 0
    while any(len(o) < TOKENS for o in out):
        if step == 6:  # preempt the last one: its blocks go back, it starts over
            free += tables[-1]
            tables[-1], computed[-1] = [], 0
        rows = [i for i in range(len(prompts)) if len(out[i]) < TOKENS]
        rng.shuffle(rows)
        toks, starts, samples, blocks = [], [], [], []
        for i in rows:
            n = min(len(known[i]) - computed[i], chunk)
            while len(tables[i]) * block_size < computed[i] + n:
                tables[i].append(free.pop())
            toks.append(np.asarray(known[i][computed[i] : computed[i] + n], np.int64))
            starts.append(computed[i])
            samples.append(computed[i] + n == len(known[i]))
            blocks.append(tuple(tables[i]))
        batch = SeqBatch(
            tuple(rows), tuple(toks), tuple(starts), tuple(samples), tuple(blocks), block_size
        )
        it = iter(np.argmax(lm.generate(batch), axis=1))
        for i, t, s in zip(rows, toks, samples, strict=True):
            computed[i] += len(t)
            if s and computed[i] == len(known[i]) and len(out[i]) < TOKENS:
                tok = int(next(it))
                if len(known[i]) - len(prompts[i]) == len(out[i]):
                    out[i].append(tok)
                    known[i].append(tok)
        step += 1
    return out


def test_paged_tokens_equal_solo_runs_under_any_table_chunking_or_preemption(lm):
    prompts = _prompts(10, seed=21, low=3, high=50)
    alone = [greedy(lm, [p])[0] for p in prompts]
    for seed, chunk in ((1, 10_000), (2, 5), (3, 1)):
        assert paged_greedy(prompts, chunk=chunk, seed=seed) == alone
    assert lm.num_cached_sequences == 0


def test_a_paged_tinylm_refuses_a_step_without_tables_or_of_another_block_size():
    paged = TinyLM(d_model=32, d_ff=64)
    arrays = paged.allocate_kv(8, 4)
    assert sum(a.nbytes for a in arrays) == 8 * 4 * paged.kv_bytes_per_token
    with pytest.raises(ValueError, match="needs tables"):
        paged.generate(SeqBatch((1,), (np.array([1, 2]),), (0,), (True,)))
    with pytest.raises(ValueError, match="blocks of 8 positions"):
        paged.generate(SeqBatch((1,), (np.array([1, 2]),), (0,), (True,), ((0,),), 8))


def test_a_decode_step_over_contexts_of_every_length_gives_each_its_logits_alone():
    # 40 decoding sequences whose contexts run from 1 to 160 tokens, tables scattered over
    # the pool: TinyLM attends them in groups of similar lengths, padded with block 0 and
    # masked; each row must be bit-identical to that sequence's decode step alone.
    block_size, rng = 4, np.random.default_rng(31)
    lengths = np.linspace(1, 160, 40).astype(int).tolist()
    prompts = [rng.integers(0, 256, n) for n in lengths]
    lm = TinyLM()
    lm.allocate_kv(2000, block_size)
    free = rng.permutation(2000).tolist()
    tables = [tuple(free.pop() for _ in range(-(-(n + 1) // block_size))) for n in lengths]
    ids = tuple(range(len(prompts)))

    def step(rows, tokens, starts):
        batch = SeqBatch(
            tuple(ids[i] for i in rows),
            tuple(tokens),
            tuple(starts),
            (True,) * len(rows),
            tuple(tables[i] for i in rows),
            block_size,
        )
        return lm.generate(batch)

    step(ids, [p.astype(np.int64) for p in prompts], [0] * len(ids))
    nxt = [np.array([7], np.int64)] * len(ids)
    together = step(ids, nxt, lengths)
    alone = [step([i], nxt[:1], [lengths[i]])[0] for i in ids]  # rewrites the same slots
    for i in ids:
        assert np.array_equal(together[i], alone[i]), f"context {lengths[i]}: logits differ"
