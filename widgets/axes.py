"""Axes the kernel moves in steps, so that the page's charts do not re-layout on every tick.

With Bokeh's ``DataRange1d`` each streamed row moves every axis: the page recomputes the
ranges from all the data, re-measures every tick label (CSS reads that force a style pass in
JupyterLab's large page), lays the plots out again and sends each new range back to the
kernel. Here the ranges are plain ``Range1d`` that the pump sets: the time axis advances in
steps of a few seconds, and each y axis grows to a round number as soon as data passes its
end, and shrinks (at a time step) only when the window's data fits in well under half of it.
Between those moments a tick redraws the glyphs and nothing else. A log axis also carries
its ticks (:func:`log_ticks`), set with its range. Not thread-safe: one writer (the pump)
calls :meth:`SteppedAxes.update`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from bokeh.models import FixedTicker, LogTickFormatter, Range1d

__all__ = ["SteppedAxes", "YAxis", "log_ticks", "nice_ceil", "nice_floor", "tick_log_axis"]

_NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
"""Round numbers an axis ends on (times a power of ten): fine enough not to squash the data."""
_HEADROOM = 1.1
"""A linear axis ends this far above the data (then rounds up)."""
_CAP_HEADROOM = 1.04
"""A linear axis whose highest value is a cap (max_num_seqs) ends this far above it, not
rounded: the data stays under it, and a cap of 256 put the axis's end at 300."""
_LOG_HEADROOM = 1.2
"""A log axis spans this factor beyond the data at each end (then rounds)."""
_SHRINK = 2.5
"""An axis shrinks only when a round end this many times smaller would hold the window."""
_LOG_DETAIL_DECADES = 2
"""A log axis of up to this many decades is labelled 1, 2, 5 per decade; a wider one at
each decade, with unlabelled ticks at 2..9 (at the dashboard's chart height, 1, 2, 5 over
three decades put ten labels 11-14 px apart: legible, not readable at a glance)."""
_PLAIN_EXPONENT = 5
"""Decade labels from 10^-4 to 10^4 are written as plain numbers (0.001, 100), not 10^k."""

Values = Callable[[Mapping[str, Sequence[float]], int], float | None]


def nice_ceil(x: float) -> float:
    """The smallest round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k) at or above ``x``."""
    k = math.floor(math.log10(x))
    for m in _NICE:
        if m * 10.0**k >= x * (1 - 1e-12):
            return m * 10.0**k
    return 10.0 ** (k + 1)  # pragma: no cover (10 x 10^k is always above)


def nice_floor(x: float) -> float:
    """The largest round number (as :func:`nice_ceil`) at or below ``x`` (> 0)."""
    k = math.floor(math.log10(x))
    for m in reversed(_NICE):
        if m * 10.0**k <= x * (1 + 1e-12):
            return m * 10.0**k
    return 10.0 ** (k - 1)  # pragma: no cover


def log_ticks(start: float, end: float) -> tuple[list[float], list[float]]:
    """The (major, minor) ticks of a log axis from ``start`` to ``end`` (both > 0).

    BokehJS's own log ticker labels a span under two decades as if it were linear (10, 20,
    ... 100, heaped at the top of the axis, their minor ticks a black smear), and whether a
    span of exactly two decades counts as two depends on rounding (0.1-10 does not).
    """
    first = math.floor(math.log10(start) + 1e-9)
    last = math.ceil(math.log10(end) - 1e-9)
    lo, hi = start * (1 - 1e-9), end * (1 + 1e-9)
    detail = last - first <= _LOG_DETAIL_DECADES

    def ticks(mantissas: Sequence[int]) -> list[float]:
        out = (float(f"{m}e{k}") for k in range(first, last + 1) for m in mantissas)
        return [t for t in out if lo <= t <= hi]

    if detail:
        return ticks((1, 2, 5)), []
    return ticks((1,)), ticks(range(2, 10))


def tick_log_axis(fig: Any, ticker: FixedTicker) -> None:
    """Give ``fig``'s log y axis ``ticker`` (which a :class:`YAxis` moves with its range)."""
    fig.yaxis.ticker = ticker
    fig.yaxis.formatter = LogTickFormatter(min_exponent=_PLAIN_EXPONENT)


def _finite(values: Sequence[object]) -> list[float]:
    out = []
    for v in values:
        if isinstance(v, (int, float)) and math.isfinite(v):
            out.append(float(v))
    return out


