"""Profiling a padded model: the cost of one call against batch size and padded length.

A method with a ragged axis costs more per item the wider its batch is padded, so its cost
is a surface over (items, width), not a curve over items. :func:`profile_tokens` measures
that surface on the real model (called directly, not through the queue, with batches
padded by the method's own codec) and fits the cost with terms named by what they count::

    batch_ms = fixed_ms + per_item_ms * items + per_token_ms * padded_tokens

A :class:`CostSurface` is callable as ``surface(items, tokens) -> seconds``: the simulator
takes it as a padded method's cost (interpolated between measured points, the fit beyond).
:func:`load_surface` reads one saved as JSON; with no path, the profile of all-MiniLM-L6-v2
that ships in the package (a copy of ``benchmarks/tokens/minilm_surface.json``), so a lesson
can simulate that model without torch.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from labserve.lab._fit import fit_nonnegative
from labserve.runtime.runner import RunnerMethod

__all__ = ["MINILM_SURFACE", "CostSurface", "TokenCost", "load_surface", "profile_tokens"]

MINILM_SURFACE = pathlib.Path(__file__).with_name("minilm_surface.json")
"""all-MiniLM-L6-v2's cost surface, measured on one CPU thread (benchmarks/tokens/)."""


@dataclass(frozen=True)
class TokenCost:
    """A padded batch's cost: a fixed part, a part per item, a part per padded token.

    >>> TokenCost(fixed_ms=2.0, per_item_ms=0.1, per_token_ms=0.01).seconds(4, 64)
    0.00304
    """

    fixed_ms: float
    per_item_ms: float = 0.0
    per_token_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fixed_ms", "per_item_ms", "per_token_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    def seconds(self, items: int, tokens: int) -> float:
        """Seconds for a batch of ``items`` holding ``tokens`` padded tokens."""
        return (self.fixed_ms + self.per_item_ms * items + self.per_token_ms * tokens) / 1000.0

    def __call__(self, items: int, tokens: int) -> float:
        """The same as :meth:`seconds`: a TokenCost is a simulator's cost function."""
        return self.seconds(items, tokens)


@dataclass(frozen=True)
class CostSurface:
    """Measured batch cost over (items, padded width), and the TokenCost fitted to it."""

    sizes: tuple[int, ...]
    widths: tuple[int, ...]
    median_s: tuple[tuple[float, ...], ...]
    """Median seconds of one call, ``median_s[i][j]`` for ``sizes[i]`` rows of ``widths[j]``."""
    fit: TokenCost

    def __call__(self, items: int, tokens: int) -> float:
        """Seconds for a batch of ``items`` padded to ``tokens / items`` each."""
        width = tokens / items if items else 0.0
        sizes, widths = self.sizes, self.widths
        if not (sizes[0] <= items <= sizes[-1] and widths[0] <= width <= widths[-1]):
            return self.fit.seconds(items, tokens)
        grid = np.asarray(self.median_s)
        # Bilinear: along widths at each measured size, then along sizes.
        at_width = [float(np.interp(width, widths, row)) for row in grid]
        return float(np.interp(items, sizes, at_width))

    def table(self) -> str:
        """The surface as a text table (ms per call), with the fit."""
        head = f"{'items':>6} " + " ".join(f"{'L=' + str(w):>9}" for w in self.widths)
        lines = [head]
        for n, row in zip(self.sizes, self.median_s, strict=True):
            lines.append(f"{n:>6} " + " ".join(f"{m * 1e3:>9.3f}" for m in row))
        f = self.fit
        lines.append(
            f"fit: {f.fixed_ms:.3f} ms + {f.per_item_ms:.4f} ms x items"
            f" + {f.per_token_ms:.5f} ms x padded tokens"
        )
        return "\n".join(lines)


def load_surface(path: str | pathlib.Path | None = None) -> CostSurface:
    """A :class:`CostSurface` saved as JSON (``sizes``, ``widths``, ``median_s``, ``fit``).

    ``path``: None reads :data:`MINILM_SURFACE`, the shipped profile of all-MiniLM-L6-v2.

    >>> load_surface().fit.per_token_ms > 0
    True
    """
    data = json.loads(pathlib.Path(path or MINILM_SURFACE).read_text(encoding="utf-8"))
    return CostSurface(
        tuple(int(n) for n in data["sizes"]),
        tuple(int(w) for w in data["widths"]),
        tuple(tuple(float(s) for s in row) for row in data["median_s"]),
        TokenCost(**data["fit"]),
    )


def profile_tokens(
    target: RunnerMethod,
    *,
    example: Callable[[int], Any],
    sizes: Sequence[int] = (1, 4, 16, 64),
    widths: Sequence[int] = (8, 32, 128),
    repeats: int = 3,
    warmup: int = 1,
    timer: Callable[[], float] = time.perf_counter,
) -> CostSurface:
    """Time one model call per (batch size, padded width): the cost surface of a padded method.

    ``example(length)`` returns one request of that length (what a caller sends, e.g.
    a tokenized text's ``{"input_ids", "attention_mask"}``); ``sizes`` copies of it are
    stacked by the method's codec and padded to each width exactly as a batch would be.
    ``timer`` reads the time (seconds); tests hand in a virtual one.
    """
    queue = getattr(target, "_queue", None)
    codec = queue.codec if queue is not None else None
    if codec is None or codec.padding is None:
        raise TypeError(f"{target.name} has no ragged axis (pad=): profile it with profile()")
    if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"sizes must be integers >= 1, got {list(sizes)!r}")
    if not widths or any(not isinstance(w, int) or w < 1 for w in widths):
        raise ValueError(f"widths must be integers >= 1, got {list(widths)!r}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    call = codec.bind(target.model_fn)
    grid: list[tuple[float, ...]] = []
    points: list[tuple[int, int, float]] = []
    for n in sorted(set(sizes)):
        row = []
        for w in sorted(set(widths)):
            one = example(w)
            args, _, _ = codec.admit(one if isinstance(one, tuple) else (one,))
            batch = codec.stack_padded([args] * n, w)
            for _ in range(warmup):
                call(*batch)
            times = []
            for _ in range(repeats):
                t0 = timer()
                call(*batch)
                times.append(timer() - t0)
            median = statistics.median(times)
            row.append(median)
            points.append((n, n * w, median))
        grid.append(tuple(row))
    return CostSurface(
        tuple(sorted(set(sizes))), tuple(sorted(set(widths))), tuple(grid), _fit(points)
    )


def _fit(points: list[tuple[int, int, float]]) -> TokenCost:
    """Least squares over the measured points, each term kept >= 0."""
    x = [[1.0, n, t] for n, t, _ in points]
    coef = fit_nonnegative(x, [s for _, _, s in points])
    return TokenCost(coef[0] * 1000.0, coef[1] * 1000.0, coef[2] * 1000.0)
