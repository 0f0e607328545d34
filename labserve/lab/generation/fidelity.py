"""How close a simulation came to a live run: p50 and p99 of TTFT, ITL, TPOT and e2e, side by side.

The live side is what the runner measured (``runner.generate.stats()``, a
:class:`~labserve.generation.stats.GenerationSnapshot`) or any
:class:`~labserve.generation.results.GenerationResult`; the simulated side is
:func:`~labserve.sim.generation.replay_generation` of the same arrivals and lengths.

>>> import labserve
>>> from labserve.config.generation import GenerationConfig
>>> kw = dict(n_requests=50, input_len=16, output_len=8, rate=100)
>>> live = labserve.simulate_generation(GenerationConfig(), labserve.StepCost(1.0), **kw)
>>> sim = labserve.simulate_generation(GenerationConfig(), labserve.StepCost(1.05), **kw)
>>> report = compare_generation(live, sim)
>>> round(report.error_pct("tpot", "p50")), report.hit("tpot", "p50")
(5, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labserve.generation.results import GenerationResult
from labserve.generation.stats import GenerationSnapshot

__all__ = ["FIDELITY_METRICS", "FIDELITY_QUANTILES", "GenerationFidelity", "compare_generation"]

FIDELITY_METRICS = ("ttft", "itl", "tpot", "e2e")
FIDELITY_QUANTILES = ("p50", "p99")


@dataclass(frozen=True)
class GenerationFidelity:
    """Live against simulated percentiles (ms), per metric and quantile.

    ``live_ms[metric][quantile]`` and ``sim_ms[metric][quantile]``; ``tolerance_pct`` is what
    :meth:`hit` allows (issue 35's target: 10%).
    """

    live_ms: dict[str, dict[str, float]]
    sim_ms: dict[str, dict[str, float]]
    tolerance_pct: float = 10.0

    def error_pct(self, metric: str, quantile: str) -> float:
        """Simulated over live, minus one, in percent (NaN when live has no figure)."""
        live = self.live_ms[metric][quantile]
        if not live or not math.isfinite(live):
            return math.nan
        return 100.0 * (self.sim_ms[metric][quantile] / live - 1.0)

    def hit(self, metric: str, quantile: str) -> bool:
        """Whether the simulated figure is within ``tolerance_pct`` of live."""
        return abs(self.error_pct(metric, quantile)) <= self.tolerance_pct

    def table(self) -> str:
        """One line per metric and quantile: live, simulated, error, hit or miss."""
        lines = [f"{'':>9} {'live ms':>9} {'sim ms':>9} {'error':>8}"]
        for m in FIDELITY_METRICS:
            for q in FIDELITY_QUANTILES:
                err = self.error_pct(m, q)
                mark = "ok" if self.hit(m, q) else "MISS"
                lines.append(
                    f"{m + ' ' + q:>9} {self.live_ms[m][q]:>9.2f} {self.sim_ms[m][q]:>9.2f}"
                    f" {err:>+7.1f}% {mark}"
                )
        return "\n".join(lines)

    def __repr__(self) -> str:
        hits = sum(self.hit(m, q) for m in FIDELITY_METRICS for q in FIDELITY_QUANTILES)
        total = len(FIDELITY_METRICS) * len(FIDELITY_QUANTILES)
        worst = max(
            ((m, q) for m in FIDELITY_METRICS for q in FIDELITY_QUANTILES),
            key=lambda k: abs(self.error_pct(*k)) if math.isfinite(self.error_pct(*k)) else -1,
        )
        return (
            f"GenerationFidelity({hits} of {total} within {self.tolerance_pct:g}%;"
            f" worst {worst[0]} {worst[1]} {self.error_pct(*worst):+.1f}%)"
        )


def compare_generation(
    live: GenerationSnapshot | GenerationResult,
    simulated: GenerationResult,
    *,
    tolerance_pct: float = 10.0,
) -> GenerationFidelity:
    """Set a simulation's p50 and p99 of TTFT, ITL, TPOT and e2e beside a live run's.

    Args:
        live: the runner's figures (``runner.generate.stats()``: its window must hold the
            run) or a run's result.
        simulated: the replay of the same arrivals and lengths.
        tolerance_pct: what counts as a hit.
    """
    if not (isinstance(tolerance_pct, (int, float)) and tolerance_pct >= 0):
        raise ValueError(f"tolerance_pct must be a number >= 0, got {tolerance_pct!r}")
    return GenerationFidelity(
        live_ms=_percentiles(live),
        sim_ms=_percentiles(simulated),
        tolerance_pct=float(tolerance_pct),
    )


def _percentiles(run: GenerationSnapshot | GenerationResult) -> dict[str, dict[str, float]]:
    if isinstance(run, GenerationSnapshot):
        got = run.percentiles_ms
    elif isinstance(run, GenerationResult):
        got = {m: run.percentiles_ms(m) for m in FIDELITY_METRICS}
    else:
        raise TypeError(
            "compare_generation takes a GenerationSnapshot or a GenerationResult, got"
            f" {type(run).__name__}"
        )
    return {m: {q: float(got[m][q]) for q in FIDELITY_QUANTILES} for m in FIDELITY_METRICS}
