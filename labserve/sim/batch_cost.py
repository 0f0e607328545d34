"""A batch's cost as a live run had it: a typical time by what it counts, and its spread.

:class:`BatchCost` is what :func:`labserve.calibrate` fits to a request-batching run (see
:mod:`labserve.lab.calibrate_requests`) and what :func:`~labserve.sim.simulate.simulate` takes
as ``cost``: the typical batch ``fixed_ms + per_item_ms x items + per_token_ms x padded
tokens``, times a factor drawn for each batch from ``spread`` (the run's quantiles of
measured / typical). A factor, not an added time, as the generation step's spread
(:class:`~labserve.sim.generation.StepCost`): a batch that holds the core longer is likelier
to lose it to another thread or process. Draws are seeded: the same seed, the same run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["BatchCost"]

_DRAWS = 4096  # factors drawn at a time: one numpy call per block, not one per batch


@dataclass(frozen=True)
class BatchCost:
    """A batch's time: ``fixed_ms + per_item_ms * items + per_token_ms * tokens``, spread.

    ``spread``: quantiles of measured / typical batch time, evenly spaced in probability
    (first the minimum, last the maximum); each simulated batch draws one factor between
    them (uniform in probability, linear between quantiles). Empty: every batch takes its
    typical time.

    ``by_items``: (items, factor) points, increasing in items, that bend the linear time to
    a measured shape (linear between points, the nearest point's factor beyond them). A
    model's cost need not be linear in its items: numpy's matrix product on one row is a
    matrix-vector product (15.6 ms for ``MemoryBoundModel`` live at load 3.4), on two rows
    and more a matrix product on every BLAS thread (145 ms for 2-8 rows).

    >>> BatchCost(2.0, 0.1).seconds(10)
    0.003
    >>> timer = BatchCost(2.0, 0.1, spread=(1.0, 1.0, 2.0)).timer(seed=0)
    >>> 0.003 <= timer(10) <= 0.006
    True
    """

    fixed_ms: float
    per_item_ms: float = 0.0
    per_token_ms: float = 0.0
    spread: tuple[float, ...] = ()
    by_items: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("fixed_ms", "per_item_ms", "per_token_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number >= 0 (ms), got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0 (ms), got {value!r}")
        spread = tuple(float(v) for v in self.spread)
        if spread and (
            len(spread) < 2
            or not all(math.isfinite(v) and v > 0 for v in spread)
            or any(b < a for a, b in itertools.pairwise(spread))
        ):
            raise ValueError(
                "spread must be empty or at least 2 increasing factors > 0 (quantiles of"
                f" measured / typical), got {self.spread!r}"
            )
        object.__setattr__(self, "spread", spread)
        points = tuple((float(n), float(f)) for n, f in self.by_items)
        if any(f <= 0 or not math.isfinite(f) for _, f in points) or any(
            b[0] <= a[0] for a, b in itertools.pairwise(points)
        ):
            raise ValueError(
                "by_items must be (items, factor) points with items increasing and factors"
                f" > 0, got {self.by_items!r}"
            )
        object.__setattr__(self, "by_items", points)

    def seconds(self, items: int, tokens: int = 0) -> float:
        """The typical batch's time (no spread), in seconds."""
        linear = (self.fixed_ms + self.per_item_ms * items + self.per_token_ms * tokens) / 1000.0
        return linear * self.factor(items) if self.by_items else linear

    def factor(self, items: int) -> float:
        """What ``by_items`` multiplies the linear time by at ``items`` (1 without points)."""
        if not self.by_items:
            return 1.0
        at, factors = zip(*self.by_items, strict=True)
        return float(np.interp(items, at, factors))

    def __call__(self, items: int, tokens: int = 0) -> float:
        """The same as :meth:`seconds`: the typical time, a cost function with no spread."""
        return self.seconds(items, tokens)

    @property
    def mean_factor(self) -> float:
        """What the spread multiplies the typical time by on average (1 without one)."""
        return float(np.mean(self._grid())) if self.spread else 1.0

    def _grid(self) -> np.ndarray:
        """The spread's quantiles as a step function's mean on a fine grid (for the mean)."""
        q = np.asarray(self.spread)
        return np.asarray(np.interp(np.linspace(0.0, 1.0, 1001), np.linspace(0.0, 1.0, len(q)), q))

    def timer(self, seed: int) -> Callable[..., float]:
        """A cost function ``(items, tokens=0) -> seconds`` drawing each batch's factor.

        Seeded (``[seed, 1]``, as :class:`~labserve.sim.simulate.LinearCost`'s jitter): the
        same seed gives the same sequence of batch times.
        """
        if not self.spread:
            return self.seconds
        rng = np.random.default_rng([seed, 1])
        quantiles = np.asarray(self.spread)
        probs = np.linspace(0.0, 1.0, len(quantiles))
        factors: list[float] = []
        base = self.seconds

        def seconds(items: int, tokens: int = 0) -> float:
            if not factors:
                factors.extend(np.interp(rng.random(_DRAWS), probs, quantiles).tolist())
            return base(items, tokens) * factors.pop()

        return seconds
