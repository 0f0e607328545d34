"""How fast labserve.simulate runs: simulated requests per second of wall time, one core.

Run: `.venv/bin/python benchmarks/sim_speed.py`. Issue 3's target is 300,000 req/s, and a
60 s trace at 5,000 req/s in about a second. Each case is timed three times and the fastest
wall time kept: on a shared 2-core machine the others measure the neighbours.
"""

from __future__ import annotations

import os
import time

import numpy as np

from labserve import simulate


def main() -> None:
    print(f"load average before: {os.getloadavg()[0]:.2f}\n")
    print("| trace | strategy | simulated req/s | wall s |")
    print("|---|---|---:|---:|")
    for rate, seconds in ((2000, 30), (5000, 60)):
        times = np.cumsum(np.random.default_rng(0).exponential(1.0 / rate, rate * seconds))
        for strategy in ("fixed", "greedy", "adaptive"):
            wall = min(_timed(times, strategy) for _ in range(3))
            trace = f"Poisson {rate} req/s x {seconds} s"
            print(f"| {trace} | {strategy} | {len(times) / wall:,.0f} | {wall:.2f} |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


def _timed(times: np.ndarray, strategy: str) -> float:
    t0 = time.perf_counter()
    simulate(times, cost=(2.0, 0.1), strategy=strategy, max_batch_size=64, max_latency_ms=20)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
