"""Sweeping a generative method's scheduler knobs on virtual time: one row per setting and rate.

Each point runs :func:`~labserve.sim.generation.simulate_generation` (the real scheduler,
a :class:`~labserve.sim.generation.StepCost`, Poisson arrivals with prompt and output
lengths from the shared vocabulary) under one combination of ``strategy``,
``max_num_seqs``, ``max_num_batched_tokens`` and ``enable_chunked_prefill``; every point
is seeded alike, so two settings meet the same arrivals and lengths. The rows print with
:func:`labserve.lab.sweep.format_table` and :data:`GENERATION_COLUMNS`.

>>> from labserve.sim.generation import StepCost
>>> rows = sweep_generation(rates=[20], cost=StepCost(5.0), input_len=8, output_len=16,
...                         strategies=["static", "continuous"], duration_s=5)
>>> [r["strategy"] for r in rows], rows[0]["tpot_p50_ms"] >= rows[1]["tpot_p50_ms"]
(['static', 'continuous'], True)
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from labserve.base.lengths import LengthDist, parse_length
from labserve.config.generation import GenerationConfig
from labserve.sim.generation import StepCost, simulate_generation

__all__ = ["GENERATION_COLUMNS", "sweep_generation"]

GENERATION_COLUMNS: tuple[str, ...] = (
    "strategy",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "rate",
    "output_tokens_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p99_ms",
    "tpot_p50_ms",
    "e2e_p50_ms",
    "goodput_rps",
    "preemptions",
    "refused",
)
"""The columns a generation sweep's table shows by default."""

_Point = tuple[str, int, int, bool, float]
"""(strategy, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, rate)."""


def sweep_generation(
    *,
    rates: Sequence[float],
    cost: StepCost,
    input_len: LengthDist | str | int,
    output_len: LengthDist | str | int,
    strategies: Sequence[str] = ("continuous",),
    max_num_seqs: Sequence[int] = (32,),
    max_num_batched_tokens: Sequence[int] = (2048,),
    enable_chunked_prefill: Sequence[bool] = (True,),
    base: GenerationConfig | None = None,
    duration_s: float = 60.0,
    max_model_len: int = 0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    executor: concurrent.futures.Executor | None = None,
) -> list[dict[str, Any]]:
    """Simulate every combination of the knobs at every rate; one row per point.

    Args:
        rates: Poisson arrival rates, requests/s (finite).
        cost: each step's time (e.g. TinyLM's profiled ``TINYLM_STEP_COST``).
        input_len: prompt lengths (a distribution or a spec such as ``"lognormal:64:512"``).
        output_len: output lengths (each request's ``max_tokens``, all produced).
        strategies: ``continuous`` and/or ``static``.
        max_num_seqs: caps on running sequences.
        max_num_batched_tokens: token budgets per step.
        enable_chunked_prefill: chunking on and/or off.
        base: every other setting (KV blocks, ``long_prefill_token_threshold``, policy,
            and ``ttft_slo_ms``/``tpot_slo_ms`` for the goodput column); default:
            GenerationConfig's defaults.
        duration_s: arrivals span about this long (``rate * duration_s`` requests).
        max_model_len: the model's context (0: no limit).
        seed: the arrivals' and lengths' seed, the same for every point.
        progress: called with (points done, points in all) after each point.
        executor: runs the points in parallel (a process or thread pool); rows keep the
            grid's order.

    Raises:
        ValueError: a rate that is not finite and > 0, ``duration_s`` <= 0, or a knob
            value the config refuses (ConfigError, before anything runs).
    """
    if not rates or any(not (isinstance(r, (int, float)) and 0 < r < math.inf) for r in rates):
        raise ValueError(f"rates must be finite numbers of requests/s > 0, got {list(rates)!r}")
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    base = base or GenerationConfig()
    lengths = (
        parse_length(input_len, name="input_len"),
        parse_length(output_len, name="output_len"),
    )
    grid: list[_Point] = list(
        itertools.product(
            strategies, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, rates
        )
    )
    for point in grid:
        _config(base, point)  # refuse a bad knob before the first point runs
    run = (base, cost, lengths, duration_s, max_model_len, seed)
    if executor is None:
        rows = []
        for done, point in enumerate(grid, start=1):
            rows.append(_point(point, run))
            if progress is not None:
                progress(done, len(grid))
        return rows
    futures = [executor.submit(_point, point, run) for point in grid]
    try:
        for done, _ in enumerate(concurrent.futures.as_completed(futures), start=1):
            if progress is not None:
                progress(done, len(grid))
        return [f.result() for f in futures]
    finally:
        for f in futures:
            f.cancel()  # an error or an interrupt: drop the points not yet started


def _config(base: GenerationConfig, point: _Point) -> GenerationConfig:
    strategy, seqs, budget, chunked, _rate = point
    return base.replace(
        strategy=strategy,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
    )


def _point(point: _Point, run: tuple[Any, ...]) -> dict[str, Any]:
    """One point's row (module level: a process pool pickles it by name)."""
    base, cost, (input_len, output_len), duration_s, max_model_len, seed = run
    config = _config(base, point)
    rate = point[-1]
    result = simulate_generation(
        config,
        cost,
        n_requests=max(1, round(rate * duration_s)),
        input_len=input_len,
        output_len=output_len,
        rate=rate,
        seed=seed,
        max_model_len=max_model_len,
    )
    return {
        "strategy": config.strategy,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "rate": rate,
        **result.summary(),
        "goodput_rps": result.goodput(config.ttft_slo_ms, config.tpot_slo_ms),
        "refused": result.refused,
    }
