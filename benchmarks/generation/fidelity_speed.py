"""Is the fidelity miss the simulator's or the machine's? fidelity.py with the machine's speed.

``step_drift.py`` found this host's vCPU speed moving TinyLM's decode, called alone without
labserve's runtime, by -32% to +60% within one process. This runs ``fidelity.py``'s protocol
(capacity, one calibration on seed 0 at 50%, seeds 1-3 at 25/50/80% x ``--repeats`` live runs,
the same arrivals replayed) and times that decode (``step_drift``'s probe: 8 sequences, median
of 60, thread CPU) before and after every live run. Beside the calibrated cost as is
(``calibrated``), the same cost with every term scaled by the machine's speed during that
seed's runs over its speed at the calibration (``speed-scaled``): what a simulator that knew
the machine's speed would say. If the scaled column hits where the plain one misses, the miss
is the machine's drift; if not, it is the model of the step.

    .venv/bin/python benchmarks/generation/fidelity_speed.py [--seconds 8] [--repeats 3]
        [--out benchmarks/generation/fidelity_speed.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported

import argparse
import dataclasses
import json
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fidelity as F  # noqa: E402
from step_drift import _machine  # noqa: E402

import labserve  # noqa: E402
from labserve.lab.demo import TinyLM  # noqa: E402
from labserve.sim.generation import StepCost  # noqa: E402


def scaled(cost: StepCost, factor: float) -> StepCost:
    """``cost`` with its four terms times ``factor`` (its spread and wake as they are)."""
    return dataclasses.replace(
        cost,
        fixed_ms=cost.fixed_ms * factor,
        per_seq_ms=cost.per_seq_ms * factor,
        per_batched_token_ms=cost.per_batched_token_ms * factor,
        per_context_token_ms=cost.per_context_token_ms * factor,
    )


def speed_ms() -> float:
    """TinyLM's 8-sequence decode alone, thread CPU ms (median of 60): the machine now."""
    return float(_machine()["decode8_cpu_ms"])


def timed_live(runner: labserve.Runner, offsets: Any, output: int) -> tuple[dict, float]:
    """One live run, and the machine's speed around it (the mean of before and after)."""
    before = speed_ms()
    got = F.live(runner, offsets, output)
    return got, (before + speed_ms()) / 2.0


def main() -> None:
    """Capacity, calibration, then each load x seed live and replayed, plain and scaled."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument("--out", default=str(HERE / "fidelity_speed.json"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "loadavg_before": os.getloadavg(),
        "args": {"model": "tinylm", **{k: v for k, v in vars(args).items() if k != "out"}},
    }
    runner = labserve.Runner(TinyLM, name="tinylm")
    try:
        runner.generate.run("warm up", max_tokens=4)
        cap = F.capacity(runner, args.output, 8.0)["requests_per_s"]
        offsets = F.trace(0.5 * cap, args.seconds, 0)
        got, at_cal = timed_live(runner, offsets, args.output)
        cal = labserve.calibrate(got["sent_snapshot"], arrival_s=got["start_s"] + offsets)
        print(f"capacity {cap:.1f} req/s; calibrated at speed {at_cal:.2f} ms: {cal!r}")
        config = runner.generate.config
        lengths = F.Lengths.of(runner.instance)
        loads: dict[str, Any] = {}
        for load in F.LOADS:
            lives, sims, speeds, steps = [], {"calibrated": [], "speed-scaled": []}, [], []
            for seed in seeds:
                offs = F.trace(load * cap, args.seconds, seed)
                reps = [timed_live(runner, offs, args.output) for _ in range(args.repeats)]
                lives.append([r[0]["figures"] for r in reps])
                speed = statistics.median(r[1] for r in reps)
                speeds.append(speed)
                steps.append({"loadavg": [r[0]["loadavg"] for r in reps]})
                sims["calibrated"].append(F.simulated(config, cal.cost, offs, args.output, lengths))
                factor = speed / at_cal
                sims["speed-scaled"].append(
                    F.simulated(config, scaled(cal.cost, factor), offs, args.output, lengths)
                )
                print(f"  {load:.0%} seed {seed}: speed {speed:.2f} ms ({factor:.2f}x)", flush=True)
            cells = F.judge(lives, sims)
            F.print_table(load, load * cap, cells, list(sims))
            loads[f"{load:.2f}"] = {
                "rate": load * cap,
                "cells": cells,
                "speed_ms": speeds,
                "steps": steps,
            }
        report |= {
            "capacity": {"requests_per_s": cap},
            "calibration": {"loadavg": got["loadavg"], "cost": repr(cal.cost)},
            "speed_at_calibration_ms": at_cal,
            "loads": loads,
            "verdict": F.verdict(loads, ["calibrated", "speed-scaled"]),
        }
    finally:
        runner.stop()
    report["loadavg_after"] = os.getloadavg()
    F.print_verdict(report)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
