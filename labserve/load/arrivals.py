"""Seeded arrival processes: when each request of a load run is sent.

Every process is a frozen, validated dataclass whose :meth:`Arrivals.times` returns a sorted
float64 array of send times in seconds from 0, all within ``[0, duration_s)``. The module is
pure: no clock reads, no threads, no asyncio. The random processes draw from
``numpy.random.default_rng(seed)``, so one seed gives the same array on any machine.

The Poisson family (poisson, step, burst, ramp) is built on one idea: draw a unit-rate Poisson
process (exponential gaps, summed in vectorised chunks) and map it through the inverse of the
cumulative rate. That is exact for any rate curve and costs O(n).

>>> a = arrivals("poisson", rate_rps=2000)
>>> str(a)
'poisson 2000 req/s'
>>> t = a.times(1.0, seed=7)
>>> bool((t[1:] >= t[:-1]).all() and t[-1] < 1.0)
True
"""

from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "ARRIVAL_KINDS",
    "Arrivals",
    "BurstArrivals",
    "ConstantArrivals",
    "PoissonArrivals",
    "RampArrivals",
    "StepArrivals",
    "TraceArrivals",
    "arrivals",
]

FloatArray = npt.NDArray[np.float64]


def _number(name: str, value: Any, *, low: float, strict: bool) -> float:
    """Return ``value`` as a float, or raise naming the rule (finite, > or >= ``low``)."""
    rule = f"a finite number {'>' if strict else '>='} {low:g}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < low or (strict and number == low):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return number


