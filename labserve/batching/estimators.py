"""Live estimates the adaptive strategy decides from: batch cost against items, arrival rate.

Both are plain, sans-IO objects fed by the queue; neither reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["CostFit", "CostModel", "RateEstimator"]

# A batch whose duration is this many robust deviations off the fit is treated as a stall
# (a GC pause, a descheduled thread) and left out of the refit.
_OUTLIER_MADS = 3.0
_sum = np.add.reduce  # what ndarray.sum runs, without its Python wrapper
# Relative floor on the deviation, so a perfectly steady model does not reject its own jitter.
_MIN_SPREAD = 0.05


@dataclass(frozen=True)
class CostFit:
    """The fitted model cost: ``duration_s = a_s + b_s * items + c_s * tokens``.

    ``tokens`` are a padded batch's tokens (items x its width on the ragged axis); for a
    method without one, ``c_s`` is 0. Asked about items alone, the fit prices each item at
    the mean width of the batches it saw (``width``).
    """

    a_s: float
    """Fixed cost of one model call, in seconds (what batching shares out)."""
    b_s: float
    """Cost of each extra item, in seconds."""
    samples: int
    """Batches in the window the fit was made from."""
    c_s: float = 0.0
    """Cost of each padded token, in seconds (0: no ragged axis, or no token cost seen)."""
    width: float = 0.0
    """Mean padded width of the window's batches (tokens per item; 0: no ragged axis)."""
    ready: bool = field(init=False, compare=False)
    """True once enough batches were seen for the fit to steer decisions (4). A field, not
    a property: reject mode asks at every arrival while every slot is busy, and as a
    property it cost a simulation there 11% more Python calls per request (greedy, 5,000
    req/s, on_overload="reject"; benchmarks/sim_calls.py's count, 2026-12-02)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ready", self.samples >= 4)

    def predict_s(self, items: int, tokens: float | None = None) -> float:
        """Predicted duration of a batch of ``items`` (and ``tokens``, if known), seconds."""
        if tokens is None:
            tokens = items * self.width
        return self.a_s + self.b_s * items + self.c_s * tokens

    @property
    def item_s(self) -> float:
        """What one more item costs at the mean width: ``b_s + c_s * width``, seconds."""
        return self.b_s + self.c_s * self.width


class CostModel:
    """A robust online fit of batch duration against items over the last ``window`` batches.

    Refits every ``refit_every`` observations: least squares, then again without the
    batches more than 3 robust deviations (MAD) off the line, so one stalled batch cannot
    drag the fit. With only one batch size seen, the slope is unknown and taken as 0.
    Not thread-safe: fed and read by the queue's owner.
    """

    def __init__(self, window: int = 128, refit_every: int = 8) -> None:
        # Each observation is written twice, at i and i + window, so that the window,
        # oldest first, is always one contiguous slice: no gather on a refit.
        self._window = window
        self._items = np.zeros(2 * window)
        self._durations = np.zeros(2 * window)
        self._tokens = np.zeros(2 * window)
        self._token_batches = 0  # batches with tokens in the window's ring (0: fit items alone)
        self._count = 0
        self._fitted_at = 0
        self._refit_every = refit_every
        self._fit = CostFit(0.0, 0.0, 0)

    @property
    def fit(self) -> CostFit:
        """The current fit, refitted on read once enough batches came in since the last one."""
        new = self._count - self._fitted_at
        if new and (self._count <= 4 or new >= self._refit_every):
            self._fit = self._refit()
            self._fitted_at = self._count
        return self._fit

    def observe(self, items: int, duration_s: float, tokens: int = 0) -> None:
        """Record one finished batch (``tokens``: its padded tokens, if it had a ragged axis)."""
        w = self._window
        i = self._count % w
        self._items[i] = self._items[i + w] = items
        self._durations[i] = self._durations[i + w] = duration_s
        if tokens or self._token_batches:
            leaving = self._count >= w and bool(self._tokens[i] > 0)
            self._token_batches += int(tokens > 0) - int(leaving)
            self._tokens[i] = self._tokens[i + w] = tokens
        self._count += 1

    def observations(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the windowed (items, duration_s) pairs, oldest first."""
        x, y = self._window_views()
        return x.copy(), y.copy()

    def _window_views(self) -> tuple[np.ndarray, np.ndarray]:
        w = self._window
        n = min(self._count, w)
        first = (self._count - n) % w
        return self._items[first : first + n], self._durations[first : first + n]

    def token_observations(self) -> np.ndarray:
        """A copy of the windowed batches' padded tokens, oldest first (0: none)."""
        w = self._window
        n = min(self._count, w)
        first = (self._count - n) % w
        tokens: np.ndarray = self._tokens[first : first + n].copy()
        return tokens

    def _refit(self) -> CostFit:
        if self._token_batches:
            return self._refit_tokens()
        x, y = self._window_views()
        a, b = _line(x, y)
        raw = y - (a + b * x)
        residuals = np.sort(raw)
        median = _median_sorted(residuals)
        y_floor = _MIN_SPREAD * _median(y)
        # The largest |residual - median| is at one end of the sorted residuals. If even
        # that is within the cutoff at the spread's floor, every batch is kept (the usual
        # case), and the median deviation need not be computed.
        widest = max(float(residuals[-1]) - median, median - float(residuals[0]))
        if widest <= _OUTLIER_MADS * y_floor:
            return CostFit(a, b, len(x))
        deviations = np.abs(residuals - median)
        spread = max(1.4826 * _median(deviations), y_floor)
        keep = np.abs(raw - median) <= _OUTLIER_MADS * spread
        if 2 <= np.count_nonzero(keep) < len(x):
            a, b = _line(x[keep], y[keep])
        return CostFit(a, b, len(x))

    def _refit_tokens(self) -> CostFit:
        """The fit with a per-token term (a padded method), stalls left out as for items."""
        x, y = self._window_views()
        t = self.token_observations()
        fit = _plane(x, t, y)
        raw = y - (fit[0] + fit[1] * x + fit[2] * t)
        median = _median(raw)
        spread = max(1.4826 * _median(np.abs(raw - median)), _MIN_SPREAD * _median(y))
        keep = np.abs(raw - median) <= _OUTLIER_MADS * spread
        if 3 <= np.count_nonzero(keep) < len(x):
            fit = _plane(x[keep], t[keep], y[keep])
        width = float(t.sum() / x.sum()) if x.sum() else 0.0
        return CostFit(fit[0], fit[1], len(x), fit[2], width)


