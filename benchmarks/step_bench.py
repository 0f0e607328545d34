#!/usr/bin/env python3
"""A real step 200 -> 4000 -> 200 req/s against adaptive with a 15 ms p99 target (issue 12).

In-process ``labserve.load_test`` (open loop, latency from the intended send time) on the
sleep model (2 ms + 0.1 ms x items), cap 64, wait cap 20 ms, ``latency_slo_ms=15``, Poisson
arrivals stepping at ``--step-s`` and ``2 x --step-s``. Prints, per run: p99 per phase over the
requests sent more than 1 s after the phase began (and over the whole phase), and the mean
batch and p99 per 0.5 s, to see whether the batch size follows the load within a second.

Run: `.venv/bin/python benchmarks/step_bench.py --repeats 2`
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import labserve
from labserve.lab.demo import SleepModel

LOW, HIGH = 200, 4000
TARGET_MS = 15.0
BIN_S = 0.5
SETTLE_S = 1.0


def one_run(step_s: float, seed: int) -> labserve.RunResult:
    """One fresh runner, one step run; returns the load generator's RunResult."""
    runner = labserve.Runner(
        SleepModel(a_ms=2.0, b_ms=0.1),
        name=f"step{seed}",
        strategy="adaptive",
        latency_slo_ms=TARGET_MS,
        max_batch_size=64,
        max_latency_ms=20,
    )
    x = np.ones((1, 16), np.float32)
    try:
        steps = labserve.StepArrivals([(0, LOW), (step_s, HIGH), (2 * step_s, LOW)])
        return labserve.load_test(
            runner.predict, example=x, duration_s=3 * step_s, arrivals=steps, seed=seed
        )
    finally:
        runner.stop()


def p99(values: np.ndarray) -> float:
    return float(np.percentile(values, 99)) if len(values) else float("nan")


def report(r: labserve.RunResult, step_s: float) -> None:
    served = r.served
    latency_ms = (r.finish_s - r.arrival_s) * 1000.0
    print("| phase | rate | p99 ms, after the first 1 s | p99 ms, whole phase | met? |")
    print("|---|---:|---:|---:|---|")
    for k, rate in enumerate((LOW, HIGH, LOW)):
        t0, t1 = k * step_s, (k + 1) * step_s
        phase = served & (r.arrival_s >= t0) & (r.arrival_s < t1)
        settled = phase & (r.arrival_s >= t0 + SETTLE_S)
        late = p99(latency_ms[settled])
        verdict = "yes" if late <= TARGET_MS else "**no**"
        print(f"| {k + 1} | {rate} | {late:.2f} | {p99(latency_ms[phase]):.2f} | {verdict} |")
    print()
    print("| t (s) | offered req/s | mean batch | batches | p99 ms |")
    print("|---:|---:|---:|---:|---:|")
    for t in np.arange(0.0, 3 * step_s, BIN_S):
        sent = (r.arrival_s >= t) & (r.arrival_s < t + BIN_S)
        fired = (r.batch_start_s >= t) & (r.batch_start_s < t + BIN_S)
        sizes = r.batch_items[fired]
        mean = f"{sizes.mean():.1f}" if len(sizes) else "—"
        print(
            f"| {t:.1f} | {sent.sum() / BIN_S:.0f} | {mean} | {len(sizes)} "
            f"| {p99(latency_ms[sent & served]):.1f} |"
        )
    s = r.summary()
    print(
        f"\nwhole run: served {s['served_rps']:.0f} req/s, rejected {s['rejected_pct']:.2f}%, "
        f"send lag p99 {s.get('send_lag_p99_ms', float('nan')):.2f} ms, "
        f"batches {s['batches']}, target met for {s.get('slo_met_pct', float('nan')):.2f}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-s", type=float, default=4.0, help="seconds per phase")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args()
    for repeat in range(args.repeats):
        load = os.getloadavg()[0]
        print(f"\n### Run {repeat + 1} (load average {load:.2f} before)\n")
        report(one_run(args.step_s, args.seed + repeat), args.step_s)


if __name__ == "__main__":
    main()
