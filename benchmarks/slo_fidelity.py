#!/usr/bin/env python3
"""The latency target, real against simulated: mean batch, model time per request, p50, p99.

Two comparisons for adaptive with ``latency_slo_ms=15`` (sleep model 2 ms + 0.1 ms x items,
cap 64, wait cap 20 ms, Poisson):

1. ``--bench-json PATH``: the harness's own runs (``batching_bench.py``'s labserve-target15,
   median over its repeats) against ``simulate`` on the very same seeded traces (the
   harness's ``poisson_trace``), nominal cost plus ``--handoff-ms``, statistics over the same
   measured window (model time: batches started in the window / requests served in it).
2. ``--real``: a fresh in-process run per rate with ``load_test`` (after a 2 s warm-up at that
   rate), then ``simulate`` on its arrival times with the runner's own live cost fit (fire to
   release) plus the hand-off measured on that run (median of send lag plus batch end to
   reply); whole-run statistics from ``RunResult.summary()``.

Run (from the repository root):

    .venv/bin/python benchmarks/slo_fidelity.py --real \
        --bench-json benchmarks/batching_side_by_side_loaded_1.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from batching_bench import poisson_trace

import labserve
from labserve.lab.demo import SleepModel

TARGET_MS = 15.0
CONFIG: dict[str, Any] = {
    "strategy": "adaptive",
    "latency_slo_ms": TARGET_MS,
    "max_batch_size": 64,
    "max_latency_ms": 20,
}
KEYS = ("mean_batch", "model_ms_per_request", "p50_ms", "p99_ms")


def window_stats(r: labserve.RunResult, w0: float, w1: float) -> dict[str, float]:
    """The harness's statistics over [w0, w1): requests sent in it, batches started in it."""
    sent = (r.arrival_s >= w0) & (r.arrival_s < w1) & r.served
    latency_ms = (r.finish_s - r.arrival_s)[sent] * 1000.0
    served_in = r.served & (r.finish_s >= w0) & (r.finish_s < w1)
    fired = (r.batch_start_s >= w0) & (r.batch_start_s < w1)
    return {
        "mean_batch": float(r.batch_items[fired].mean()),
        "model_ms_per_request": 1000.0 * float(r.batch_duration_s[fired].sum()) / served_in.sum(),
        "p50_ms": float(np.percentile(latency_ms, 50)),
        "p99_ms": float(np.percentile(latency_ms, 99)),
    }


def summary_stats(r: labserve.RunResult) -> dict[str, float]:
    s = r.summary()
    return {
        "mean_batch": s["mean_batch"],
        "model_ms_per_request": s["model_ms_per_request"],
        "p50_ms": s["latency_p50_ms"],
        "p99_ms": s["latency_p99_ms"],
    }


def row(rate: int, name: str, s: dict[str, float], real: dict[str, float]) -> str:
    cells = [f"{s[k]:.3g}" for k in KEYS]
    errs = [f"{s[k] / real[k] - 1:+.0%}" for k in KEYS[:3]]
    return f"| {rate} | {name} | " + " | ".join(cells + errs) + " |"


HEAD = (
    "| rate | run | mean batch | model ms/req | p50 ms | p99 ms | batch err | model err "
    "| p50 err |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|"
)


def against_bench(path: Path, handoff_ms: float) -> None:
    report = json.loads(path.read_text())
    params = report["params"]
    warmup, duration, seed = params["warmup_s"], params["duration_s"], params["seed"]
    runs = [r for r in report["results"] if r["system"] == "labserve-target15"]
    print(f"Harness runs ({len(runs)} repeats, median) against simulate on the same traces\n")
    print(HEAD)
    for rate in params["rates"]:
        rows = [x for r in runs for x in r.get("rates", []) if x["rate"] == rate]
        rows = [x for x in rows if "crash" not in x]
        if not rows:
            continue
        real = {k: float(np.median([x[k] for x in rows])) for k in KEYS}
        print(row(rate, f"real (harness, {len(rows)} runs)", real, real))
        trace = poisson_trace(rate, warmup, duration, seed)
        for h in (0.0, handoff_ms):
            sim = labserve.simulate(
                trace.offsets, duration_s=warmup + duration, handoff_ms=h, **CONFIG
            )
            stats = window_stats(sim, warmup, warmup + duration)
            print(row(rate, f"sim, cost 2 + 0.1 x n, hand-off {h:.2f} ms", stats, real))


def handoff(real: labserve.RunResult) -> float:
    """Median ms a served request spent outside the queue and its batch (see fidelity.py)."""
    ends = dict(
        zip(
            real.batch_start_s.tolist(),
            (real.batch_start_s + real.batch_duration_s).tolist(),
            strict=True,
        )
    )
    lag = real.send_lag_s if real.send_lag_s is not None else np.zeros(len(real.arrival_s))
    outside = [
        lag[k] + real.finish_s[k] - ends[real.start_s[k]]
        for k in np.flatnonzero(real.served)
        if real.start_s[k] in ends
    ]
    return float(np.median(outside)) * 1000.0


def fresh_runs(rates: list[int], handoff_ms: float) -> None:
    print("\nFresh load_test runs (5 s after a 2 s warm-up) against simulate on their arrivals\n")
    print(HEAD)
    x = np.ones((1, 16), np.float32)
    for rate in rates:
        runner = labserve.Runner(SleepModel(a_ms=2.0, b_ms=0.1), name=f"slo{rate}", **CONFIG)
        try:
            arrivals = labserve.arrivals("poisson", rate_rps=rate)
            labserve.load_test(runner.predict, example=x, duration_s=2.0, arrivals=arrivals)
            load = os.getloadavg()[0]
            real = labserve.load_test(
                runner.predict, example=x, duration_s=5.0, arrivals=arrivals, seed=rate
            )
            fit = runner.stats("predict").cost_fit
        finally:
            runner.stop()
        r = summary_stats(real)
        measured = handoff(real)
        print(row(rate, f"real (load_test, load avg {load:.1f})", r, r))
        for name, cost, h in (
            (f"sim, cost 2 + 0.1 x n, hand-off {handoff_ms:.2f} ms", (2.0, 0.1), handoff_ms),
            (
                f"sim, runner's fit {fit.a_ms:.2f} + {fit.b_ms:.3f} x n, "
                f"hand-off measured {measured:.2f} ms",
                (fit.a_ms, fit.b_ms),
                measured,
            ),
        ):
            sim = labserve.simulate(real.arrival_s, cost=cost, handoff_ms=h, **CONFIG)
            print(row(rate, name, summary_stats(sim), r))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-json", type=Path)
    parser.add_argument("--real", action="store_true", help="also fresh load_test runs")
    parser.add_argument("--rates", default="1000,2000,4000")
    parser.add_argument("--handoff-ms", type=float, default=1.26)
    args = parser.parse_args()
    if args.bench_json:
        against_bench(args.bench_json, args.handoff_ms)
    if args.real:
        fresh_runs([int(r) for r in args.rates.split(",")], args.handoff_ms)


if __name__ == "__main__":
    main()
