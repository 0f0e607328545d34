"""Length distributions: how many tokens a prompt has, or an output will have.

The shared vocabulary for lengths (of prompts, outputs, ragged inputs): the simulator draws
from them, the load generator sends them, and the command line parses the same strings for
``--input-len`` and ``--output-len``. Every distribution is a frozen dataclass with
``sample(rng, n)`` (``n`` lengths, int64, each >= 1) and ``mean()``; randomness comes only
from the generator passed in, so a seed fixes every draw.

>>> import numpy as np
>>> parse_length("uniform:1:512")
UniformLength(low=1, high=512)
>>> parse_length("64").sample(np.random.default_rng(0), 3).tolist()
[64, 64, 64]
"""

from __future__ import annotations

import math
import numbers
import pathlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "EmpiricalLengths",
    "FixedLength",
    "LengthDist",
    "LognormalLength",
    "TraceLengths",
    "UniformLength",
    "parse_length",
]

Lengths = npt.NDArray[np.int64]

# The standard normal's 99th percentile: a lognormal's p99 is median * exp(Z99 * sigma).
_Z99 = 2.3263478740408408
# A lognormal's mass above exp(mu + 9 sigma) is below 1e-19: past it the mean's sum stops.
_TAIL_SIGMAS = 9.0
# The mean's sum has one term per integer length; past this many it would take too long
# (a median near a million tokens), and such a distribution needs max_len to have a mean.
_MAX_MEAN_TERMS = 10_000_000


def _length(name: str, value: object) -> int:
    """``value`` as an int >= 1, or a ValueError/TypeError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_draw(rng: object, n: object) -> int:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    return int(n)


def _lengths(name: str, values: Iterable[object]) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of integers >= 1, got {values!r}")
    out = tuple(_length(f"{name}[{i}]", v) for i, v in enumerate(values))
    if not out:
        raise ValueError(f"{name} must hold at least one length, got none")
    return out


@dataclass(frozen=True)
class FixedLength:
    """Every draw is ``n``."""

    n: int

    def __post_init__(self) -> None:
        _length("n", self.n)

    def sample(self, rng: np.random.Generator, n: int) -> Lengths:
        """Return ``n`` copies of the length (``rng`` is checked but not used)."""
        return np.full(_check_draw(rng, n), self.n, dtype=np.int64)

    def mean(self) -> float:
        """The length itself."""
        return float(self.n)


@dataclass(frozen=True)
class UniformLength:
    """Uniform on the integers ``low..high``, both inclusive."""

    low: int
    high: int

    def __post_init__(self) -> None:
        _length("low", self.low)
        _length("high", self.high)
        if self.high < self.low:
            raise ValueError(f"high must be >= low, got low={self.low}, high={self.high}")

    def sample(self, rng: np.random.Generator, n: int) -> Lengths:
        """Draw ``n`` lengths, each of ``low..high`` equally likely."""
        count = _check_draw(rng, n)
        return rng.integers(self.low, self.high + 1, size=count, dtype=np.int64)

    def mean(self) -> float:
        """``(low + high) / 2``."""
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class LognormalLength:
    """A lognormal length, rounded to the nearest integer and clamped to ``[1, max_len]``.

    Give the spread as the 99th percentile (``p99``, the form a trace summary reports) or as
    ``sigma`` (the log's standard deviation), not both. ``max_len=None`` clamps only below.
    The percentiles are those of the distribution before rounding and clamping.

    >>> round(LognormalLength(16, p99=128).sigma_log, 4)
    0.8939
    """

    median: float
    p99: float | None = None
    sigma: float | None = None
    max_len: int | None = None

    def __post_init__(self) -> None:
        if not _positive(self.median):
            raise ValueError(f"median must be a number > 0, got {self.median!r}")
        if (self.p99 is None) == (self.sigma is None):
            raise ValueError(
                "LognormalLength needs exactly one of p99 or sigma, "
                f"got p99={self.p99!r}, sigma={self.sigma!r}"
            )
        if self.p99 is not None and not (_positive(self.p99) and self.p99 > self.median):
            raise ValueError(f"p99 must be a number > median ({self.median}), got {self.p99!r}")
        if self.sigma is not None and not _positive(self.sigma):
            raise ValueError(f"sigma must be a number > 0, got {self.sigma!r}")
        if self.max_len is not None:
            _length("max_len", self.max_len)

    @property
    def sigma_log(self) -> float:
        """The standard deviation of the length's logarithm (from ``p99`` if given)."""
        if self.sigma is not None:
            return float(self.sigma)
        assert self.p99 is not None  # __post_init__ requires one of them
        return math.log(self.p99 / self.median) / _Z99

    def sample(self, rng: np.random.Generator, n: int) -> Lengths:
        """Draw ``n`` lengths."""
        count = _check_draw(rng, n)
        raw = rng.lognormal(math.log(self.median), self.sigma_log, size=count)
        upper = np.inf if self.max_len is None else self.max_len
        return np.clip(np.rint(raw), 1, upper).astype(np.int64)

    def mean(self) -> float:
        """The exact mean of the rounded, clamped length.

        For an integer length ``Y >= 1``, ``E[Y] = 1 + sum over k >= 1 of P(Y > k)``, and
        ``Y > k`` exactly when the unrounded draw exceeds ``k + 0.5`` (and ``k < max_len``).
        Raises ValueError when the sum would be too long (set ``max_len``).
        """
        mu, s = math.log(self.median), self.sigma_log
        tail = math.ceil(math.exp(mu + _TAIL_SIGMAS * s))
        top = tail if self.max_len is None else min(self.max_len, tail)
        if top > _MAX_MEAN_TERMS:
            raise ValueError(
                f"the mean of {self!r} would need {top:,} terms; give max_len "
                f"(at most {_MAX_MEAN_TERMS:,})"
            )
        k = np.arange(1, top, dtype=np.float64)
        z = (np.log(k + 0.5) - mu) / (s * math.sqrt(2.0))
        above = 0.5 * _erfc(z)
        return 1.0 + float(above.sum())


def _positive(x: object) -> bool:
    return (
        isinstance(x, numbers.Real)
        and not isinstance(x, bool)
        and math.isfinite(float(x))
        and float(x) > 0
    )


_erfc_u = np.frompyfunc(math.erfc, 1, 1)


def _erfc(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``math.erfc`` over an array (numpy has no erfc of its own, and scipy is not a dep)."""
    return np.asarray(_erfc_u(z), dtype=np.float64)


@dataclass(frozen=True)
class EmpiricalLengths:
    """Draws with replacement from observed lengths, each value equally likely per entry."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", _lengths("values", self.values))

    def sample(self, rng: np.random.Generator, n: int) -> Lengths:
        """Draw ``n`` of the values, uniformly with replacement."""
        count = _check_draw(rng, n)
        return np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), count)]

    def mean(self) -> float:
        """The mean of the values."""
        return sum(self.values) / len(self.values)


