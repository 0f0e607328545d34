"""Calibrate the simulator from what ran: a live run's steps give the StepCost it had.

A live step costs its run more than the model call: sampling, detokenising, the hand-off
from the worker to the loop and back, and answering the callers all come before the next
step can start. So each step is measured from its start to the next step's start (only
where the next one followed at once: :attr:`~labserve.generation.results.StepSeries.chained`),
and those spans are fitted, by what each step counts, to a
:class:`~labserve.sim.generation.StepCost`::

    span_ms = fixed_ms + per_seq_ms * sequences + per_batched_token_ms * new tokens
              + per_context_token_ms * context tokens read by attention

On a shared machine some steps stall (the thread lost its core to another process, a
collection): a few spans many times the typical one. Least squares over them would spread
the stalls over the terms (a per-sequence cost of a millisecond, measured at load 20), so the
typical step is fitted robustly (least squares with every term >= 0, the one
:mod:`labserve.lab.steps` uses, refitted without the spans more than ``cut`` robust standard
deviations from it), and each span over it becomes the cost's ``spread``
(:data:`SPREAD_QUANTILES` quantiles of measured / typical, one drawn per simulated step), so
the simulator's steps spread, stall and average as the run's did. A factor, not an added
time: at load 10-12 on 2 cores, one-sequence decodes took 1.4x their typical time on average
and 9-32-sequence ones 4.9x (the longer a step holds the core, the likelier it loses it).
The spread is kept per step size (typical times in bins a factor of 2 apart, merged until
each holds :data:`MIN_SIZE_STEPS`): one spread for all steps, at load 13, gave the 0.7 ms
decodes' p99 of 30x to the 5-20 ms prefill steps too, and the simulated TTFT p99 came out
3-4x the live one. Slow steps come in runs (the machine stays busy for a while), so the
spread has a memory: how long a step's place in its spread (its rank within its size) lasts,
measured by the steps' autocorrelation over up to :data:`MEMORY_LAGS` steps (the integrated
autocorrelation time, matched by a chance of keeping the last step's place). It is reported
(:attr:`Calibration.memory`) and put in the cost only with ``memory=True``: kept at 0.9 and
more, a run's worst stall repeats for tens of steps, and a search on such a cost (live TinyLM,
load 3) put the edge of 32 sequences at 10 req/s where they serve 56.
Given the run's arrival times, the delay from an arrival at an idle method to its step's
start is measured too (``wake_ms``).

>>> import labserve
>>> from labserve.config.generation import GenerationConfig
>>> true = labserve.StepCost(1.0, 0.05, 0.01, 1e-5)
>>> ran = labserve.simulate_generation(GenerationConfig(), true, n_requests=200,
...                                    input_len="uniform:8:64", output_len=32, rate=300)
>>> cal = calibrate(ran.steps)
>>> round(cal.cost.fixed_ms, 3), round(cal.cost.per_batched_token_ms, 4)
(1.0, 0.01)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from labserve.generation.results import GenerationResult, StepSeries
from labserve.generation.sequence import StepRecord
from labserve.generation.stats import GenerationSnapshot
from labserve.lab._fit import Residuals, fit_robust
from labserve.sim.generation import StepCost

__all__ = [
    "MEMORY_LAGS",
    "MIN_SIZE_STEPS",
    "MIN_STEPS",
    "SPREAD_QUANTILES",
    "Calibration",
    "calibrate",
]

F64 = npt.NDArray[np.float64]

MIN_STEPS = 8
"""Fewest chained steps a calibration fits: fewer leave four terms barely determined."""

SPREAD_QUANTILES = 101
"""Quantiles of measured / typical kept as the cost's spread (per step size): every
percentile, so that a p99 drawn from it rests on the run's own tail."""

MEMORY_LAGS = 128
"""Lags the spread's memory is measured over: a request's TPOT averages about that many
steps at 128 output tokens, and it is their runs of slow steps that make its tail."""

MIN_SIZE_STEPS = 50
"""Fewest steps a step size's spread is taken from: with fewer, its p99 is one step's luck."""