def _check_run(duration_s: Any, seed: Any) -> float:
    """Validate the arguments of :meth:`Arrivals.times`; return the duration as a float."""
    duration = _number("duration_s", duration_s, low=0.0, strict=True)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an integer >= 0, got {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return duration


def _unit_poisson(rng: np.random.Generator, horizon: float) -> FloatArray:
    """Event times of a rate-1 Poisson process on ``[0, horizon)``, drawn in vectorised chunks."""
    # The count is Poisson(horizon): a first chunk of mean + 6 sd almost always suffices,
    # and the loop only continues (deterministically for the seed) when it does not.
    chunk = int(horizon + 6.0 * math.sqrt(horizon)) + 16
    parts: list[FloatArray] = []
    last = 0.0
    while last < horizon:
        part = np.cumsum(rng.standard_exponential(chunk))
        part += last
        parts.append(part)
        last = float(part[-1])
    events = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return events[: int(np.searchsorted(events, horizon, side="left"))]


def _evenly(start: float, end: float, rate: float) -> FloatArray:
    """Times ``start + k / rate`` that fall in ``[start, end)``."""
    count = math.ceil((end - start) * rate) + 1
    times = start + np.arange(count, dtype=np.float64) / rate
    return times[times < end]


def _piecewise_poisson(
    rng: np.random.Generator, edges: FloatArray, rates: FloatArray
) -> FloatArray:
    """Poisson arrivals whose rate is ``rates[i]`` on ``[edges[i], edges[i+1])``.

    ``edges`` starts at 0 and ends at the duration; ``rates`` (>= 0) has one fewer entry.
    """
    cumulative = np.concatenate(([0.0], np.cumsum(rates * np.diff(edges))))
    units = _unit_poisson(rng, float(cumulative[-1]))
    # side="right" puts a unit event that lands on a zero-rate segment's flat cumulative
    # into the next segment, so the division below never sees a zero rate.
    segment = np.searchsorted(cumulative, units, side="right") - 1
    times = edges[segment] + (units - cumulative[segment]) / rates[segment]
    # Rounding may push a time a hair past its segment's end; keep order and the bounds.
    return np.minimum(times, np.nextafter(edges[segment + 1], -np.inf))


class Arrivals(abc.ABC):
    """An arrival process: the send times of a load run, as a pure function of duration and seed.

    Implementations are frozen dataclasses; they are immutable and safe to share across threads.
    """

    def times(self, duration_s: float, seed: int = 0) -> FloatArray:
        """Return the arrival times in seconds from 0.

        Args:
            duration_s: Length of the run in seconds, a finite number > 0.
            seed: Seed for ``numpy.random.default_rng``; the same seed gives the same array.

        Returns:
            A new, sorted (non-decreasing) float64 array with every value in ``[0, duration_s)``.

        Raises:
            TypeError: ``duration_s`` is not a number or ``seed`` is not an integer.
            ValueError: ``duration_s`` is not finite and > 0, or ``seed`` is negative.
        """
        duration = _check_run(duration_s, seed)
        out = self._times(duration, np.random.default_rng(int(seed)))
        return np.ascontiguousarray(out, dtype=np.float64)

    @abc.abstractmethod
    def _times(self, duration_s: float, rng: np.random.Generator) -> FloatArray:
        """Return the arrival times for a validated duration, drawing only from ``rng``."""

    @abc.abstractmethod
    def mean_rate(self, duration_s: float) -> float:
        """Return the expected number of arrivals per second over a run of ``duration_s``."""

    @abc.abstractmethod
    def __str__(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class ConstantArrivals(Arrivals):
    """Evenly spaced arrivals, the first at 0: one every ``1 / rate_rps`` seconds (no seed used).

    >>> ConstantArrivals(4).times(1.0)
    array([0.  , 0.25, 0.5 , 0.75])
    """

    rate_rps: float
    """Requests per second, a finite number > 0."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_rps", _number("rate_rps", self.rate_rps, low=0, strict=True))

    def _times(self, duration_s: float, rng: np.random.Generator) -> FloatArray:
        return _evenly(0.0, duration_s, self.rate_rps)

    def mean_rate(self, duration_s: float) -> float:
        """Return ``rate_rps``."""
        return self.rate_rps

    def __str__(self) -> str:
        return f"constant {self.rate_rps:g} req/s"


@dataclasses.dataclass(frozen=True)
class PoissonArrivals(Arrivals):
    """A homogeneous Poisson process: independent, exponentially distributed gaps.

    >>> a = PoissonArrivals(5000)
    >>> bool((a.times(60.0, seed=1) == a.times(60.0, seed=1)).all())
    True
    """

    rate_rps: float
    """Mean requests per second, a finite number > 0."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_rps", _number("rate_rps", self.rate_rps, low=0, strict=True))

    def _times(self, duration_s: float, rng: np.random.Generator) -> FloatArray:
        return _unit_poisson(rng, duration_s * self.rate_rps) / self.rate_rps

    def mean_rate(self, duration_s: float) -> float:
        """Return ``rate_rps``."""
        return self.rate_rps

    def __str__(self) -> str:
        return f"poisson {self.rate_rps:g} req/s"


@dataclasses.dataclass(frozen=True)
class StepArrivals(Arrivals):
    """A rate that changes at given times and holds until the next change (or the run's end).

    >>> a = StepArrivals([(0, 100), (10, 500)])
    >>> str(a), a.mean_rate(20.0)
    ('step 100 req/s from 0 s, 500 req/s from 10 s (poisson)', 300.0)
    """

    rates: Sequence[tuple[float, float]]
    """``(start_s, rate_rps)`` pairs: start times strictly increasing from 0, rates >= 0 (not
    all 0). Stored as a tuple of float pairs."""

    poisson: bool = True
    """True: Poisson arrivals within each step; False: evenly spaced, restarting at each step."""

    def __post_init__(self) -> None:
        if isinstance(self.rates, (str, bytes)) or not isinstance(self.rates, Iterable):
            raise TypeError(
                f"rates must be a sequence of (start_s, rate_rps) pairs, got {self.rates!r}"
            )
        pairs: list[tuple[float, float]] = []
        for i, pair in enumerate(self.rates):
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise TypeError(f"rates[{i}] must be a (start_s, rate_rps) pair, got {pair!r}")
            start = _number(f"rates[{i}] start_s", pair[0], low=0, strict=False)
            rate = _number(f"rates[{i}] rate_rps", pair[1], low=0, strict=False)
            if i == 0 and start != 0:
                raise ValueError(
                    f"rates[0] start_s must be 0 (the first step starts the run), got {pair[0]!r}"
                )
            if pairs and start <= pairs[-1][0]:
                raise ValueError(
                    f"rates[{i}] start_s must be > the previous start_s {pairs[-1][0]:g}, "
                    f"got {pair[0]!r}"
                )
            pairs.append((start, rate))
        if not pairs:
            raise ValueError(
                f"rates must hold at least one (start_s, rate_rps) pair, got {self.rates!r}"
            )
        if not any(rate > 0 for _, rate in pairs):
            raise ValueError(f"rates must include a rate_rps > 0, got {self.rates!r}")
        if not isinstance(self.poisson, bool):
            raise TypeError(f"poisson must be True or False, got {self.poisson!r}")
        object.__setattr__(self, "rates", tuple(pairs))

    def _segments(self, duration_s: float) -> tuple[FloatArray, FloatArray]:
        """Return the step edges (from 0 to ``duration_s``) and the rate of each step."""
        starts = np.array([start for start, _ in self.rates if start < duration_s])
        rates = np.array([rate for _, rate in self.rates[: len(starts)]])
        return np.append(starts, duration_s), rates

    def _times(self, duration_s: float, rng: np.random.Generator) -> FloatArray:
        edges, rates = self._segments(duration_s)
        if self.poisson:
            return _piecewise_poisson(rng, edges, rates)
        parts = [
            _evenly(float(edges[i]), float(edges[i + 1]), float(rate))
            for i, rate in enumerate(rates)
            if rate > 0
        ]
        return np.concatenate(parts) if parts else np.empty(0)

    def mean_rate(self, duration_s: float) -> float:
        """Return the time-weighted mean of the step rates over the first ``duration_s`` seconds."""
        duration = _check_run(duration_s, 0)
        edges, rates = self._segments(duration)
        return float(np.dot(rates, np.diff(edges)) / duration)

    def __str__(self) -> str:
        steps = ", ".join(f"{rate:g} req/s from {start:g} s" for start, rate in self.rates)
        return f"step {steps} ({'poisson' if self.poisson else 'constant'})"


@dataclasses.dataclass(frozen=True)
class BurstArrivals(Arrivals):
    """Poisson arrivals at ``base_rps`` with a burst at ``burst_rps`` closing every period.

    Each period of ``every_s`` seconds runs at the base rate and then, for its last
    ``length_s`` seconds, at the burst rate: bursts cover ``[k * every_s - length_s, k * every_s)``
    for k = 1, 2, ... So the run opens calm, and ``n * every_s`` seconds hold ``n`` bursts.

    >>> str(BurstArrivals(base_rps=100, burst_rps=2000, every_s=5, length_s=0.5))
    'burst 100 req/s, 2000 req/s for 0.5 s every 5 s'
    """

    base_rps: float
    """Mean requests per second between bursts, a finite number >= 0."""

    burst_rps: float
    """Mean requests per second during a burst, a finite number > 0."""

    every_s: float
    """Period of the bursts in seconds, a finite number > 0."""

    length_s: float
    """Length of each burst in seconds, > 0 and < ``every_s``."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "base_rps", _number("base_rps", self.base_rps, low=0, strict=False))
        set_(self, "burst_rps", _number("burst_rps", self.burst_rps, low=0, strict=True))
        set_(self, "every_s", _number("every_s", self.every_s, low=0, strict=True))
        set_(self, "length_s", _number("length_s", self.length_s, low=0, strict=True))
        if self.length_s >= self.every_s:
            raise ValueError(
                f"length_s must be < every_s ({self.every_s:g}), got {self.length_s!r}"
            )

    def _segments(self, duration_s: float) -> tuple[FloatArray, FloatArray]:
        """Return the calm/burst edges (from 0 to ``duration_s``) and the rate of each piece."""
        periods = math.ceil(duration_s / self.every_s)
        ends = np.arange(1, periods + 1, dtype=np.float64) * self.every_s
        edges = np.empty(2 * periods + 1)
        edges[0] = 0.0
        edges[1::2] = ends - self.length_s
        edges[2::2] = ends
        rates = np.tile([self.base_rps, self.burst_rps], periods)
        keep = int(np.searchsorted(edges, duration_s, side="left"))
        return np.append(edges[:keep], duration_s), rates[:keep]

    def _times(self, duration_s: float, rng: np.random.Generator) -> FloatArray:
        return _piecewise_poisson(rng, *self._segments(duration_s))

    def mean_rate(self, duration_s: float) -> float:
        """Return the expected arrivals per second over the first ``duration_s`` seconds."""
        duration = _check_run(duration_s, 0)
        edges, rates = self._segments(duration)
        return float(np.dot(rates, np.diff(edges)) / duration)

    def __str__(self) -> str:
        return (
            f"burst {self.base_rps:g} req/s, {self.burst_rps:g} req/s for {self.length_s:g} s "
            f"every {self.every_s:g} s"
        )


@dataclasses.dataclass(frozen=True)
class RampArrivals(Arrivals):
    """Poisson arrivals whose rate moves linearly from ``start_rps`` at 0 to ``end_rps`` at the end.

    The ramp spans the whole run, so ``times(30)`` is not a prefix of ``times(60)``.

    >>> RampArrivals(100, 1000).mean_rate(60.0)
    550.0
    """

    start_rps: float
    """Rate at time 0 in requests per second, a finite number >= 0."""

    end_rps: float
    """Rate at the end of the run in requests per second, a finite number >= 0 (not both 0)."""

    def __post_init__(self) -> None:
        start = _number("start_rps", self.start_rps, low=0, strict=False)
        end = _number("end_rps", self.end_rps, low=0, strict=False)
        if start == 0 and end == 0:
            raise ValueError(f"end_rps must be > 0 when start_rps is 0, got {self.end_rps!r}")
        object.__setattr__(self, "start_rps", start)
        object.__setattr__(self, "end_rps", end)

    def _times(self, duration_s: float, rng: np.random.Generator) -> FloatArray:
        a, slope = self.start_rps, (self.end_rps - self.start_rps) / duration_s
        units = _unit_poisson(rng, duration_s * (a + self.end_rps) / 2.0)
        # Invert the cumulative rate a*t + slope*t**2/2 = u. This root form stays exact when the
        # slope is 0 and never cancels; the root is real because the rate never goes below 0.
        times = 2.0 * units / (a + np.sqrt(np.maximum(a * a + 2.0 * slope * units, 0.0)))
        return np.minimum(times, np.nextafter(duration_s, -np.inf))

    def mean_rate(self, duration_s: float) -> float:
        """Return the mean of the start and end rates (the ramp spans any duration)."""
        return (self.start_rps + self.end_rps) / 2.0

    def __str__(self) -> str:
        return f"ramp {self.start_rps:g} -> {self.end_rps:g} req/s"


@dataclasses.dataclass(frozen=True, init=False, eq=False)
class TraceArrivals(Arrivals):
    """Replay of recorded send times, shifted so that the first is at 0 (no seed used).

    Equal timestamps (requests sent together) are kept; a decrease is an error.

    >>> TraceArrivals([10.0, 10.5, 12.0]).times(5.0)
    array([0. , 0.5, 2. ])
    """

    timestamps: FloatArray
    """The shifted, read-only float64 send times in seconds, starting at 0."""

    def __init__(self, timestamps: Iterable[float] | npt.NDArray[Any]) -> None:
        object.__setattr__(self, "timestamps", _trace(timestamps))

    def _times(self, duration_s: float, rng: np.random.Generator) -> FloatArray:
        end = int(np.searchsorted(self.timestamps, duration_s, side="left"))
        mine: FloatArray = self.timestamps[:end].copy()  # the caller's; ours stays read-only
        return mine

    def mean_rate(self, duration_s: float) -> float:
        """Return the number of recorded arrivals before ``duration_s``, per second."""
        return len(self.times(duration_s)) / float(duration_s)

    @property
    def span_s(self) -> float:
        """Seconds from the first recorded arrival to the last."""
        return float(self.timestamps[-1])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TraceArrivals):
            return NotImplemented
        return bool(np.array_equal(self.timestamps, other.timestamps))

    def __hash__(self) -> int:
        return hash(self.timestamps.tobytes())

    def __repr__(self) -> str:
        return f"TraceArrivals(<{len(self.timestamps)} timestamps over {self.span_s:g} s>)"

    def __str__(self) -> str:
        return f"trace {len(self.timestamps)} arrivals over {self.span_s:g} s"


def _trace(timestamps: Any) -> FloatArray:
    """Validate recorded timestamps; return them shifted to 0 as a read-only float64 array."""
    rule = "a non-empty, non-decreasing 1-d sequence of finite numbers"
    if isinstance(timestamps, (str, bytes)) or not isinstance(timestamps, Iterable):
        raise TypeError(f"timestamps must be {rule}, got {timestamps!r}")
    raw = np.asarray(timestamps if isinstance(timestamps, np.ndarray) else list(timestamps))
    if raw.dtype.kind not in "iuf" or raw.ndim != 1:
        raise TypeError(f"timestamps must be {rule}, got {_brief(raw)}")
    if raw.size == 0:
        raise ValueError(f"timestamps must be {rule}, got an empty sequence")
    values = raw.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(
            f"timestamps must be {rule}, got {float(values[bad[0]])!r} at index {bad[0]}"
        )
    drops = np.flatnonzero(np.diff(values) < 0)
    if drops.size:
        i = int(drops[0]) + 1
        raise ValueError(
            f"timestamps must be {rule}, got {float(values[i])!r} at index {i} "
            f"after {float(values[i - 1])!r}"
        )
    values -= values[0]
    values.setflags(write=False)
    return values


def _brief(array: npt.NDArray[Any]) -> str:
    """Describe an array for an error message without printing all of it."""
    return f"an array of dtype {array.dtype} and shape {array.shape}"


_KINDS: dict[str, type[Arrivals]] = {
    "constant": ConstantArrivals,
    "poisson": PoissonArrivals,
    "step": StepArrivals,
    "burst": BurstArrivals,
    "ramp": RampArrivals,
    "trace": TraceArrivals,
}
ARRIVAL_KINDS: tuple[str, ...] = tuple(_KINDS)
"""The names :func:`arrivals` accepts."""


def arrivals(kind: str, **params: Any) -> Arrivals:
    """Build an arrival process by name, e.g. from a widget's choice or a CLI flag.

    Args:
        kind: One of :data:`ARRIVAL_KINDS`.
        **params: The fields of that kind's class, by name.

    Returns:
        The validated arrival process.

    Raises:
        TypeError: ``kind`` is not a string, a parameter is unknown or missing, or of a wrong type.
        ValueError: ``kind`` is unknown, or a parameter value breaks its rule.

    >>> arrivals("ramp", start_rps=10, end_rps=100)
    RampArrivals(start_rps=10.0, end_rps=100.0)
    """
    known = ", ".join(ARRIVAL_KINDS)
    if not isinstance(kind, str):
        raise TypeError(f"kind must be one of {known}, got {kind!r}")
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(f"kind must be one of {known}, got {kind!r}")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = [f.name for f in fields]
    unknown = sorted(set(params) - set(names))
    missing = [
        f.name
        for f in fields
        if f.name not in params
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if unknown or missing:
        problem = f"unknown {', '.join(unknown)}" if unknown else f"no {', '.join(missing)}"
        raise TypeError(f"{kind} arrivals take {', '.join(names)}; got {problem}")
    return cls(**params)