@dataclass(frozen=True)
class TraceLengths:
    """Replays recorded lengths in order, from the first, starting again after the last.

    Deterministic: every ``sample`` call replays from the start (``rng`` is not used).
    """

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", _lengths("values", self.values))

    def sample(self, rng: np.random.Generator, n: int) -> Lengths:
        """The first ``n`` values of the trace, repeated as often as needed."""
        count = _check_draw(rng, n)
        return np.resize(np.asarray(self.values, dtype=np.int64), count)

    def mean(self) -> float:
        """The mean over one pass of the trace."""
        return sum(self.values) / len(self.values)


LengthDist = FixedLength | UniformLength | LognormalLength | EmpiricalLengths | TraceLengths
"""Any of the length distributions."""

_KINDS = (FixedLength, UniformLength, LognormalLength, EmpiricalLengths, TraceLengths)

_SYNTAX = (
    "N, fixed:N, uniform:LOW:HIGH, lognormal:MEDIAN:P99[:MAX], "
    "list:A,B,... or trace:A,B,... (or list:@FILE / trace:@FILE, integers separated by "
    "commas or whitespace)"
)


def parse_length(spec: str | int | LengthDist, *, name: str = "length") -> LengthDist:
    """A length distribution from a command-line string, an int, or a distribution.

    The syntax (the same for ``--input-len`` and ``--output-len``):
    ``"64"`` or ``"fixed:64"``, ``"uniform:1:512"`` (inclusive), ``"lognormal:16:128"``
    (median 16, p99 128; a third number clamps above), ``"list:8,16,32"`` (drawn with
    replacement), ``"trace:8,16,32"`` (replayed in order); ``list:@path`` and
    ``trace:@path`` read the integers from a file. ``name`` is the option the spec came
    from, named in errors.

    Raises:
        ValueError: the string is not in the syntax, or a number breaks its rule.
        TypeError: ``spec`` is neither a string, an int, nor a distribution.

    >>> parse_length("lognormal:16:128:2048")
    LognormalLength(median=16.0, p99=128.0, sigma=None, max_len=2048)
    """
    if isinstance(spec, _KINDS):
        return spec
    if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
        return FixedLength(int(spec))
    if not isinstance(spec, str):
        raise TypeError(
            f"{name} must be a length spec string, an int or a length distribution,"
            f" got {type(spec).__name__}"
        )
    try:
        return _parse(spec.strip())
    except (ValueError, TypeError) as e:
        raise ValueError(f"{name} {spec!r} is not a length spec ({e}); expected {_SYNTAX}") from e


def _parse(spec: str) -> LengthDist:
    kind, sep, rest = spec.partition(":")
    if not sep:
        return FixedLength(_int(kind))
    kind = kind.lower()
    if kind in ("list", "trace"):
        values = _read_values(rest)
        return EmpiricalLengths(values) if kind == "list" else TraceLengths(values)
    args = rest.split(":")
    if kind == "fixed" and len(args) == 1:
        return FixedLength(_int(args[0]))
    if kind == "uniform" and len(args) == 2:
        return UniformLength(_int(args[0]), _int(args[1]))
    if kind == "lognormal" and len(args) in (2, 3):
        max_len = _int(args[2]) if len(args) == 3 else None
        return LognormalLength(_float(args[0]), p99=_float(args[1]), max_len=max_len)
    raise ValueError(f"unknown kind {kind!r} or wrong number of fields")


def _read_values(rest: str) -> tuple[int, ...]:
    if rest.startswith("@"):
        try:
            text = pathlib.Path(rest[1:]).read_text()
        except OSError as e:
            raise ValueError(f"cannot read the file {rest[1:]!r}: {e.strerror}") from None
    else:
        text = rest
    fields = text.replace(",", " ").split()
    return tuple(_int(f) for f in fields)


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not an integer") from None


def _float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a number") from None
    return value