@dataclass
class YAxis:
    """One chart's y range, from its ``columns`` (summed per row if ``stacked``).

    ``ticker``: a log axis's ticks, set whenever the range changes (:func:`log_ticks`).
    ``caps``: those of ``columns`` that are limits (``max_num_seqs``): while one is the
    highest value, a linear axis ends just above it.
    """

    range: Range1d
    columns: tuple[str, ...]
    log: bool = False
    stacked: bool = False
    ticker: FixedTicker | None = None
    caps: tuple[str, ...] = ()
    _seen: bool = field(default=False, repr=False)

    @classmethod
    def empty(
        cls,
        columns: Sequence[str],
        *,
        log: bool = False,
        stacked: bool = False,
        ticker: FixedTicker | None = None,
        caps: Sequence[str] = (),
    ) -> YAxis:
        """A y axis over ``columns`` showing the empty chart's range (log: 1 to 100)."""
        axis = cls(Range1d(), tuple(columns), log=log, stacked=stacked, ticker=ticker,
                   caps=tuple(caps))  # fmt: skip
        axis.reset()
        return axis

    def extent(self, data: Mapping[str, Sequence[object]], first: int) -> tuple[float, float]:
        """(lowest, highest) finite value of the rows from ``first`` on; (inf, -inf) if none."""
        if self.stacked:
            rows = zip(*(data[c][first:] for c in self.columns), strict=True)
            values = [sum(_finite(row)) for row in rows]
        else:
            values = [v for c in self.columns for v in _finite(data[c][first:])]
        if self.log:
            values = [v for v in values if v > 0]
        if not values:
            return math.inf, -math.inf
        return min(values), max(values)

    def cap(self, data: Mapping[str, Sequence[object]], first: int) -> float | None:
        """The highest cap of the rows from ``first`` on, if no other value is above it."""
        caps = [v for c in self.caps for v in _finite(data[c][first:])]
        if not caps or self.stacked:
            return None
        top = max(caps)
        others = [v for c in self.columns if c not in self.caps for v in _finite(data[c][first:])]
        return top if top > 0 and max(others, default=0.0) <= top else None

    def fit(self, lo: float, hi: float, *, shrink: bool, cap: float | None = None) -> None:
        """Grow the range to hold [lo, hi]; with ``shrink``, also tighten it around them.

        ``cap``: the highest value is that cap (see :meth:`cap`): a linear axis ends just
        above it.
        """
        if hi < lo:  # no data
            return
        r = self.range
        old = _span(r)
        if self.log:
            # Whole decades: a log axis ending at, say, 80 labels 10, 20, ... 80 in a heap.
            want = (10.0 ** math.floor(math.log10(lo / _LOG_HEADROOM)),
                    10.0 ** math.ceil(math.log10(hi * _LOG_HEADROOM)))  # fmt: skip
            start = want[0] if lo < old[0] or (shrink and want[0] > old[0] * _SHRINK) else old[0]
            end = want[1] if hi > old[1] or (shrink and want[1] * _SHRINK < old[1]) else old[1]
        else:
            if cap is not None and cap >= hi > 0:
                want = (0.0, cap * _CAP_HEADROOM)
            else:
                want = (0.0, nice_ceil(hi * _HEADROOM) if hi > 0 else 1.0)
            start = 0.0
            end = want[1] if hi > old[1] or (shrink and want[1] * _SHRINK < old[1]) else old[1]
        new = want if not self._seen else (start, end)
        self._seen = True
        if new != old:
            self._set(*new)

    def reset(self) -> None:
        """Back to the empty chart's range."""
        self._seen = False
        if self.log:
            self._set(1.0, 100.0)
        else:
            self._set(0.0, 1.0)

    def _set(self, start: float, end: float) -> None:
        self.range.update(start=start, end=end)
        if self.ticker is not None:
            major, minor = log_ticks(start, end)
            self.ticker.update(ticks=major, minor_ticks=minor)


class SteppedAxes:
    """A shared time axis showing the last ``follow_s`` seconds, moved every ``step_s``."""

    def __init__(self, follow_s: float, step_s: float | None = None) -> None:
        self.follow_s = follow_s
        self.step_s = step_s if step_s is not None else max(1.0, follow_s / 12.0)
        self.x = Range1d(start=0.0, end=self.step_s)
        self.ys: list[YAxis] = []

    def y(
        self,
        columns: Sequence[str],
        *,
        log: bool = False,
        stacked: bool = False,
        ticker: FixedTicker | None = None,
        caps: Sequence[str] = (),
    ) -> Range1d:
        """A new y range that follows ``columns`` (log: positive values only).

        ``ticker``: gets the ticks that match the range (see :func:`tick_log_axis`).
        ``caps``: the columns that are limits (see :class:`YAxis`).
        """
        axis = YAxis.empty(columns, log=log, stacked=stacked, ticker=ticker, caps=caps)
        self.ys.append(axis)
        return axis.range

    def update(self, data: Mapping[str, Sequence[object]], new_rows: int) -> None:
        """After ``new_rows`` rows were appended to ``data``: move the axes if they must."""
        t = data["t"]
        if not t or new_rows <= 0:
            return
        last = float(t[-1])  # type: ignore[arg-type]
        x_start, x_end = _span(self.x)
        moved = last >= x_end or last < x_start
        if moved:
            end = (math.floor(last / self.step_s) + 1) * self.step_s
            start = max(float(t[0]), end - self.follow_s - self.step_s)  # type: ignore[arg-type]
            self.x.update(start=start, end=end)
        # On a time step, the whole window (it may shrink); otherwise the new rows only.
        first = _first_at_or_after(t, _span(self.x)[0]) if moved else len(t) - new_rows
        for axis in self.ys:
            lo, hi = axis.extent(data, first)
            axis.fit(lo, hi, shrink=moved, cap=axis.cap(data, first))

    def reset(self) -> None:
        """Back to empty charts."""
        self.x.update(start=0.0, end=self.step_s)
        for axis in self.ys:
            axis.reset()


def _span(r: Range1d) -> tuple[float, float]:
    # Bokeh types a range's ends as number, datetime or timedelta; these ranges hold numbers.
    return cast(float, r.start), cast(float, r.end)


def _first_at_or_after(t: Sequence[object], start: float) -> int:
    # The time column holds numbers (Bokeh's data columns are typed as any object).
    return bisect.bisect_left(cast("Sequence[float]", t), start)
