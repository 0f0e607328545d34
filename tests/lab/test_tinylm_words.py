"""TinyLM's shipped weights write words, end texts with their EOS byte, and stay batch-invariant.

The weights were trained by ``scripts/train_tinylm.py`` on Python's docs
(``pydoc_data/topics.py``); the prompts below are English that does not occur there.
"""

from __future__ import annotations

import re
from pydoc_data import topics

import numpy as np
import pytest

import labserve
from labserve.generation.batch import SeqBatch
from labserve.lab.demo import TinyLM
from labserve.lab.tinylm import TINYLM_EOS

PROMPTS = [
    "The weather today is",
    "My favourite colour is",
    "When the train arrived, we",
    "She opened the window and",
    "A good breakfast should",
    "The children played in the",
    "After the meeting, the manager",
    "Our garden has a",
    "He wrote a letter to",
    "In the morning the city",
]
TOKENS = 64
WORD = re.compile(r"[A-Za-z]{2,}")


@pytest.fixture(scope="module")
def lm():
    return TinyLM()


@pytest.fixture(scope="module")
def continuations(lm):
    """Each prompt's greedy 64 tokens (EOS not stopping them), all prompts in one batch."""
    ids = tuple(range(len(PROMPTS)))
    known = [lm.encode(p) for p in PROMPTS]
    starts = [0] * len(PROMPTS)
    for _ in range(TOKENS):
        tokens = tuple(np.asarray(k[s:], np.int64) for k, s in zip(known, starts, strict=True))
        logits = lm.generate(SeqBatch(ids, tokens, tuple(starts), (True,) * len(ids)))
        for i, token in enumerate(np.argmax(logits, axis=1)):
            starts[i] = len(known[i])
            known[i].append(int(token))
    lm.free_sequences(ids)
    return [bytes(k[len(lm.encode(p)) :]) for k, p in zip(known, PROMPTS, strict=True)]


def test_the_prompts_are_not_in_the_training_text():
    text = "".join(topics.topics.values())
    assert not [p for p in PROMPTS if p in text]


@pytest.fixture(scope="module")
def vocabulary():
    return {w.lower() for w in WORD.findall("".join(topics.topics.values()))}


@pytest.mark.parametrize("i", range(len(PROMPTS)), ids=PROMPTS)
def test_each_greedy_continuation_is_words_from_the_training_text(continuations, vocabulary, i):
    # Issue 36's bar, per continuation of 64 bytes: 60% letters and spaces, 5 distinct
    # words of 2+ letters, 70% of those words in the training text. Seeded weights write
    # none; the weights before these met it on 3 of the 10 ("conteration").
    text = continuations[i].decode("latin-1")
    letters = sum(c.isascii() and (c.isalpha() or c == " ") for c in text)
    words = {w.lower() for w in WORD.findall(text)}
    assert letters >= 0.6 * len(text), text
    assert len(words) >= 5, text
    assert len(words & vocabulary) >= 0.7 * len(words), (text, sorted(words - vocabulary))


def test_the_weights_end_texts_with_their_eos_byte(lm):
    assert lm.eos_token_id == TINYLM_EOS == 3
    assert TINYLM_EOS not in "".join(topics.topics.values()).encode()  # reserved: never text
    # Seeded weights never learned an end: they keep no EOS, as before.
    assert TinyLM(weights="random").eos_token_id is None


def _run_all(runner, prompts, **sampling):
    """(text, finish) of each prompt sampled at temperature 1 with its own seed, all at once."""
    streams = [
        runner.generate.stream(p, temperature=1.0, seed=i, **sampling)
        for i, p in enumerate(prompts)
    ]
    return [("".join(s), s.finish) for s in streams]


def test_eos_ends_some_generations_before_max_tokens_and_ignore_eos_runs_them_all():
    # Sampled (seeded: the same every run), as a client's default temperature 1 does.
    with labserve.Runner(TinyLM, name="words", max_num_seqs=16) as runner:
        ended = _run_all(runner, PROMPTS, max_tokens=200)
        fixed = _run_all(runner, PROMPTS[:4], max_tokens=200, ignore_eos=True)
    stopped = [(text, f) for text, f in ended if f.reason == "stop"]
    assert stopped, [text for text, _ in ended]
    for text, finish in stopped:
        assert finish.completion_tokens < 200
        assert chr(TINYLM_EOS) not in text  # the EOS token ends the text, it is not in it
    assert len({f.completion_tokens for _, f in ended}) > 1  # lengths vary
    assert [f.completion_tokens for _, f in fixed] == [200] * 4


def test_the_shipped_weights_load_for_a_shorter_context_and_refuse_another_shape(tmp_path):
    short = TinyLM(max_model_len=64)
    assert short.positions.shape == (64, 128) and short.eos_token_id == TINYLM_EOS
    with pytest.raises(ValueError, match="does not fit this TinyLM"):
        TinyLM(d_model=64, weights="trained")
