#!/usr/bin/env python3
"""Python function calls per simulated request: a noise-free measure of the simulator's work.

Wall time on a shared 2-core machine moves with the neighbours; cProfile's call count does not.
Run: `.venv/bin/python benchmarks/sim_calls.py` (prints a markdown table). Same seeded trace
every time: Poisson at each rate for 10 s, cost 2 ms + 0.1 ms x items, cap 64, wait 20 ms.
"""

from __future__ import annotations

import cProfile

import numpy as np

from labserve import simulate

RATES = (1000, 2000, 5000)
STRATEGIES = ("fixed", "greedy", "adaptive")
SECONDS = 10


def calls_per_request(rate: int, strategy: str) -> float:
    """Function calls (primitive and recursive) inside simulate(), per simulated request."""
    times = np.cumsum(np.random.default_rng(0).exponential(1.0 / rate, rate * SECONDS))
    profiler = cProfile.Profile()
    profiler.enable()
    simulate(times, cost=(2.0, 0.1), strategy=strategy, max_batch_size=64, max_latency_ms=20)
    profiler.disable()
    # Summed over the profiler's own entries, one per code object: pstats keys its table by
    # (file, line, name), and every dataclass's generated __init__ is ("<string>", 2,
    # "__init__"), so pstats.Stats.total_calls keeps only one of them.
    return sum(entry.callcount for entry in profiler.getstats()) / len(times)


def main() -> None:
    print("| rate | " + " | ".join(STRATEGIES) + " |")
    print("|---:|" + "---:|" * len(STRATEGIES))
    for rate in RATES:
        row = [f"{calls_per_request(rate, s):.3f}" for s in STRATEGIES]
        print(f"| {rate} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
