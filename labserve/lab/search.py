"""Which batching caps serve the most requests within a latency target: a search on virtual time.

The request-batching twin of :func:`labserve.search_generation`, on the same bisection
(:func:`~labserve.lab.bisection.highest_rate`): for every setting in a grid
(``max_batch_size``, ``max_latency_ms``, ``strategy``: a dict of lists), the highest Poisson
rate at which at least ``attainment`` of the requests (0.99: the p99) are answered within
``latency_ms``, each point ``duration_s`` simulated seconds of the batching core
(:func:`labserve.simulate`) with the first ``warmup_s`` left out. Seeded.

>>> found = search_batching(20.0, grid={"max_batch_size": [1, 16]}, cost=(2.0, 0.1),
...                         duration_s=5, warmup_s=0.5)
>>> found.best["max_batch_size"], found.best["max_rate"] > 2 * found.rows[0]["max_rate"]
(16, True)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labserve.config.batching import BatchingConfig
from labserve.lab.bisection import highest_rate
from labserve.lab.export import export_config
from labserve.lab.sweep import format_table
from labserve.metrics.results import RunResult
from labserve.runtime.runner import Runner
from labserve.sim.simulate import simulate

__all__ = ["BATCHING_KNOBS", "BatchingSearch", "search_batching"]

BATCHING_KNOBS: tuple[str, ...] = ("strategy", "max_batch_size", "max_latency_ms")
"""The settings a request-batching grid may vary."""

_COLUMNS = (*BATCHING_KNOBS, "max_rate", "attainment", "latency_p50_ms", "latency_p99_ms")


@dataclass(frozen=True)
class BatchingSearch:
    """One row per setting (grid order) with its highest rate; the best; apply and export."""

    rows: list[dict[str, Any]]
    latency_ms: float
    attainment: float
    base: BatchingConfig

    @property
    def best(self) -> dict[str, Any]:
        """The row with the highest rate (ties: the lower p99)."""
        return max(self.rows, key=lambda r: (r["max_rate"], -r["latency_p99_ms"]))

    @property
    def best_config(self) -> BatchingConfig:
        """The best setting as a BatchingConfig."""
        return self.base.replace(**{k: self.best[k] for k in BATCHING_KNOBS})

    def table(self) -> str:
        """The rows as an aligned text table, best rate first."""
        return format_table(sorted(self.rows, key=lambda r: -r["max_rate"]), _COLUMNS)

    def apply(self, runner: Runner, method: str = "predict") -> BatchingConfig:
        """Configure a running runner's batchable method with the best setting (one call)."""
        out = runner.configure(method, **{k: self.best[k] for k in BATCHING_KNOBS})
        assert isinstance(out, BatchingConfig)
        return out

    def export(self, target: str = "labserve") -> str:
        """The best setting for ``labserve``, ``ray``, ``triton`` or ``tfserving``."""
        return export_config(self.best_config, target)


