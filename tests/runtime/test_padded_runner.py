"""A padded method on the real runtime: ragged callers share batches and get their own rows."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import labserve


class Tokens(labserve.Runnable):
    """Masked per-row running sums; it records each batch's padded shape and lengths."""

    def __init__(self) -> None:
        self.batches: list[tuple[tuple[int, ...], list[int]]] = []
        self.gate = threading.Event()

    @labserve.method(
        batchable=True,
        pad=labserve.Padding(axis=1, pad_value=-1, output_axis={"running": 1}),
        max_batch_size=64,
        max_latency_ms=50,
        strategy="fixed",
    )
    def encode(self, ids: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
        self.gate.wait(5)
        self.batches.append((ids.shape, lengths.tolist()))
        mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        kept = np.where(mask, ids, 0)
        return {"running": np.cumsum(kept, axis=1), "total": kept.sum(axis=1)}


def test_callers_of_many_lengths_share_one_batch_and_get_their_own_rows(make_runner):
    runner = make_runner(Tokens, name="tok")
    runner.encode.start()
    model = runner.encode.model_fn.func.__self__
    calls = [np.arange(1, n + 1)[None] for n in (5, 1, 9, 3)] + [[[1, 2], [3, 4, 5, 6]]]

    async def send() -> list[object]:
        return await asyncio.gather(*(runner.encode.async_run(c) for c in calls))

    future = asyncio.run_coroutine_threadsafe(send(), runner.bg.loop)
    model.gate.set()
    results = future.result(10)
    sizes = [shape for shape, _ in model.batches]
    assert sum(s[0] for s in sizes) == 6 and max(s[1] for s in sizes) == 9
    assert any(len(set(lengths)) > 1 for _, lengths in model.batches)  # lengths shared a batch
    for call, got in zip(calls[:4], results[:4], strict=True):
        np.testing.assert_array_equal(got["running"], np.cumsum(call, axis=1))
        np.testing.assert_array_equal(got["total"], call.sum(axis=1))
    rows = results[4]
    np.testing.assert_array_equal(rows["running"][0], [1, 3])
    np.testing.assert_array_equal(rows["running"][1], [3, 7, 12, 18])
    np.testing.assert_array_equal(rows["total"], [3, 18])


def test_a_bad_ragged_request_fails_alone(make_runner):
    runner = make_runner(Tokens, name="tok")
    runner.encode.start()
    model = runner.encode.model_fn.func.__self__
    model.gate.set()
    with pytest.raises(labserve.InputError, match="does not match row 0"):
        runner.encode.run([np.ones((2, 2)), np.ones((3, 1))])
    np.testing.assert_array_equal(runner.encode.run(np.array([[4, 5]]))["total"], [9])
