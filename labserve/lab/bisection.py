"""The highest rate that still meets a target, by bisection: one search for both kinds.

A generation search and a request-batching search ask the same question of a different
simulator: at which Poisson rate does a setting stop meeting its targets? Both hand
:func:`highest_rate` a predicate ``meets(rate)``, true at low rates and false past the
setting's edge (monotone, as a queue's latency is in its load), and a starting guess; it
brackets the edge by stepping out from the guess, then halves the bracket (geometrically:
rates span decades) until its ends are within ``tolerance`` of each other. Vidur's search
and ``vllm bench sweep`` bisect alike. Pure; thread-safe.

>>> found = highest_rate(lambda r: r <= 37.0, start=10.0, tolerance=0.02)
>>> round(found.rate, 2), found.miss <= found.rate * 1.02, len(found.tried)
(36.58, True, 10)

:func:`highest_lattice_rate` asks only rates of one fixed lattice (powers of
``1 + tolerance``): for a monotone ``meets`` its answer is the lattice's highest rate that
meets, whatever the start, so two searches of settings that behave alike ask the same
rates at the end, and a cache of what each rate gave serves the second.

>>> found = highest_lattice_rate(lambda r: r <= 37.0, start=36.0, tolerance=0.02)
>>> round(found.rate, 2), round(found.miss / found.rate, 6), len(found.tried)
(36.75, 1.02, 4)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RateBracket", "highest_lattice_rate", "highest_rate"]


@dataclass(frozen=True)
class RateBracket:
    """Where the edge lies: ``rate`` meets the targets, ``miss`` does not (requests/s).

    ``rate`` is 0 when even ``floor`` missed; ``miss`` is ``math.inf`` when ``ceiling``
    met. ``tried`` lists every rate evaluated, in order (what a search cost).
    """

    rate: float
    miss: float
    tried: tuple[float, ...]


def highest_rate(
    meets: Callable[[float], bool],
    *,
    start: float,
    tolerance: float = 0.02,
    floor: float = 1e-3,
    ceiling: float = 1e6,
    step: float = 1.25,
) -> RateBracket:
    """The highest rate at which ``meets`` holds, to within ``tolerance`` (relative).

    Args:
        meets: true when the targets are met at a rate; assumed monotone (true below the
            edge, false above).
        start: the first rate tried: a neighbouring setting's edge saves most of the
            bracketing (adjacent caps move the edge by a few percent).
        tolerance: stop once ``miss <= rate * (1 + tolerance)``.
        floor: the lowest rate tried; missing there gives ``rate`` 0.
        ceiling: the highest rate tried; meeting there gives ``miss`` infinite.
        step: the first bracketing step's factor; each further step squares it, so a far
            guess costs a few evaluations, a near one two.

    Raises:
        ValueError: ``tolerance`` not > 0, ``step`` not > 1, or ``start`` outside
            ``[floor, ceiling]``.
    """
    if not (tolerance > 0 and step > 1):
        raise ValueError(f"tolerance must be > 0 and step > 1, got {tolerance!r}, {step!r}")
    if not (0 < floor <= start <= ceiling):
        raise ValueError(f"start must be within [{floor!r}, {ceiling!r}], got {start!r}")
    tried: list[float] = []

    def check(rate: float) -> bool:
        tried.append(rate)
        return meets(rate)

    lo, hi = _bracket(check, start, floor, ceiling, step)
    while lo > 0 and math.isfinite(hi) and hi > lo * (1 + tolerance):
        mid = math.sqrt(lo * hi)
        if check(mid):
            lo = mid
        else:
            hi = mid
    return RateBracket(rate=lo, miss=hi, tried=tuple(tried))


def _bracket(
    check: Callable[[float], bool], start: float, floor: float, ceiling: float, step: float
) -> tuple[float, float]:
    """A rate that meets and one that misses around the edge (0 / inf past the limits)."""
    rate, factor = start, step
    if check(rate):
        while rate < ceiling:
            up = min(rate * factor, ceiling)
            if not check(up):
                return rate, up
            rate, factor = up, factor * factor
        return rate, math.inf
    while rate > floor:
        down = max(rate / factor, floor)
        if check(down):
            return down, rate
        rate, factor = down, factor * factor
    return 0.0, rate


def highest_lattice_rate(
    meets: Callable[[float], bool],
    *,
    start: float,
    tolerance: float = 0.02,
    floor: float = 1e-3,
    ceiling: float = 1e6,
) -> RateBracket:
    """The highest rate ``(1 + tolerance) ** k`` (k an integer) at which ``meets`` holds.

    For a monotone ``meets`` the answer depends on the edge alone, not on ``start``: the
    rate is the lattice point below the edge and ``miss`` the next one, so ``miss`` is
    ``rate * (1 + tolerance)`` (the same guarantee as :func:`highest_rate`). From ``start``'s
    lattice point it steps 1, 2, 4, ... points out until the edge is bracketed, then
    halves the bracket in points. Limits and the returned bracket as
    :func:`highest_rate`'s (``floor`` and ``ceiling`` rounded onto the lattice, inwards).

    Raises:
        ValueError: ``tolerance`` not > 0, or ``start`` outside ``[floor, ceiling]``.
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance!r}")
    if not (0 < floor <= start <= ceiling):
        raise ValueError(f"start must be within [{floor!r}, {ceiling!r}], got {start!r}")
    q = 1.0 + tolerance
    tried: list[float] = []
    lowest, highest = _on_lattice(floor, q, math.ceil), _on_lattice(ceiling, q, math.floor)

    def check(k: int) -> bool:
        rate = q**k
        tried.append(rate)
        return meets(rate)

    first = min(max(_on_lattice(start, q, math.floor), lowest), highest)
    lo, hi = _lattice_bracket(check, first, lowest, highest)
    while lo is not None and hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if check(mid):
            lo = mid
        else:
            hi = mid
    rate = 0.0 if lo is None else q**lo
    return RateBracket(rate=rate, miss=math.inf if hi is None else q**hi, tried=tuple(tried))


def _on_lattice(rate: float, q: float, rounding: Callable[[float], int]) -> int:
    """The lattice index of ``rate``, rounded by ``rounding``.

    A float's log is not exact: an index whose point lies past ``rate`` by rounding error
    is stepped back.
    """
    k = rounding(math.log(rate) / math.log(q))
    if rounding is math.floor and q**k > rate:
        k -= 1
    if rounding is math.ceil and q**k < rate:
        k += 1
    return k


def _lattice_bracket(
    check: Callable[[int], bool], first: int, lowest: int, highest: int
) -> tuple[int | None, int | None]:
    """Lattice indices that meet and miss around the edge (None past the limits)."""
    k, step = first, 1
    if check(k):
        while k < highest:
            up = min(k + step, highest)
            if not check(up):
                return k, up
            k, step = up, step * 2
        return k, None
    while k > lowest:
        down = max(k - step, lowest)
        if check(down):
            return down, k
        k, step = down, step * 2
    return None, k
