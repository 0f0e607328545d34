"""Sweeps: one table over strategy x caps x latency target x rate, simulated or real."""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from labserve.load.arrivals import PoissonArrivals
from labserve.load.generator import load_test
from labserve.runtime.runner import RunnerMethod
from labserve.sim.simulate import CostLike, simulate

__all__ = ["format_table", "sweep"]

_CHUNK_REQUESTS = 30_000
"""Simulated requests an executor's task gathers (about a quarter second of simulation):
1,000 no-op Ray tasks took 2 s here, as much as 4% of a 1,000-point sweep's 45 s."""

_MIN_CHUNKS = 16
"""A task never takes more than 1/16 of the grid, so small grids still spread out."""

_Point = tuple[Any, ...]
"""(strategy, max_batch_size, max_latency_ms, latency_slo_ms, length_buckets,
max_batch_tokens, padding, rate): one grid point, its rate last."""

COLUMNS: tuple[str, ...] = (
    "strategy",
    "max_batch_size",
    "max_latency_ms",
    "rate",
    "served_rps",
    "mean_batch",
    "latency_p50_ms",
    "latency_p99_ms",
    "rejected_pct",
)


def sweep(
    *,
    rates: Sequence[float],
    strategies: Sequence[str] = ("adaptive",),
    max_batch_size: Sequence[int] = (32,),
    max_latency_ms: Sequence[float] = (10.0,),
    latency_slo_ms: Sequence[float] = (0.0,),
    length_buckets: Sequence[Sequence[int]] = ((),),
    max_batch_tokens: Sequence[int] = (0,),
    padding: Sequence[bool] = (True,),
    input_len: Any = None,
    on_overload: str = "wait",
    duration_s: float = 10.0,
    cost: CostLike = (2.0, 0.1),
    method: RunnerMethod | None = None,
    example: Any = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    executor: concurrent.futures.Executor | None = None,
) -> list[dict[str, Any]]:
    """Run every combination; return one row per point (its settings and its summary).

    Simulated on Poisson arrivals with ``cost`` unless ``method`` (a runner method) and
    ``example`` are given: then each point is a real open-loop run after
    ``configure()`` (the method's config is restored afterwards). ``progress(done, total)``
    is called after each point. ``latency_slo_ms`` sweeps the latency target (0: none);
    ``on_overload`` applies to every point. With ``input_len`` (a length distribution or
    its string) each point simulates a method with a ragged axis, ``cost`` pricing
    ``(items, padded_tokens)``, and ``length_buckets``, ``max_batch_tokens`` and
    ``padding`` are swept too (rows then carry ``tokens_per_batch`` and ``padding_pct``).
    ``executor`` (a ThreadPoolExecutor,
    ProcessPoolExecutor, ``labserve.ray.RayExecutor``...) runs the simulated points in
    parallel; each point is seeded alike, so the rows are the serial run's, in its order.

    >>> rows = sweep(rates=[1000], max_batch_size=[8, 64], duration_s=1)
    >>> [r["max_batch_size"] for r in rows]
    [8, 64]
    """
    if method is not None and example is None:
        raise TypeError("a real sweep needs example= (one request to send)")
    if input_len is None and (
        list(length_buckets) != [()] or list(max_batch_tokens) != [0] or list(padding) != [True]
    ):
        raise TypeError(
            "length_buckets, max_batch_tokens and padding sweep a ragged axis: give input_len"
        )
    grid = list(
        itertools.product(
            strategies,
            max_batch_size,
            max_latency_ms,
            latency_slo_ms,
            [tuple(b) for b in length_buckets],
            max_batch_tokens,
            padding,
            rates,
        )
    )
    if executor is not None:
        if method is not None:
            raise TypeError("executor= runs simulated points; a real sweep runs one at a time")
        return _fan_out(executor, grid, on_overload, duration_s, seed, (cost, input_len), progress)
    rows: list[dict[str, Any]] = []
    before = method.config if method is not None else None
    try:
        for done, point in enumerate(grid, start=1):
            if method is None:
                rows.append(_point(point, on_overload, duration_s, seed, (cost, input_len)))
            else:
                settings = _settings(point, on_overload)
                method.configure(**settings)
                method.reset_stats()
                result = load_test(
                    method,
                    example=example,
                    duration_s=duration_s,
                    arrivals=PoissonArrivals(point[-1]),
                    seed=seed,
                )
                rows.append({**settings, "rate": point[-1], **result.summary()})
            if progress is not None:
                progress(done, len(grid))
    finally:
        if method is not None and before is not None:
            method.configure(**before.as_dict())
    return rows


def _point(
    point: _Point,
    on_overload: str,
    duration_s: float,
    seed: int,
    model: tuple[Any, Any],
) -> dict[str, Any]:
    """One simulated point's row (module level: an executor pickles it by name).

    ``model`` is (cost, input_len): input_len None simulates fixed-shape requests.
    """
    cost, input_len = model
    settings = _settings(point, on_overload)
    rate = point[-1]
    extra: dict[str, Any] = {}
    if input_len is not None:
        extra["input_len"] = input_len
    else:
        for key in ("length_buckets", "max_batch_tokens", "padding"):
            settings.pop(key)
    result = simulate(
        PoissonArrivals(rate), duration_s=duration_s, seed=seed, cost=cost, **settings, **extra
    )
    return {**settings, "rate": rate, **result.summary()}


def _settings(point: _Point, on_overload: str) -> dict[str, Any]:
    """A grid point's batching settings (its rate is the last element)."""
    strategy, cap, wait_ms, slo_ms, buckets, budget, pad, _rate = point
    return {
        "strategy": strategy,
        "max_batch_size": cap,
        "max_latency_ms": wait_ms,
        "latency_slo_ms": slo_ms,
        "on_overload": on_overload,
        "length_buckets": list(buckets),
        "max_batch_tokens": budget,
        "padding": pad,
    }


def _chunks(grid: list[_Point], duration_s: float) -> list[list[_Point]]:
    """Consecutive points, gathered until a task holds ``_CHUNK_REQUESTS`` simulated requests."""
    most = max(1, -(-len(grid) // _MIN_CHUNKS))
    chunks: list[list[_Point]] = [[]]
    requests = 0.0
    for point in grid:
        if chunks[-1] and (requests >= _CHUNK_REQUESTS or len(chunks[-1]) >= most):
            chunks.append([])
            requests = 0.0
        chunks[-1].append(point)
        requests += point[-1] * duration_s
    return chunks


def _points(
    points: list[_Point],
    on_overload: str,
    duration_s: float,
    seed: int,
    model: tuple[Any, Any],
) -> list[dict[str, Any]]:
    """Several points' rows, in order (one executor task)."""
    return [_point(p, on_overload, duration_s, seed, model) for p in points]


def _fan_out(
    executor: concurrent.futures.Executor,
    grid: list[_Point],
    on_overload: str,
    duration_s: float,
    seed: int,
    model: tuple[Any, Any],
    progress: Callable[[int, int], None] | None,
) -> list[dict[str, Any]]:
    """The grid in chunks submitted to ``executor``; rows in the grid's order, progress as done."""
    chunks = _chunks(grid, duration_s)
    futures = {
        executor.submit(_points, c, on_overload, duration_s, seed, model): len(c) for c in chunks
    }
    try:
        done = 0
        for future in concurrent.futures.as_completed(futures):
            done += futures[future]
            if progress is not None:
                progress(done, len(grid))
        return [row for f in futures for row in f.result()]
    finally:
        for f in futures:
            f.cancel()  # an error or an interrupt: drop the points not yet started


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """Rows as an aligned text table of ``columns``."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)
