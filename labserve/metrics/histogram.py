"""A log-bucketed histogram: O(1) to record, percentiles within 0.5% relative error.

For the all-time percentiles, where keeping every sample would grow without bound.
(A few lines of our own rather than a dependency: it sits on the hot path, and the
pure-Python HDR/DDSketch ports cost microseconds per value.)
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["LogHistogram"]


class LogHistogram:
    """Counts positive values in buckets growing by 1% from ``low`` to ``high``.

    Values below ``low`` land in the first bucket, above ``high`` in the last. Not
    thread-safe: one writer; :meth:`copy` gives a reader its own.
    """

    GROWTH = 1.01

    def __init__(self, low: float = 1e-6, high: float = 1e4) -> None:
        self.low = low
        self._inv_log_growth = 1.0 / math.log(self.GROWTH)
        self._n = int(math.log(high / low) * self._inv_log_growth) + 2
        self.counts = np.zeros(self._n, dtype=np.int64)
        self.total = 0

    def _index(self, value: float) -> int:
        if value <= self.low:
            return 0
        return min(int(math.log(value / self.low) * self._inv_log_growth) + 1, self._n - 1)

    def add(self, value: float) -> None:
        """Record one value."""
        self.counts[self._index(value)] += 1
        self.total += 1

    def add_many(self, values: np.ndarray) -> None:
        """Record an array of values (one numpy pass)."""
        if len(values) == 0:
            return
        clipped = np.maximum(values, self.low)
        idx = (np.log(clipped / self.low) * self._inv_log_growth).astype(np.int64) + 1
        idx[values <= self.low] = 0
        np.minimum(idx, self._n - 1, out=idx)
        np.add.at(self.counts, idx, 1)
        self.total += len(values)

    def upper_bounds(self) -> np.ndarray:
        """Each bucket's upper edge (the value a bucket's counts are at most)."""
        return self.low * self.GROWTH ** np.arange(self._n)

    def percentiles(self, qs: tuple[float, ...]) -> tuple[float, ...]:
        """The ``qs`` percentiles (0-100), NaN when empty; each a bucket's geometric middle."""
        if self.total == 0:
            return tuple(math.nan for _ in qs)
        cum = np.cumsum(self.counts)
        out = []
        for q in qs:
            # Rounded first: 99.9 / 100 * 10000 is 9990.000000000002 in floats, one rank too far.
            rank = max(1, math.ceil(round(q * self.total / 100.0, 9)))
            i = int(np.searchsorted(cum, rank))
            out.append(self.low * self.GROWTH ** (i - 0.5) if i > 0 else self.low)
        return tuple(out)

    def cumulative(self, bounds: tuple[float, ...]) -> tuple[int, ...]:
        """How many values are <= each bound (to within a bucket's 1%), for Prometheus."""
        cum = np.cumsum(self.counts)
        upper = self.upper_bounds()
        out = []
        for bound in bounds:
            i = int(np.searchsorted(upper, bound, side="right")) - 1
            out.append(int(cum[i]) if i >= 0 else 0)
        return tuple(out)

    def copy(self) -> LogHistogram:
        """An independent copy (for a snapshot)."""
        other = LogHistogram.__new__(LogHistogram)
        other.low = self.low
        other._inv_log_growth = self._inv_log_growth
        other._n = self._n
        other.counts = self.counts.copy()
        other.total = self.total
        return other
