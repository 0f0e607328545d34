"""Calibrate the simulator from a request-batching run: its batches' cost and its hand-off.

What a user has after ten seconds of traffic on a batchable method is the
:class:`~labserve.metrics.results.RunResult` of ``labserve.load_test(runner.predict, ...)``:
every request's intended arrival, its batch's start and its finish, and (in process) the
runner's batches, each timed from its firing to the release of its slot (the model, the hop
to the worker thread and back: what the simulator's cost must hold). A snapshot
(``runner.predict.stats()``) has percentiles and its last 64 batches, not the requests, so
it cannot give the hand-off; the RunResult can, and carries the arrivals to replay.

Two things are measured, each what the simulator takes:

- the batch cost (:class:`~labserve.sim.batch_cost.BatchCost`): the typical batch fitted
  robustly by what it counts (fixed, per item, and per padded token where the method has a
  ragged axis), and the spread over it (quantiles of measured / typical, every batch in):
  on a shared machine a batch now and then loses its core, and those batches make the tail;
- each served request's time outside the queue and the model, in its two parts: before
  the queue, its send lag (the arrival delay: it moves the request's entry into the queue,
  and a request late into a queue that holds it anyway loses nothing), and after, its
  batch's release to its caller's answer (the hand-off: splitting, the hop to the caller's
  loop, waking it). Both are kept as quantiles, one drawn per simulated request.

Quantiles, not a few percentiles: a spread kept as every percentile puts the gap between
p99 and the run's worst batch into 1% of the simulated batches; one slow batch in 1,371
(live sleep model, load 3) then made a simulated latency p99 of 30 ms where live had 8.5-11.5.
So up to :data:`MAX_QUANTILES` are kept, as many as there were samples.

>>> import labserve
>>> arrivals = labserve.arrivals("poisson", rate_rps=2000).times(2.0, seed=1)
>>> ran = labserve.simulate(arrivals, cost=(2.0, 0.1), handoff_ms=0.5)
>>> cal = calibrate_requests(ran)
>>> round(cal.cost.fixed_ms, 3), round(cal.cost.per_item_ms, 4)
(2.0, 0.1)
>>> round(float(np.median(cal.handoff_ms)), 6)
0.5
>>> again = labserve.simulate(arrivals, **cal.simulate_kwargs())
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from labserve.base.vocabulary import SERVED
from labserve.config.batching import BatchingConfig
from labserve.lab._fit import Residuals, fit_robust
from labserve.metrics.results import RunResult
from labserve.sim.batch_cost import BatchCost

__all__ = [
    "MAX_QUANTILES",
    "MIN_BATCHES",
    "MIN_SIZE_BATCHES",
    "RequestCalibration",
    "calibrate_requests",
]

F64 = npt.NDArray[np.float64]

MIN_BATCHES = 8
"""Fewest batches a calibration fits: fewer leave the per-item term barely determined."""

MIN_SIZE_BATCHES = 2
"""Fewest batches of a size (a bin a factor of 2 wide) that give ``by_items`` a point: a
one-row batch can cost a tenth of a two-row one, and a short run holds few of them."""

MAX_QUANTILES = 1001
"""Most quantiles kept of the batch time's spread, the hand-off and the arrival delay (fewer
when there were fewer samples): every 0.1%, so that a simulated p99 rests on the run's tail
and one outlier weighs as little as it did in the run."""

_SIZES = ((1, 1), (2, 8), (9, 32), (33, 1 << 30))  # batch sizes the table groups by


@dataclass(frozen=True)
class RequestCalibration(Residuals):
    """A request-batching run's batch cost and hand-off, and how well the cost fits it.

    ``simulate(arrivals, **cal.simulate_kwargs())`` replays arrivals on them under the
    batching config the run had (``simulate_kwargs(max_batch_size=32)`` under another).
    The arrays hold one entry per batch (times in ms).
    """

    cost: BatchCost
    handoff_ms: tuple[float, ...]
    """Quantiles of each served request's time from its batch's release to its answer."""
    arrival_delay_ms: tuple[float, ...]
    """Quantiles of each served request's send lag (intended arrival to the call)."""
    measured_ms: F64
    """Each batch's time from its firing to its slot's release."""
    predicted_ms: F64
    """The typical time ``cost`` gives each batch (before its spread)."""
    items: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]
    typical: npt.NDArray[np.bool_]
    """Which batches the typical cost was fitted on (the rest: stalls and strays)."""
    requests: int
    """Served requests the hand-off was measured on."""
    config: dict[str, Any] = field(default_factory=dict)
    """The batching config the run had (what :meth:`simulate_kwargs` replays)."""

    def simulate_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """``cost``, ``handoff_ms`` and the run's batching config, for :func:`labserve.simulate`.

        ``overrides`` replace any of them (``max_batch_size=32``: the same model and machine
        under another setting).
        """
        known = set(BatchingConfig.__dataclass_fields__)
        settings = {k: v for k, v in self.config.items() if k in known}
        return {
            "cost": self.cost,
            "handoff_ms": self.handoff_ms,
            "arrival_delay_ms": self.arrival_delay_ms,
            **settings,
            **overrides,
        }

    def table(self) -> str:
        """Measured against typical mean batch time, by items in the batch.

        ``x spread``: the typical time times the spread's mean (what simulated batches average).
        """
        lines = [
            f"{'items':>7} {'batches':>7} {'measured ms':>11} {'typical ms':>10} {'error':>7}"
            f" {'rms ms':>7} {'x spread':>8}"
        ]
        mean = self.cost.mean_factor
        for lo, hi in _SIZES:
            sel = (self.items >= lo) & (self.items <= hi)
            if not sel.any():
                continue
            m, p = self.measured_ms[sel], self.predicted_ms[sel]
            size = f"{lo}" if lo == hi else (f"{lo}+" if hi > 1 << 20 else f"{lo}-{hi}")
            lines.append(
                f"{size:>7} {int(sel.sum()):>7} {m.mean():>11.3f} {p.mean():>10.3f}"
                f" {100.0 * (p.mean() / m.mean() - 1.0):>+6.1f}%"
                f" {float(np.sqrt(np.mean((m - p) ** 2))):>7.3f} {p.mean() * mean:>8.3f}"
            )
        return "\n".join([*lines, _cost_line(self.cost)])

    def __repr__(self) -> str:
        spread = self.cost.spread
        h = self.handoff_ms
        return (
            f"RequestCalibration({_cost_line(self.cost)}; measured/typical"
            f" {_pcts(spread, 'x')}, mean {self.cost.mean_factor:.2f}x"
            f" ({100 * (1 - self.typical.mean()):.1f}% of batches off the typical fit);"
            f" release to answer {_pcts(h, ' ms')}; send lag"
            f" {_pcts(self.arrival_delay_ms, ' ms')}; from {len(self.measured_ms):,} batches"
            f" and {self.requests:,} requests; residuals rms {self.rms_ms:.3f} ms; typical"
            f" batches' |error| median {100 * self.relative_error(50):.1f}%,"
            f" p90 {100 * self.relative_error(90):.1f}%)"
        )