def _plane(x: np.ndarray, t: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares ``y = a + b x + c t`` with a, b, c >= 0.

    Tokens are items x width, so with one width seen they carry nothing items do not: the
    items-only line is taken then, as it is when the plane needs a negative term (of the
    two lines, on items and on tokens, the one that fits better).
    """
    if len(x) >= 3:
        design = np.column_stack([np.ones_like(x), x, t])
        if np.linalg.matrix_rank(design) == 3:
            coef = np.linalg.lstsq(design, y, rcond=None)[0]
            if (coef >= 0).all():
                return float(coef[0]), float(coef[1]), float(coef[2])
    a, b = _line(x, y)
    ta, c = _line(t, y)
    if np.sum((y - ta - c * t) ** 2) < np.sum((y - a - b * x) ** 2):
        return ta, 0.0, c
    return a, b, 0.0


def _median(v: np.ndarray) -> float:
    """``np.median`` of a 1-d float array, to the last bit, without its overhead.

    A refit runs every few batches, and numpy's generic median cost more than the rest.
    """
    return _median_sorted(np.sort(v))


def _median_sorted(s: np.ndarray) -> float:
    """The median of an already sorted 1-d float array, as ``np.median`` gives it."""
    m = len(s) // 2
    if len(s) % 2:
        return float(s[m])
    return (float(s[m - 1]) + float(s[m])) / 2


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with a, b >= 0; falls back to the median at one x.

    ``x`` holds whole numbers (items), so its sum is exact: its mean is exactly the one
    value when all are equal, and ``dx @ dx`` is 0 exactly then.
    """
    n = len(x)
    if n == 0:
        return 0.0, 0.0
    # sum / n is what ndarray.mean computes, without its Python-level overhead.
    x_mean, y_mean = _sum(x) / n, _sum(y) / n
    dx = x - x_mean
    dxx = dx @ dx
    if dxx == 0.0:
        return _median(y), 0.0
    b = float(dx @ (y - y_mean) / dxx)
    a = float(y_mean - b * x_mean)
    if b < 0:
        return _median(y), 0.0
    if a < 0:
        return 0.0, _median(y / x)
    return float(a), float(b)


class RateEstimator:
    """Arrival rate (requests and items per second), exponentially weighted over ``tau_s``.

    O(1) per arrival. Corrects for the short history right after start, so the first
    estimates are not biased low. Arrivals recorded in bulk (:meth:`observe_each`) are
    folded in, in order, when the rate is next read, a single arrival comes, or
    ``fold_every`` of them are waiting (None: only then, for an owner that knows the
    estimate may never be read and holds the arrival times anyway, as a simulation does).
    """

    def __init__(self, tau_s: float = 0.25, fold_every: int | None = 4096) -> None:
        self._tau = tau_s
        self._fold_every = fold_every
        self._requests = 0.0
        self._items = 0.0
        self._last: float | None = None
        self._first: float | None = None
        self._pending: list[tuple[Sequence[float], int]] = []
        self._pending_n = 0

    def observe(self, now: float, items: int, requests: int = 1) -> None:
        """Record ``requests`` arrivals holding ``items`` in all, at ``now``."""
        if self._pending:
            self._fold()
        if self._last is None:
            self._first = now
        else:
            decay = math.exp(-(now - self._last) / self._tau)
            self._requests *= decay
            self._items *= decay
        self._requests += requests
        self._items += items
        self._last = now

    def observe_each(self, times: Sequence[float], items: int) -> None:
        """Record one arrival of ``items`` at each of ``times`` (not decreasing).

        The same as :meth:`observe` once per time, to the last bit. ``times`` is kept
        until the next read, so it must not be changed afterwards.
        """
        if not times:
            return
        self._pending.append((times, items))
        self._pending_n += len(times)
        if self._fold_every is not None and self._pending_n >= self._fold_every:
            self._fold()

    def _fold(self) -> None:
        tau, exp = self._tau, math.exp
        requests, total, last = self._requests, self._items, self._last
        for times, items in self._pending:
            if last is None:
                self._first = last = times[0]
            for t in times:
                decay = exp(-(t - last) / tau)
                requests = requests * decay + 1
                total = total * decay + items
                last = t
        self._requests, self._items, self._last = requests, total, last
        self._pending = []
        self._pending_n = 0

    def rates(self, now: float) -> tuple[float, float]:
        """(requests per second, items per second) as of ``now``."""
        if self._pending:
            self._fold()
        if self._last is None or self._first is None:
            return 0.0, 0.0
        decay = math.exp(-(now - self._last) / self._tau)
        span = now - self._first
        # Weight actually covered by the history so far (1 once it is much longer than tau).
        coverage = 1.0 - math.exp(-span / self._tau) if span > 0 else 0.0
        # Below a fifth of tau of history, stay biased low: holding on a guess costs latency.
        norm = self._tau * max(coverage, 0.2)
        return self._requests * decay / norm, self._items * decay / norm