@dataclass(frozen=True)
class Calibration(Residuals):
    """A StepCost fitted to a run's measured step spans, and how well it fits them.

    ``cost`` is what :func:`~labserve.sim.generation.replay_generation` and
    :func:`~labserve.sim.generation.simulate_generation` take. The arrays hold one entry
    per fitted step (times in ms); ``skipped`` steps were not followed at once by another
    (idle time came next), so they have no span to fit.
    """

    cost: StepCost
    measured_ms: F64
    """Each fitted step's start to the next step's start."""
    predicted_ms: F64
    """What ``cost`` gives each fitted step."""
    num_seqs: npt.NDArray[np.int64]
    num_prefill_tokens: npt.NDArray[np.int64]
    typical: npt.NDArray[np.bool_]
    """Which fitted steps the typical cost was fitted on (the rest: stalls and strays)."""
    skipped: int
    memory: float
    """The spread's memory measured on the run (in ``cost`` only with ``memory=True``)."""
    rank: int
    """How many of the four terms the steps could tell apart (4: all; a run whose steps all
    decode one token each cannot separate per-sequence from per-token cost)."""

    def table(self) -> str:
        """Measured against fitted mean step time, by sequences in the step.

        Steps that only decode apart from steps with a prefill (or a chunk of one) in them;
        the typical fit, and it times the spread's mean (what the simulator's steps average).
        """
        lines = [
            f"{'steps':>14} {'count':>6} {'measured ms':>11} {'typical ms':>10} {'error':>7}"
            f" {'rms ms':>7} {'x spread':>8}"
        ]
        prefill = self.num_prefill_tokens > 0
        for kind, mask in (("decode", ~prefill), ("prefill", prefill)):
            for lo, hi in ((1, 1), (2, 8), (9, 32), (33, 1 << 30)):
                sel = mask & (self.num_seqs >= lo) & (self.num_seqs <= hi)
                if not sel.any():
                    continue
                m, p = self.measured_ms[sel], self.predicted_ms[sel]
                drawn = p * self._mean_factor(p)
                seqs = f"{lo}" if lo == hi else (f"{lo}+" if hi > 1 << 20 else f"{lo}-{hi}")
                err = 100.0 * (p.mean() / m.mean() - 1.0)
                rms = float(np.sqrt(np.mean((m - p) ** 2)))
                lines.append(
                    f"{kind + ' ' + seqs:>14} {int(sel.sum()):>6} {m.mean():>11.3f}"
                    f" {p.mean():>10.3f} {err:>+6.1f}% {rms:>7.3f} {drawn.mean():>8.3f}"
                )
        return "\n".join([*lines, _cost_line(self.cost)])

    def _mean_factor(self, typical_ms: F64) -> F64:
        """The spread's mean factor for steps of these typical times (1 without a spread)."""
        if not self.cost.spread:
            return np.ones_like(typical_ms)
        return np.array([np.mean(self.cost.block_of(t / 1000.0)) for t in typical_ms.tolist()])

    def __repr__(self) -> str:
        n = len(self.measured_ms)
        note = "" if self.rank == 4 else f"; only {self.rank} of 4 terms separable"
        c = self.cost
        return (
            f"Calibration({_cost_line(c)}; measured/typical {self._spread_line()};"
            f" memory {self.memory:.2f}{self._memory_note()}; wake {c.wake_ms:.3f} ms;"
            f" from {n:,} steps"
            f" ({self.skipped:,} skipped: idle after), mean"
            f" {self.measured_ms.mean() if n else float('nan'):.3f} ms; residuals rms"
            f" {self.rms_ms:.3f} ms; typical steps' |error| median"
            f" {100 * self.relative_error(50):.1f}%, p90 {100 * self.relative_error(90):.1f}%"
            f"{note})"
        )

    def _memory_note(self) -> str:
        return "" if self.cost.spread_memory == self.memory else " (not in the cost)"

    def _spread_line(self) -> str:
        c = self.cost
        if not c.spread:
            return "none"
        edges = c.spread_edges_ms
        bounds = [0.0, *edges, np.inf]
        parts = []
        for lo, hi in itertools.pairwise(bounds):
            q = c.block_of(lo / 1000.0)
            p50, p90, p99 = (q[round(p / 100 * (len(q) - 1))] for p in (50, 90, 99))
            size = "" if not edges else f"{_size(lo, hi)}: "
            parts.append(f"{size}p50 {p50:.2f}x, p90 {p90:.2f}x, p99 {p99:.2f}x")
        return (
            f"{'; '.join(parts)}; mean {self._mean_factor(self.predicted_ms).mean():.2f}x;"
            f" {100 * (1 - self.typical.mean()):.1f}% of steps off the typical fit"
        )