def _pcts(quantiles: tuple[float, ...], unit: str) -> str:
    if not quantiles:
        return "none"
    q = quantiles
    p50, p90, p99 = (q[round(p / 100 * (len(q) - 1))] for p in (50, 90, 99))
    fmt = ".2f" if unit == "x" else ".3f"
    return f"p50 {p50:{fmt}}{unit}, p90 {p90:{fmt}}{unit}, p99 {p99:{fmt}}{unit}"


def _cost_line(c: BatchCost) -> str:
    token = f" + {c.per_token_ms:.6f} ms x tokens" if c.per_token_ms else ""
    line = f"{c.fixed_ms:.3f} ms + {c.per_item_ms:.4f} ms x items{token}"
    if c.by_items:
        bends = ", ".join(f"{f:.2f}x at {n:g}" for n, f in c.by_items)
        line = f"({line}) x by items: {bends}"
    return line


def calibrate_requests(run: RunResult, *, cut: float = 3.0) -> RequestCalibration:
    """Fit a request-batching run's batch cost and measure its hand-off.

    Args:
        run: a live ``labserve.load_test`` on a runner method in process (its RunResult
            carries the runner's batches), or a simulated one.
        cut: batches further than this many robust standard deviations from the typical
            fit are left out of it (they stay in the spread).

    Raises:
        TypeError: ``run`` is not a RunResult.
        ValueError: the run holds fewer than :data:`MIN_BATCHES` batches (over HTTP the
            batches are the server's, not in the RunResult), or none of its served
            requests can be matched to a batch.
    """
    if not isinstance(run, RunResult):
        raise TypeError(
            "calibrate_requests takes the RunResult of labserve.load_test on a runner method"
            f" (in process), got {type(run).__name__}"
        )
    n = len(run.batch_items)
    if n < MIN_BATCHES:
        where = " (a load over HTTP sees none: run load_test on the runner method)" if not n else ""
        raise ValueError(
            f"calibrate needs a run with at least {MIN_BATCHES} batches, got {n}{where}"
        )
    measured = np.asarray(run.batch_duration_s * 1000.0, dtype=np.float64)
    items = np.asarray(run.batch_items, dtype=np.int64)
    tokens = (
        np.asarray(run.batch_tokens, dtype=np.int64)
        if run.batch_tokens is not None and len(run.batch_tokens) == n
        else np.zeros(n, np.int64)
    )
    columns = [np.ones(n), items.astype(np.float64)]
    if tokens.any():
        columns.append(tokens.astype(np.float64))
    x = np.column_stack(columns)
    coef, typical = fit_robust(x, measured, cut, MIN_BATCHES)
    linear = np.asarray(x @ coef, dtype=np.float64)
    by_items = _by_items(items, measured / np.maximum(linear, 1e-9), typical)
    bend = np.array([BatchCost(1.0, by_items=by_items).factor(int(n)) for n in items.tolist()])
    predicted = np.asarray(linear * bend, dtype=np.float64)
    ratio = measured / np.maximum(predicted, 1e-9)
    lag_ms, answer_ms = _handoff_parts(run)
    cost = BatchCost(
        fixed_ms=float(coef[0]),
        per_item_ms=float(coef[1]),
        per_token_ms=float(coef[2]) if len(coef) > 2 else 0.0,
        spread=_quantiles(ratio),
        by_items=by_items,
    )
    return RequestCalibration(
        cost=cost,
        handoff_ms=_quantiles(np.maximum(answer_ms, 0.0)),
        arrival_delay_ms=_quantiles(lag_ms),
        measured_ms=measured,
        predicted_ms=predicted,
        items=items,
        tokens=tokens,
        typical=typical,
        requests=len(answer_ms),
        config=dict(run.config),
    )


