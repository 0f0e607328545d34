"""A request's time outside the queue and the model: before it (a delay), after it (a hand-off).

A live request reaches its runner's queue some time after its arrival (the load generator's
send lag, the hop to the loop) and is answered some time after its batch's slot is freed
(splitting the output, the hop to the caller's loop, waking it). Neither holds a batch slot,
and they are not alike: a delay changes which batch the request joins (one that fires
meanwhile leaves without it; a request late into a queue that holds it anyway, while a batch
runs, loses nothing), so :func:`delayed` moves its entry into the queue, while
:func:`handed_off` adds to its finish. Each is a number or quantiles as measured (one drawn
per request, seeded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from labserve.metrics.results import RunResult

__all__ = ["delayed", "handed_off", "quantiles_s", "restored"]


def quantiles_s(value_ms: Any, name: str) -> np.ndarray:
    """``value_ms`` checked: one number >= 0 or increasing quantiles; in seconds."""
    values = np.atleast_1d(np.asarray(value_ms, dtype=float)) if _numbers(value_ms) else None
    if (
        values is None
        or values.ndim != 1
        or not len(values)
        or not np.all(np.isfinite(values))
        or np.any(values < 0)
        or np.any(np.diff(values) < 0)
    ):
        raise ValueError(
            f"{name} must be a finite number >= 0, or its quantiles (increasing numbers"
            f" >= 0), got {value_ms!r}"
        )
    return values / 1000.0


def _numbers(value: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    return isinstance(value, (Sequence, np.ndarray)) and all(
        isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
        for v in value
    )


def _draw(quantiles: np.ndarray, n: int, rng: np.random.Generator) -> float | np.ndarray:
    """One value each for ``n`` requests: the constant, or drawn between the quantiles."""
    if len(quantiles) == 1:
        return float(quantiles[0])
    probs = np.linspace(0.0, 1.0, len(quantiles))
    return np.asarray(np.interp(rng.random(n), probs, quantiles))


def delayed(times: np.ndarray, quantiles: np.ndarray, seed: int) -> tuple[np.ndarray, Any]:
    """When each request reaches the queue, in queue order, and that order (None: unchanged).

    Seeded ``[seed, 4]``. A request delayed past the next one's entry goes in after it.
    """
    if not quantiles.any():
        return times, None
    queued = times + _draw(quantiles, len(times), np.random.default_rng([seed, 4]))
    order = np.argsort(queued, kind="stable")
    return queued[order], order


def restored(result: RunResult, times: np.ndarray, order: Any) -> RunResult:
    """``result`` of a run on delayed arrivals, per request again and timed from ``times``."""
    if order is None:
        return result
    per_request = {}
    for name in ("start_s", "finish_s", "outcome", "items"):
        column = getattr(result, name)
        back = np.empty_like(column)
        back[order] = column
        per_request[name] = back
    return dataclasses.replace(result, arrival_s=times, **per_request)


def handed_off(result: RunResult, quantiles: np.ndarray, seed: int) -> RunResult:
    """``result`` with each served request's hand-off added to its finish (seeded ``[seed, 3]``).

    Added after the run: a hand-off changes no batch (the live runner frees a batch's slot
    before its callers are answered).
    """
    if not quantiles.any():
        return result
    served = result.served
    finish = result.finish_s.copy()
    finish[served] += _draw(quantiles, int(served.sum()), np.random.default_rng([seed, 3]))
    return dataclasses.replace(result, finish_s=finish)
