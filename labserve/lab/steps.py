"""Profiling a generative model: the cost of one step against what the step counts.

A step of continuous batching costs more with more sequences, more new tokens (prefill
chunks and decodes) and longer contexts (attention reads every cached token), so its cost
is measured over (sequences, new tokens per sequence, cached context) and fitted, the one
way :mod:`labserve.lab.surface` fits a padded batch, to a
:class:`~labserve.sim.generation.StepCost` whose terms are named by what they count::

    step_ms = fixed_ms + per_seq_ms * sequences + per_batched_token_ms * new tokens
              + per_context_token_ms * context tokens read by attention

The model is called directly (not through a scheduler), with the generative hooks: each
shape's context is prefilled once, each timed step is rolled back (``rollback_step``) so
every repeat sees the same state, and the sequences are freed (``free_sequences``) after.

>>> from labserve.lab.tinylm import TinyLM
>>> prof = profile_steps(TinyLM(), shapes=[(1, 1, 8), (2, 4, 0)], repeats=1)
>>> len(prof.points), prof.fit.fixed_ms >= 0
(2, True)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from labserve.generation.batch import SeqBatch
from labserve.lab._fit import fit_nonnegative
from labserve.sim.generation import StepCost

__all__ = ["DEFAULT_SHAPES", "StepPoint", "StepProfile", "profile_steps"]

DEFAULT_SHAPES: tuple[tuple[int, int, int], ...] = (
    # Decodes (one new token each) at short, middling and long contexts.
    *((n, 1, start) for n in (1, 8, 32) for start in (16, 256, 768)),
    # Prefills from nothing, and a chunk after a cached context.
    (1, 64, 0),
    (1, 256, 0),
    (4, 128, 0),
    (1, 128, 512),
    (16, 32, 128),
)
"""(sequences, new tokens per sequence, tokens cached before the step): what
:func:`profile_steps` measures by default; every shape fits a 1,024-token context."""


@dataclass(frozen=True)
class StepPoint:
    """One measured step shape, and its time (seconds).

    ``num_seqs`` sequences, each computing ``new_tokens`` tokens after ``start`` cached ones.
    """

    num_seqs: int
    new_tokens: int
    start: int
    median_s: float
    spread_s: float
    """Half the range between the 25th and 75th percentile of the repeats."""

    @property
    def num_batched_tokens(self) -> int:
        """New tokens in the step (what ``max_num_batched_tokens`` counts)."""
        return self.num_seqs * self.new_tokens

    @property
    def num_context_tokens(self) -> int:
        """Context tokens read by attention: each new token reads every token up to its own."""
        t = self.new_tokens
        return self.num_seqs * (t * self.start + t * (t + 1) // 2)


@dataclass(frozen=True)
class StepProfile:
    """Measured step costs and the :class:`StepCost` fitted to them.

    ``fit`` is what :func:`~labserve.sim.generation.simulate_generation` takes as its cost.
    """

    points: tuple[StepPoint, ...]
    fit: StepCost

    def predicted_s(self, point: StepPoint) -> float:
        """The fit's time for ``point``'s shape, in seconds."""
        return self.fit.seconds(point.num_seqs, point.num_batched_tokens, point.num_context_tokens)

    def table(self) -> str:
        """The points as a text table (measured and fitted ms per step), with the fit."""
        lines = [
            f"{'seqs':>5} {'new/seq':>7} {'cached':>6} {'tokens':>6} {'context':>8}"
            f" {'ms/step':>8} {'± ms':>6} {'fit ms':>7}"
        ]
        for p in self.points:
            lines.append(
                f"{p.num_seqs:>5} {p.new_tokens:>7} {p.start:>6} {p.num_batched_tokens:>6}"
                f" {p.num_context_tokens:>8} {p.median_s * 1e3:>8.3f} {p.spread_s * 1e3:>6.3f}"
                f" {self.predicted_s(p) * 1e3:>7.3f}"
            )
        f = self.fit
        lines.append(
            f"fit: {f.fixed_ms:.3f} ms + {f.per_seq_ms:.4f} ms x seqs"
            f" + {f.per_batched_token_ms:.5f} ms x new tokens"
            f" + {f.per_context_token_ms:.7f} ms x context tokens"
        )
        return "\n".join(lines)


def profile_steps(
    model: Any,
    *,
    method: str = "generate",
    shapes: Sequence[tuple[int, int, int]] = DEFAULT_SHAPES,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    timer: Callable[[], float] = time.perf_counter,
) -> StepProfile:
    """Time one step of ``model``'s generative method per shape; fit a StepCost to them.

    Profile an instance that is not serving: its step runs here, outside any scheduler
    (the sequences profiled get negative ids, which a runner never gives).

    Args:
        model: a Runnable instance with a generative method taking a
            :class:`~labserve.generation.batch.SeqBatch`, and the hooks
            ``free_sequences(seq_ids)`` and ``rollback_step(batch)``.
        method: the generative method's name.
        shapes: (sequences, new tokens per sequence, cached tokens before the step).
        repeats: timed calls per shape (the median is kept).
        warmup: untimed calls per shape first.
        seed: the random token ids' seed (ids below the model's ``vocab_size``).
        timer: reads the time in seconds; tests hand in a virtual one.

    Raises:
        TypeError: the model lacks the method or a hook.
        ValueError: a shape, ``repeats`` or ``warmup`` out of range, or a shape longer
            than the model's ``max_model_len``.
    """
    step = getattr(model, method, None)
    if not callable(step):
        raise TypeError(f"{type(model).__name__} has no method {method!r} to profile")
    for hook in ("free_sequences", "rollback_step"):
        if not callable(getattr(model, hook, None)):
            raise TypeError(f"{type(model).__name__} has no {hook}() hook: profile_steps needs it")
    if not shapes or any(
        len(s) != 3 or s[0] < 1 or s[1] < 1 or s[2] < 0 or not all(isinstance(v, int) for v in s)
        for s in shapes
    ):
        raise ValueError(
            "shapes must be (sequences >= 1, new tokens >= 1, cached >= 0) integer triples,"
            f" got {list(shapes)!r}"
        )
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    context = int(getattr(model, "max_model_len", 0) or 0)
    if context:
        longest = max(start + new for _, new, start in shapes)
        if longest > context:
            raise ValueError(
                f"a shape needs {longest} tokens of context, over the model's max_model_len"
                f" of {context}: pass shapes= that fit"
            )
    vocab = int(getattr(model, "vocab_size", 256))
    rng = np.random.default_rng(seed)
    points = []
    for n, new, start in shapes:
        ids = tuple(range(-1, -n - 1, -1))  # ids no runner gives a sequence
        tokens = [rng.integers(0, vocab, start + new, dtype=np.int64) for _ in ids]
        try:
            if start:  # the cached context, computed once and kept
                step(SeqBatch(ids, tuple(t[:start] for t in tokens), (0,) * n, (False,) * n))
            batch = SeqBatch(ids, tuple(t[start:] for t in tokens), (start,) * n, (True,) * n)
            times = []
            for i in range(warmup + repeats):
                t0 = timer()
                step(batch)
                elapsed = timer() - t0
                model.rollback_step(batch)  # back to the cached context
                if i >= warmup:
                    times.append(elapsed)
        finally:
            model.free_sequences(ids)
        q1, q3 = np.percentile(times, [25, 75])
        points.append(StepPoint(n, new, start, statistics.median(times), float(q3 - q1) / 2.0))
    x = [[1.0, p.num_seqs, p.num_batched_tokens, p.num_context_tokens] for p in points]
    coef = fit_nonnegative(x, [p.median_s for p in points]) * 1000.0
    fit = StepCost(float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]))
    return StepProfile(tuple(points), fit)
