"""Issue 35's speed target for the search: 200 settings on lesson 10's workload within 60 s.

Lesson 10's workload: Poisson arrivals, 32-token prompts, 128 output tokens, TTFT within
300 ms and TPOT within 30 ms for 90% of the requests, TinyLM's shipped step cost; 120
simulated seconds a point, bisection to 2%. The grid below holds 200 settings (10 caps on
sequences x 5 token budgets x chunking on/off x continuous/static); ``--seqs K`` runs the
sub-grid of its first K caps on sequences, budgets 512 and 2048, chunked, continuous (2K
settings) and extrapolates, per setting, from the CPU time they took.

``--compare`` runs the same search twice in one process, first with every step planned
one by one (``step_by_step=True``, the path before issue 35's fast path), then with the
fast path (runs of decode steps at once, ``Scheduler.run_decodes``), and checks that the
two give the same rows, float for float.

    .venv/bin/python benchmarks/generation/search_speed.py --seqs 3 --compare
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import time
from typing import Any
from unittest import mock

import labserve
from labserve.lab.demo import TINYLM_STEP_COST
from labserve.lab.generation import search

GRID = {
    "max_num_seqs": [8, 16, 32, 48, 64, 96, 128, 192, 256, 384],
    "max_num_batched_tokens": [256, 512, 1024, 2048, 4096],
    "enable_chunked_prefill": [True, False],
    "strategy": ["continuous", "static"],
}


def run(grid: dict[str, list[Any]], duration_s: float, step_by_step: bool) -> dict[str, Any]:
    """One search; its rows, CPU and wall seconds."""
    replay = functools.partial(search.replay_generation, step_by_step=step_by_step)
    wall, cpu = time.perf_counter(), time.process_time()
    with mock.patch.object(search, "replay_generation", replay):
        found = labserve.search_generation(
            labserve.PoissonWorkload(32, 128),
            "ttft:300 tpot:30",
            grid=grid,
            cost=TINYLM_STEP_COST,
            duration_s=duration_s,
        )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"found": found, "wall_s": wall, "cpu_s": cpu, "loadavg": os.getloadavg()}


def same_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Row for row, key for key, equal (NaN equal to NaN)."""

    def eq(x: Any, y: Any) -> bool:
        nan = isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
        return nan or x == y

    return len(a) == len(b) and all(
        r.keys() == q.keys() and all(eq(r[k], q[k]) for k in r) for r, q in zip(a, b, strict=True)
    )


def main() -> None:
    """Search a sub-grid of ``--seqs`` caps; print the table, the time and the extrapolation."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--compare", action="store_true", help="also the step-by-step path")
    args = parser.parse_args()
    grid = {
        "max_num_seqs": GRID["max_num_seqs"][: args.seqs],
        "max_num_batched_tokens": [512, 2048],
    }
    total = len(list(itertools.product(*GRID.values())))
    runs = {"fast": run(grid, args.duration, step_by_step=False)}
    if args.compare:
        runs["step_by_step"] = run(grid, args.duration, step_by_step=True)
    found = runs["fast"]["found"]
    print(found.table())
    print(found)
    n = len(found.rows)
    out: dict[str, Any] = {"settings": n, "evaluations": found.evaluations, "grid_settings": total}
    for name, r in runs.items():
        out[name] = {
            "cpu_s": round(r["cpu_s"], 1),
            "wall_s": round(r["wall_s"], 1),
            "cpu_s_per_setting": round(r["cpu_s"] / n, 2),
            "cpu_s_for_the_grid": round(r["cpu_s"] / n * total, 0),
            "loadavg": [round(x, 1) for x in r["loadavg"]],
        }
    if args.compare:
        out["same_rows"] = same_rows(found.rows, runs["step_by_step"]["found"].rows)
        out["cpu_ratio"] = round(runs["step_by_step"]["cpu_s"] / runs["fast"]["cpu_s"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
