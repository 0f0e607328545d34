"""Profiling a real model: the cost of one call against the batch size, and its linear fit."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from labserve.runtime.runner import RunnerMethod
from labserve.sim.simulate import LinearCost

__all__ = ["CostCurve", "profile"]


@dataclass(frozen=True)
class CostCurve:
    """Measured batch cost against batch size, and the linear cost fitted to it.

    Callable as ``curve(items) -> seconds`` (linear interpolation between measured sizes,
    the fit beyond them), so :func:`labserve.simulate` takes it as its ``cost``.
    """

    sizes: tuple[int, ...]
    median_s: tuple[float, ...]
    """Median time of one call per size, seconds."""
    spread_s: tuple[float, ...]
    """Half the range between the 25th and 75th percentile of the repeats, seconds."""
    fit: LinearCost

    def __call__(self, items: int) -> float:
        """Seconds for a batch of ``items``."""
        if self.sizes[0] <= items <= self.sizes[-1]:
            return float(np.interp(items, self.sizes, self.median_s))
        return self.fit.seconds(items)

    def per_item_ms(self) -> list[float]:
        """Cost per item at each size, ms: how much cheaper a row gets in a batch."""
        return [m * 1000.0 / n for n, m in zip(self.sizes, self.median_s, strict=True)]

    def table(self) -> str:
        """The curve as a small text table."""
        lines = [f"{'batch':>6} {'ms/call':>9} {'± ms':>7} {'ms/item':>8} {'items/s':>10}"]
        for n, m, s in zip(self.sizes, self.median_s, self.spread_s, strict=True):
            lines.append(
                f"{n:>6} {m * 1e3:>9.3f} {s * 1e3:>7.3f} {m * 1e3 / n:>8.4f} {n / m:>10,.0f}"
            )
        lines.append(f"fit: {self.fit.a_ms:.3f} ms + {self.fit.b_ms:.4f} ms x items")
        return "\n".join(lines)


def profile(
    target: RunnerMethod | Callable[..., Any],
    *,
    example: np.ndarray,
    sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    repeats: int = 5,
    warmup: int = 1,
    batch_dim: int = 0,
    timer: Callable[[], float] = time.perf_counter,
) -> CostCurve:
    """Time one model call per batch size (the rows of ``example`` repeated to that size).

    ``target`` is a runner method (``runner.predict``: its model function is called
    directly, not through the queue) or any callable taking a batch. Returns the medians,
    their spread and a least-squares ``a_ms + b_ms * items`` fit. ``timer`` reads the
    time (seconds); tests hand in a virtual one.

    >>> import labserve
    >>> from labserve.lab.demo import SleepModel
    >>> runner = labserve.Runner(SleepModel(a_ms=1.0, b_ms=0.0))
    >>> curve = labserve.profile(runner.predict, example=np.ones((1, 4)), sizes=[1, 8], repeats=2)
    >>> round(curve.fit.a_ms)
    1
    """
    fn: Callable[..., Any] = target.model_fn if isinstance(target, RunnerMethod) else target
    if isinstance(target, RunnerMethod) and isinstance(target.spec.batch_dim, int):
        batch_dim = target.spec.batch_dim
    if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"sizes must be integers >= 1, got {list(sizes)!r}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    one = np.take(example, [0], axis=batch_dim)
    ordered = sorted(set(sizes))
    medians, spreads = [], []
    for n in ordered:
        batch = np.repeat(one, n, axis=batch_dim)
        for _ in range(warmup):
            fn(batch)
        times = []
        for _ in range(repeats):
            t0 = timer()
            fn(batch)
            times.append(timer() - t0)
        medians.append(statistics.median(times))
        q1, q3 = np.percentile(times, [25, 75])
        spreads.append(float(q3 - q1) / 2.0)
    x = np.asarray(ordered, dtype=float)
    y = np.asarray(medians)
    if len(x) > 1:
        b, a = np.polyfit(x, y, 1)
    else:
        a, b = float(y[0]), 0.0
    fit = LinearCost(max(float(a), 0.0) * 1000.0, max(float(b), 0.0) * 1000.0)
    return CostCurve(tuple(ordered), tuple(medians), tuple(spreads), fit)