def _size(lo: float, hi: float) -> str:
    """A step size's range of typical times, as the repr names it."""
    if lo == 0:
        return f"< {hi:g} ms"
    return f">= {lo:g} ms" if hi == np.inf else f"{lo:g}-{hi:g} ms"


def _cost_line(c: StepCost) -> str:
    return (
        f"{c.fixed_ms:.3f} ms + {c.per_seq_ms:.4f} ms x seqs + {c.per_batched_token_ms:.5f} ms"
        f" x new tokens + {c.per_context_token_ms:.7f} ms x context tokens"
    )


def calibrate(
    steps: StepSeries | GenerationSnapshot | GenerationResult | Sequence[StepRecord],
    *,
    arrival_s: Sequence[float] | npt.NDArray[np.float64] | None = None,
    cut: float = 3.0,
    memory: bool = False,
) -> Calibration:
    """Fit a StepCost to a run's steps, each measured from its start to the next one's.

    Args:
        steps: a live run's steps: ``runner.generate.stats()`` (its last steps, up to the
            recorder's 2,000), its ``.steps``, a :class:`GenerationResult`, or step records.
        arrival_s: the run's arrival times on the steps' clock (the runner's), sorted; with
            them the cost's ``wake_ms`` is measured (the median delay from an arrival at an
            idle method to its step's start), without them it is 0.
        cut: spans further than this many robust standard deviations (1.4826 x the median
            absolute deviation) from the typical fit are left out of it; those above it are
            the stalls.
        memory: put the measured memory in the cost (``spread_memory``); without, each
            simulated step draws afresh from its size's spread.

    Raises:
        ValueError: fewer than :data:`MIN_STEPS` steps were followed at once by another
            (a run that idled between single steps has nothing to fit).
        TypeError: ``steps`` is none of the above.

    >>> import labserve
    >>> from labserve.lab.demo import TinyLM
    >>> runner = labserve.Runner(TinyLM)  # doctest: +SKIP
    >>> ...  # ten seconds of traffic  # doctest: +SKIP
    >>> cal = labserve.calibrate(runner.generate.stats())  # doctest: +SKIP
    >>> labserve.simulate_generation(config, cal.cost, ...)  # doctest: +SKIP
    """
    series = _series(steps)
    ok = series.chained
    n = int(ok.sum())
    if n < MIN_STEPS:
        raise ValueError(
            f"calibrate needs at least {MIN_STEPS} steps each followed at once by another,"
            f" got {n} of {len(series)} steps: record a run busy enough that sequences overlap"
        )
    measured = np.asarray(series.span_s[ok] * 1000.0, dtype=np.float64)
    x = np.column_stack(
        [
            np.ones(n),
            series.num_seqs[ok],
            series.num_batched_tokens[ok],
            series.num_context_tokens[ok],
        ]
    ).astype(np.float64)
    coef, typical = fit_robust(x, measured, cut, MIN_STEPS)
    predicted = np.asarray(x @ coef, dtype=np.float64)
    typical_ms = np.maximum(predicted, 1e-9)
    ratio = measured / typical_ms
    edges, spread = _spread_by_size(ratio, typical_ms)
    persistence = _memory(ratio, typical_ms, edges)
    cost = StepCost(
        fixed_ms=float(coef[0]),
        per_seq_ms=float(coef[1]),
        per_batched_token_ms=float(coef[2]),
        per_context_token_ms=float(coef[3]),
        wake_ms=_wake_ms(series, arrival_s) if arrival_s is not None else 0.0,
        spread=spread,
        spread_edges_ms=edges,
        spread_memory=persistence if memory else 0.0,
    )
    return Calibration(
        cost=cost,
        measured_ms=measured,
        predicted_ms=predicted,
        num_seqs=series.num_seqs[ok],
        num_prefill_tokens=series.num_prefill_tokens[ok],
        typical=typical,
        memory=persistence,
        skipped=len(series) - n,
        rank=int(np.linalg.matrix_rank(x)),
    )


