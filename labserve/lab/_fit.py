"""The one least-squares fit of a measured cost: terms named by what they count, each >= 0.

Both cost profiles fit this way (a padded batch's :class:`~labserve.lab.surface.TokenCost`,
a generation step's :class:`~labserve.sim.generation.StepCost`): a negative term would
price some work below nothing, so the most negative term is dropped and the rest refit.
A calibration from a live run (steps or batches) fits robustly (:func:`fit_robust`): on a
shared machine some of its points stalled, and least squares would spread them over the terms.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["Residuals", "fit_nonnegative", "fit_robust"]


def fit_nonnegative(x: npt.ArrayLike, y: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Least squares ``x @ coef ~ y`` with every coefficient >= 0 (dropped terms are 0).

    ``x``: one row per measured point, one column per term; ``y``: what each point cost.

    >>> fit_nonnegative([[1, 1], [1, 2], [1, 3]], [3.0, 5.0, 7.0]).round(6).tolist()
    [1.0, 2.0]
    """
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))  # drop the most negative term and refit
    return coef


def fit_robust(
    x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], cut: float, min_points: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """:func:`fit_nonnegative` refitted without the points far from it, to a fixed point.

    Points further than ``cut`` robust standard deviations (1.4826 x the median absolute
    deviation of the residuals) from the fit are left out and the rest refit, until the set
    kept stops changing (or would fall under ``min_points``). Returns the coefficients and
    which points they were fitted on.

    >>> x = np.column_stack([np.ones(6), np.arange(6.0)])
    >>> coef, kept = fit_robust(x, np.array([1.0, 2, 3, 4, 50, 6]), 3.0, 3)
    >>> coef.round(6).tolist(), kept.tolist()
    ([1.0, 1.0], [True, True, True, True, False, True])
    """
    keep = np.ones(len(y), np.bool_)
    coef = fit_nonnegative(x, y)
    floor = max(1e-6 * float(np.median(y)), 1e-9)  # exact data: no spread to scale by
    for _ in range(10):  # converges in 2-4 rounds on live runs
        r = y - x @ coef
        mid = float(np.median(r[keep]))
        scale = max(1.4826 * float(np.median(np.abs(r[keep] - mid))), floor)
        new = np.abs(r - mid) <= cut * scale
        if (new == keep).all() or int(new.sum()) < min_points:
            break
        keep = new
        coef = fit_nonnegative(x[keep], y[keep])
    return coef, keep


class Residuals:
    """A calibration's residuals: its fit against each point that ran.

    The dataclass that mixes this in holds ``measured_ms``, ``predicted_ms`` and ``typical``
    (which points the typical cost was fitted on).
    """

    measured_ms: npt.NDArray[np.float64]
    predicted_ms: npt.NDArray[np.float64]
    typical: npt.NDArray[np.bool_]

    @property
    def residuals_ms(self) -> npt.NDArray[np.float64]:
        """Measured minus predicted, per point (positive: it took longer than the fit)."""
        return np.asarray(self.measured_ms - self.predicted_ms)

    @property
    def rms_ms(self) -> float:
        """Root mean square of the residuals."""
        r = self.residuals_ms
        return float(np.sqrt(np.mean(r * r))) if r.size else math.nan

    def relative_error(self, q: float = 50.0) -> float:
        """The ``q``-th percentile of |residual| / measured over the typical points, a fraction."""
        ok = self.typical
        if not ok.any():
            return math.nan
        rel = np.abs(self.residuals_ms[ok]) / np.maximum(self.measured_ms[ok], 1e-12)
        return float(np.percentile(rel, q))
