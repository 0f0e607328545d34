"""TinyLM's step cost, profiled and fitted: the StepCost that labserve.lab.demo ships.

Times one step of ``TinyLM()`` (its default size) per shape of labserve.lab.steps'
DEFAULT_SHAPES (sequences x new tokens x cached context), and fits a StepCost the way the
tokens surface is fitted. OpenBLAS is held to one thread (TinyLM is sized for one core;
with OpenBLAS's default threads on this shared 2-core machine a 32-sequence step swung
from 11 to 470 ms). Each step is timed in CPU time by default, the model's own work on one
core: at load 5-6 on this machine two wall-time profiles differed by 50%. Run:
    .venv/bin/python benchmarks/generation/profile_tinylm.py [--repeats 7] [--timer cpu|wall]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported

import argparse
import dataclasses
import json
import pathlib
import subprocess
import time

from labserve.lab.steps import profile_steps
from labserve.lab.tinylm import TinyLM

HERE = pathlib.Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(HERE / "tinylm_step_cost.json"))
    parser.add_argument(
        "--timer",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: the process's CPU time (one core's work, steady on a shared machine);"
        " wall: perf_counter (what a live run on this machine sees, waits for a core included)",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    timer = time.process_time if args.timer == "cpu" else time.perf_counter
    prof = profile_steps(TinyLM(), repeats=args.repeats, warmup=2, timer=timer)
    print(prof.table())
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "openblas_threads": os.environ["OPENBLAS_NUM_THREADS"],
        "timer": args.timer,
        "repeats": args.repeats,
        "fit": dataclasses.asdict(prof.fit),
        "points": [{**dataclasses.asdict(p), "fit_s": prof.predicted_s(p)} for p in prof.points],
    }
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