def _by_items(
    items: npt.NDArray[np.int64], ratio: F64, typical: npt.NDArray[np.bool_]
) -> tuple[tuple[float, float], ...]:
    """(items, factor) points bending the linear fit to the batches' measured shape.

    Sizes in bins a factor of 2 apart (1, 2, 3-4, 5-8, ...); each bin with at least
    :data:`MIN_SIZE_BATCHES` batches gives a point: its median items and its batches' median
    measured / linear. None unless two bins do, or if every point is within 2% of the line
    (the linear fit already holds: nothing to bend).
    """
    points = []
    upper = 1
    while upper <= max(int(items.max()), 1):
        lower = upper // 2 + 1 if upper > 1 else 1
        sel = (items >= lower) & (items <= upper)
        if int(sel.sum()) >= MIN_SIZE_BATCHES:
            kept = sel & typical if int((sel & typical).sum()) >= MIN_SIZE_BATCHES else sel
            points.append((float(np.median(items[sel])), float(np.median(ratio[kept]))))
        upper *= 2
    if len(points) < 2 or all(abs(f - 1.0) <= 0.02 for _, f in points):
        return ()
    return tuple(points)


def _quantiles(samples: F64) -> tuple[float, ...]:
    """Evenly spaced quantiles (min to max): as many as samples, at most MAX_QUANTILES."""
    k = min(max(len(samples), 2), MAX_QUANTILES)
    return tuple(float(v) for v in np.percentile(samples, np.linspace(0, 100, k)))


def _handoff_parts(run: RunResult) -> tuple[F64, F64]:
    """Per served request matched to its batch: (send lag, release to answer), in ms.

    A request is matched by its batch's start (the same clock reading on both sides); one
    larger than the cap (split across batches) is left out: its answer waits for its last.
    """
    ends = dict(
        zip(
            run.batch_start_s.tolist(),
            (run.batch_start_s + run.batch_duration_s).tolist(),
            strict=True,
        )
    )
    cap = int(run.config.get("max_batch_size", 1 << 30))
    served = np.flatnonzero((run.outcome == SERVED) & (run.items <= cap))
    end = np.array([ends.get(s, math.nan) for s in run.start_s[served].tolist()])
    known = ~np.isnan(end)
    if not known.any():
        raise ValueError(
            "calibrate found no served request whose batch the run holds: a RunResult of"
            " load_test on a runner method in process carries both"
        )
    k = served[known]
    lag = run.send_lag_s[k] if run.send_lag_s is not None else np.zeros(len(k))
    answer = run.finish_s[k] - end[known]
    return np.asarray(lag * 1000.0, dtype=np.float64), np.asarray(answer * 1000.0, dtype=np.float64)