def _spread_by_size(ratio: F64, typical: F64) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Edges between step sizes (typical ms) and each size's quantiles of ``ratio``.

    ``ratio``: each step's measured / typical time. Sizes are typical times in bins a
    factor of 2 apart (at powers of 2 ms), merged upwards until each holds
    :data:`MIN_SIZE_STEPS` steps; a short last one joins the one below.
    """
    lo, hi = np.floor(np.log2(typical.min())), np.ceil(np.log2(typical.max()))
    edges: list[float] = []
    for k in np.arange(lo + 1, hi + 1):
        edge = float(2.0**k)
        closed = int((typical < edges[-1]).sum()) if edges else 0
        if int((typical < edge).sum()) - closed >= MIN_SIZE_STEPS:
            edges.append(edge)
    while edges and int((typical >= edges[-1]).sum()) < MIN_SIZE_STEPS:
        edges.pop()  # too few above the last edge: they join the size below
    probs = np.linspace(0, 100, SPREAD_QUANTILES)
    spread: list[float] = []
    for sel in _sizes(typical, edges):
        spread += [float(v) for v in np.percentile(ratio[sel], probs)]
    return tuple(edges), tuple(spread)


def _sizes(typical: F64, edges: Sequence[float]) -> list[npt.NDArray[np.bool_]]:
    """Which steps are of each size, smallest first (``edges`` between them, in ms)."""
    bounds = [-np.inf, *edges, np.inf]
    return [(typical >= a) & (typical < b) for a, b in itertools.pairwise(bounds)]


def _memory(ratio: F64, typical: F64, edges: tuple[float, ...]) -> float:
    """The chance of keeping the last step's place that gives the steps' persistence.

    Each step's place is its rank (ties averaged) among the steps of its size; with
    autocorrelation r_k at lag k, the integrated time tau = 1 + 2 sum r_k (up to the first
    r_k <= 0, at most :data:`MEMORY_LAGS`), and keeping a place with chance m gives
    tau = (1 + m) / (1 - m).
    """
    # Rounded: spans are differences of clock readings, and steps at the same ratio would
    # otherwise rank by their rounding error, which neighbours share (0.47 on a memoryless run).
    ratio = np.round(ratio, 6)
    place = np.empty_like(ratio)
    for sel in _sizes(typical, edges):
        x = np.sort(ratio[sel])
        lo = np.searchsorted(x, ratio[sel], "left")
        hi = np.searchsorted(x, ratio[sel], "right") - 1
        place[sel] = (lo + hi) / 2.0 / max(len(x) - 1, 1)
    u = place - place.mean()
    var = float(np.mean(u * u))
    if len(u) < 4 * MIN_STEPS or var <= 0:
        return 0.0
    tau = 1.0
    for k in range(1, min(MEMORY_LAGS, len(u) // 4) + 1):
        r = float(np.mean(u[:-k] * u[k:])) / var
        if r <= 0:
            break
        tau += 2.0 * r
    return min((tau - 1.0) / (tau + 1.0), 0.99)


def _wake_ms(series: StepSeries, arrival_s: Sequence[float] | npt.NDArray[np.float64]) -> float:
    """Median delay from the first arrival after an idle method's last step to the next start."""
    arrivals = np.sort(np.asarray(arrival_s, dtype=np.float64))
    restarts = np.flatnonzero(~series.chained[:-1]) + 1  # the step after idle time
    wakes = []
    for i in restarts:
        k = int(np.searchsorted(arrivals, series.end_s[i - 1], side="right"))
        if k < len(arrivals) and arrivals[k] <= series.start_s[i]:
            wakes.append(series.start_s[i] - arrivals[k])
    return float(np.median(wakes) * 1000.0) if wakes else 0.0


def _series(
    steps: StepSeries | GenerationSnapshot | GenerationResult | Sequence[StepRecord],
) -> StepSeries:
    if isinstance(steps, StepSeries):
        return steps
    if isinstance(steps, (GenerationSnapshot, GenerationResult)):
        return steps.steps
    if isinstance(steps, Sequence) and all(isinstance(r, StepRecord) for r in steps):
        return StepSeries.from_records(steps)
    raise TypeError(
        "calibrate takes a StepSeries, a GenerationSnapshot (runner.generate.stats()), a"
        f" GenerationResult or a sequence of StepRecord, got {type(steps).__name__}"
    )
