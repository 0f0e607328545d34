"""The one least-squares fit of a measured cost: terms named by what they count, each >= 0.

Both cost profiles fit this way (a padded batch's :class:`~labserve.lab.surface.TokenCost`,
a generation step's :class:`~labserve.sim.generation.StepCost`): a negative term would
price some work below nothing, so the most negative term is dropped and the rest refit.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["fit_nonnegative"]


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