def search_batching(
    latency_ms: float,
    *,
    grid: Mapping[str, Sequence[Any]],
    cost: Any = (2.0, 0.1),
    attainment: float = 0.99,
    base: BatchingConfig | None = None,
    duration_s: float = 60.0,
    warmup_s: float = 5.0,
    tolerance: float = 0.02,
    seed: int = 0,
) -> BatchingSearch:
    """The highest rate answering ``attainment`` of requests within ``latency_ms``, per setting.

    Args:
        latency_ms: the target, arrival to answer.
        grid: lists of values for any of :data:`BATCHING_KNOBS`; every combination runs.
        cost: the model's cost as :func:`labserve.simulate` takes it (``(a_ms, b_ms)``).
        attainment: the share within the target (0.99: the target is the p99's).
        base: every other setting (default: BatchingConfig's defaults).
        duration_s: simulated seconds of arrivals at each rate.
        warmup_s: the first seconds' arrivals are not judged.
        tolerance: the bisection stops within this share of the edge.
        seed: the arrivals' seed, the same for every setting and rate.

    Raises:
        ValueError: a bad target, attainment, warm-up or grid key; ConfigError: a grid
            value the config refuses (before anything runs).
    """
    if not (isinstance(latency_ms, (int, float)) and latency_ms > 0):
        raise ValueError(f"latency_ms must be a number of milliseconds > 0, got {latency_ms!r}")
    if not (isinstance(attainment, (int, float)) and 0 < attainment <= 1):
        raise ValueError(f"attainment must be a share in (0, 1], got {attainment!r}")
    if not (0 <= warmup_s < duration_s):
        raise ValueError(f"warmup_s must be >= 0 and below duration_s, got {warmup_s!r}")
    base = base or BatchingConfig()
    configs = _grid(base, grid)
    rows: list[dict[str, Any]] = []
    start = 1000.0 / latency_ms  # one request per target interval: a safe first guess
    for config in configs:
        judge = _Judge(config, cost, latency_ms, attainment, duration_s, warmup_s, seed)
        found = highest_rate(judge, start=start, tolerance=tolerance)
        rows.append(_row(config, found.rate, judge.points.get(found.rate)))
        start = found.rate or start  # the neighbour's edge: the next bracket's first guess
    return BatchingSearch(rows, float(latency_ms), float(attainment), base)


@dataclass
class _Judge:
    """Simulates one setting at a rate; true when enough requests met the target."""

    config: BatchingConfig
    cost: Any
    latency_ms: float
    attainment: float
    duration_s: float
    warmup_s: float
    seed: int
    points: dict[float, tuple[float, RunResult]] = field(default_factory=dict)

    def __call__(self, rate: float) -> bool:
        n = max(1, round(rate * self.duration_s))
        # One stream of gaps for every rate: the same pattern squeezed, so attainment falls
        # with the rate without sampling noise crossing the target back (see PoissonWorkload).
        gaps = np.random.default_rng([self.seed, 0]).standard_exponential(n)
        run = simulate(
            np.cumsum(gaps) / rate,
            duration_s=self.duration_s,
            seed=self.seed,
            cost=self.cost,
            **self.config.as_dict(),
        )
        self.points[rate] = (_attained(run, self.latency_ms, self.warmup_s), run)
        return self.points[rate][0] >= self.attainment


def _grid(base: BatchingConfig, grid: Mapping[str, Sequence[Any]]) -> list[BatchingConfig]:
    unknown = sorted(set(grid) - set(BATCHING_KNOBS))
    if unknown:
        raise ValueError(f"grid keys must be among {', '.join(BATCHING_KNOBS)}; got {unknown}")
    if any(isinstance(v, str) or not len(v) for v in grid.values()):
        raise ValueError("grid values must be non-empty lists")
    keys = list(grid)
    return [
        base.replace(**dict(zip(keys, combo, strict=True)))
        for combo in itertools.product(*(grid[k] for k in keys))
    ]


def _attained(run: RunResult, latency_ms: float, warmup_s: float) -> float:
    """The share of requests arriving after the warm-up answered within the target."""
    after = run.arrival_s >= warmup_s
    ok = run.served & after & (run.finish_s - run.arrival_s <= latency_ms / 1000.0)
    total = int(after.sum())
    return float(ok.sum()) / total if total else 0.0


def _row(
    config: BatchingConfig, rate: float, point: tuple[float, RunResult] | None
) -> dict[str, Any]:
    row: dict[str, Any] = {k: getattr(config, k) for k in BATCHING_KNOBS}
    row["max_rate"] = rate
    attained, run = point if point is not None else (0.0, None)
    row["attainment"] = attained
    lat = run.latency_s * 1000.0 if run is not None else np.zeros(0)
    row["latency_p50_ms"] = float(np.percentile(lat, 50)) if lat.size else float("nan")
    row["latency_p99_ms"] = float(np.percentile(lat, 99)) if lat.size else float("nan")
    return row
