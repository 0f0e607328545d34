"""Embedded demo models (numpy only): nothing to download, the lessons and tests use them."""

from __future__ import annotations

import time

import numpy as np

from labserve.batching.containers import TensorSpec
from labserve.lab.tinylm import TinyLM
from labserve.runtime.runnable import Runnable, method
from labserve.sim.generation import StepCost

__all__ = ["TINYLM_STEP_COST", "MemoryBoundModel", "SleepModel", "TinyLM"]

TINYLM_STEP_COST = StepCost(
    fixed_ms=0.443,
    per_seq_ms=0.0685,
    per_batched_token_ms=0.02264,
    per_context_token_ms=0.0000595,
)
"""One step of ``TinyLM()`` (its default size) as profiled and fitted by
:func:`labserve.lab.steps.profile_steps`: CPU time on one core of the 2-core lab machine,
OpenBLAS on one thread, 2026-12-02 (``benchmarks/generation/profile_tinylm.py``; its
points and fit in ``benchmarks/generation/tinylm_step_cost.json``). A 32-sequence decode
step at short contexts costs about 3.4 ms by it. What ``simulate_generation`` takes to
play TinyLM on the virtual clock; profile again on your machine for its own figures."""


class SleepModel(Runnable):
    """A model whose batch costs exactly ``a_ms + b_ms * items`` (a sleep): for teaching.

    Returns each row's sum, shape (items, 1).

    >>> SleepModel(a_ms=0.0, b_ms=0.0).predict(np.ones((2, 3)))
    array([[3.],
           [3.]])
    """

    def __init__(self, a_ms: float = 2.0, b_ms: float = 0.1) -> None:
        if a_ms < 0 or b_ms < 0:
            raise ValueError(f"a_ms and b_ms must be >= 0, got {a_ms!r} and {b_ms!r}")
        self.a_ms = a_ms
        self.b_ms = b_ms

    @method(batchable=True, batch_dim=0, max_batch_size=64, max_latency_ms=20)
    def predict(self, x: np.ndarray) -> np.ndarray:
        """Sleep for the batch's cost, then return the row sums."""
        time.sleep((self.a_ms + self.b_ms * len(x)) / 1000.0)
        return np.asarray(x.sum(axis=1, keepdims=True))


class MemoryBoundModel(Runnable):
    """A dense layer big enough that a single row's call is dominated by reading the weights.

    ``width`` x ``width`` float32 weights (64 MiB at the default 4096): one row reads all of
    them for one multiply-add each, a batch of 64 reads them once for 64 times the work, so
    batching gives a real, large throughput gain on a CPU. Weights come from ``seed``.
    Input: float32 rows of ``width``; output: float32 rows of 16 scores.
    """

    def __init__(self, width: int = 4096, seed: int = 0) -> None:
        if width < 16:
            raise ValueError(f"width must be an integer >= 16, got {width!r}")
        rng = np.random.default_rng(seed)
        self.width = width
        self.weights = rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)
        self.head = rng.standard_normal((width, 16), dtype=np.float32) / np.sqrt(width)

    @method(
        batchable=True,
        batch_dim=0,
        max_batch_size=64,
        max_latency_ms=20,
        input_spec=TensorSpec("float32", (-1,)),
    )
    def predict(self, x: np.ndarray) -> np.ndarray:
        """Scores for each row: relu(x @ W) @ head."""
        if x.shape[1] != self.width:
            raise ValueError(f"rows must have {self.width} values, got {x.shape[1]}")
        hidden = np.maximum(x @ self.weights, 0.0)
        return np.asarray(hidden @ self.head)

    def example(self, rows: int = 1, seed: int = 1) -> np.ndarray:
        """``rows`` random input rows of the right shape and dtype."""
        return np.random.default_rng(seed).standard_normal((rows, self.width), dtype=np.float32)
