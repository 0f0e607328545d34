"""Issue 33's multi-turn workload on TinyLM without a prefix cache: the baseline rate.

The workload of the issue's multi-turn target: a 256-token system prompt shared by every
session, 4 turns of 32-token user messages and 64-token replies, 1 s think time, sessions
arriving Poisson. Each turn resends the whole history, so turn t's prompt is
256 + 32 (t + 1) + 64 t tokens (288, 384, 480, 576), all prefilled again without a cache.

1. On virtual time (``simulate_workload``, TinyLM's own GenerationConfig): bisect the
   session arrival rate for the highest whose TTFT p99 over every turn stays under 200 ms
   (``--seconds`` of arrivals, seed 0), on the shipped ``TINYLM_STEP_COST`` (an idle core)
   and on a cost calibrated now (``labserve.calibrate`` on a live run at ``--calibrate-rate``
   sessions/s: what this machine gives at the moment, its spread and wake-up included).
2. Live, TinyLM in process (``start_workload_load``), at fractions of the calibrated rate:
   TTFT p50 and p99 by turn, beside the simulator's on the same arrival times.

With a prefix cache (issue 33's target: at least 2x this rate) only the workload's history
would be shared; this script is the "without caching" side.

    .venv/bin/python benchmarks/generation/multiturn.py [--seconds 30] [--live 0.5,1.0]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported

import argparse
import json
import math
import pathlib
import subprocess
import time
from typing import Any

import numpy as np

import labserve
from labserve.lab.demo import TINYLM_STEP_COST, TinyLM
from labserve.load.arrivals import PoissonArrivals
from labserve.sim.generation import StepCost, simulate_workload

HERE = pathlib.Path(__file__).parent
TTFT_P99_MS = 200.0


def workload(seed: int = 0) -> labserve.SharedPrefixWorkload:
    """The issue's multi-turn workload (one shared system prompt)."""
    return labserve.SharedPrefixWorkload(
        prefix_len=256, input_len=32, output_len=64, turns=4, think_time_s=1.0, seed=seed
    )


def ttft_p99(per_turn: dict[int, dict[str, float]]) -> float:
    """The worst turn's TTFT p99 (ms): a rate is kept when every turn keeps the target."""
    return max((v["p99"] for v in per_turn.values()), default=0.0)  # no session: kept


def simulate(config: Any, cost: StepCost, rate: float, seconds: float) -> Any:
    times = PoissonArrivals(rate).times(seconds, seed=0)
    return simulate_workload(config, cost, workload(), arrival_s=times)


def bisect_rate(
    config: Any, cost: StepCost, seconds: float
) -> tuple[float, list[dict[str, float]]]:
    """The highest session rate (sessions/s) whose every turn keeps TTFT p99 < 200 ms."""
    low, high, tried = 0.0, 0.1, []
    while True:  # double until the target is missed
        p99 = ttft_p99(simulate(config, cost, high, seconds).per_turn())
        tried.append({"rate": high, "ttft_p99_ms": p99})
        if p99 >= TTFT_P99_MS:
            break
        low, high = high, high * 2
    for _ in range(8):  # then halve the bracket: within 1/256 of it
        mid = (low + high) / 2
        p99 = ttft_p99(simulate(config, cost, mid, seconds).per_turn())
        tried.append({"rate": mid, "ttft_p99_ms": p99})
        low, high = (mid, high) if p99 < TTFT_P99_MS else (low, mid)
    return low, tried


def live(lm: labserve.Runner, cost: StepCost, rate: float, seconds: float) -> dict[str, Any]:
    """One in-process run at ``rate`` sessions/s: TTFT by turn, live and simulated."""
    arrivals = PoissonArrivals(rate)
    run = labserve.start_workload_load(
        lm.generate, workload(), arrivals=arrivals, duration_s=seconds
    )
    rows = run.result()
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    times = arrivals.times(seconds, seed=0)
    sim = simulate_workload(lm.generate.config, cost, workload(), arrival_s=times)
    return {
        "rate": rate,
        "sessions": len(times),
        "outcomes": outcomes,
        "live": {str(t): v for t, v in run.per_turn().items()},
        "sim": {str(t): v for t, v in sim.per_turn().items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="arrivals per run, s")
    parser.add_argument("--live", default="0.5,1.0", help="live rates as fractions of the sim's")
    parser.add_argument("--calibrate-rate", type=float, default=1.0, help="sessions/s")
    parser.add_argument("--out", default=str(HERE / "multiturn.json"))
    args = parser.parse_args()
    lm = labserve.Runner(TinyLM(), name="lm")
    config = lm.generate.config
    started = time.monotonic()
    shipped, tried_shipped = bisect_rate(config, TINYLM_STEP_COST, args.seconds)
    print(f"simulator, shipped cost: {shipped:.3f} sessions/s keep TTFT p99 < 200 ms")
    print(f"  ({len(tried_shipped)} simulations, {time.monotonic() - started:.1f} s)")
    runs = []
    try:
        calibration = live(lm, TINYLM_STEP_COST, args.calibrate_rate, args.seconds)
        cost = labserve.calibrate(lm.generate.stats()).cost
        print(f"calibrated on a live run at {args.calibrate_rate:g} sessions/s: {cost!r}")
        rate, tried = bisect_rate(config, cost, args.seconds)
        print(f"simulator, calibrated cost: {rate:.3f} sessions/s keep TTFT p99 < 200 ms")
        for fraction in (float(f) for f in args.live.split(",")):
            got = live(lm, cost, rate * fraction, args.seconds)
            runs.append(got | {"fraction": fraction})
            print(f"live at {fraction:g}x = {got['rate']:.3f} sessions/s: {got['outcomes']}")
            print(f"  {'turn':>4} {'live p50':>9} {'live p99':>9} {'sim p50':>9} {'sim p99':>9}")
            for t in sorted(got["live"], key=int):
                lv, sv = got["live"][t], got["sim"].get(t, {"p50": math.nan, "p99": math.nan})
                print(
                    f"  {t:>4} {lv['p50']:>9.1f} {lv['p99']:>9.1f} {sv['p50']:>9.1f}"
                    f" {sv['p99']:>9.1f}"
                )
    finally:
        lm.stop(timeout=30)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    out = {
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg": os.getloadavg(),
        "seconds": args.seconds,
        "shipped_cost_rate": shipped,
        "shipped_bisection": tried_shipped,
        "calibration_run": calibration,
        "calibrated_cost": repr(cost),
        "calibrated_rate": rate,
        "calibrated_bisection": tried,
        "live": runs,
    }
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"wrote {args.out}; load average {np.round(os.getloadavg(), 2).tolist()}")


if __name__ == "__main__":
    main()
