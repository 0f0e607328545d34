"""Issue 35's speed target for the search: 200 settings on lesson 10's workload within 60 s.

Lesson 10's workload: Poisson arrivals, 32-token prompts, 128 output tokens, TTFT within
300 ms and TPOT within 30 ms for 90% of the requests, TinyLM's shipped step cost; 120
simulated seconds a point, bisection to 2%. The grid below holds 200 settings (10 caps on
sequences x 5 token budgets x chunking on/off x continuous/static), searched whole by
default; ``--seqs K`` runs the sub-grid of its first K caps on sequences, budgets 512 and
2048, chunked, continuous (2K settings) and extrapolates, per setting, from the CPU time.

``--compare`` runs the same search twice in one process: first the reference
(``exact=True``: every rate of every setting simulated, a probe then the full run, the path
before the shortcuts), then the default, and checks that the two recommend the same
setting and that every setting's ``max_rate`` lies within the bisection's tolerance of the
reference's (both bracket the edge; where the verdicts fall monotonically with the rate
they bracket the same one). ``--step-by-step`` adds the reference with every step planned
one by one and checks its table equals the reference's, float for float.

    .venv/bin/python benchmarks/generation/search_speed.py --compare
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import pathlib
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


def run(
    grid: dict[str, list[Any]], duration_s: float, *, exact: bool, step_by_step: bool = False
) -> dict[str, Any]:
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
            exact=exact,
        )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"found": found, "wall_s": wall, "cpu_s": cpu, "loadavg": os.getloadavg()}


def within(a: list[dict[str, Any]], b: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """How far apart two searches' rates are: the worst ratio and the rows past tolerance."""
    worst, apart = 1.0, []
    for r, q in zip(a, b, strict=True):
        x, y = r["max_rate"], q["max_rate"]
        ratio = max(x, y) / min(x, y) if min(x, y) > 0 else (1.0 if x == y else math.inf)
        worst = max(worst, ratio)
        if ratio > 1 + tolerance + 1e-9:
            apart.append({k: r[k] for k in GRID} | {"rates": [round(x, 2), round(y, 2)]})
    return {"worst_ratio": round(worst, 4), "past_tolerance": apart}


def best(found: Any) -> dict[str, Any]:
    """The recommended setting and its rate."""
    return {k: found.best[k] for k in GRID} | {"max_rate": round(found.best["max_rate"], 2)}


def same_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Row for row, key for key, equal (NaN equal to NaN)."""

    def eq(x: Any, y: Any) -> bool:
        nan = isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
        return nan or x == y

    return len(a) == len(b) and all(
        r.keys() == q.keys() and all(eq(r[k], q[k]) for k in r) for r, q in zip(a, b, strict=True)
    )


def main() -> None:
    """Search the grid; print the table, the time, and the comparison."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=0, help="a sub-grid of K caps (0: all)")
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--compare", action="store_true", help="also the reference")
    parser.add_argument("--step-by-step", action="store_true", help="and it planned by step")
    parser.add_argument("--json", help="also write every search's rows to this file")
    args = parser.parse_args()
    grid = GRID
    if args.seqs:
        grid = {
            "max_num_seqs": GRID["max_num_seqs"][: args.seqs],
            "max_num_batched_tokens": [512, 2048],
        }
    total = len(list(itertools.product(*GRID.values())))
    runs = {}
    if args.compare or args.step_by_step:
        runs["reference"] = run(grid, args.duration, exact=True)
    if args.step_by_step:
        runs["step_by_step"] = run(grid, args.duration, exact=True, step_by_step=True)
    runs["shortcuts"] = run(grid, args.duration, exact=False)
    found = runs["shortcuts"]["found"]
    print(found.table())
    print(found)
    n = len(found.rows)
    out: dict[str, Any] = {"settings": n, "grid_settings": total}
    for name, r in runs.items():
        out[name] = {
            "simulated_points": r["found"].evaluations,
            "cpu_s": round(r["cpu_s"], 1),
            "wall_s": round(r["wall_s"], 1),
            "cpu_s_per_setting": round(r["cpu_s"] / n, 3),
            "cpu_s_for_the_grid": round(r["cpu_s"] / n * total, 0),
            "loadavg": [round(x, 1) for x in r["loadavg"]],
        }
    if "reference" in runs:
        ref = runs["reference"]["found"]
        out["same_best"] = {k: ref.best[k] for k in GRID} == {k: found.best[k] for k in GRID}
        out["best"] = {name: best(r["found"]) for name, r in runs.items()}
        # Settings whose edges lie within the tolerance rank by where each bisection
        # landed: the shortcuts' pick must be as good as the reference's, to within it.
        mine = ref.rows[found.rows.index(found.best)]["max_rate"]
        out["best_within_tolerance"] = mine * 1.02 >= ref.best["max_rate"]
        out["rates"] = within(ref.rows, found.rows, 0.02)
        out["cpu_ratio"] = round(runs["reference"]["cpu_s"] / runs["shortcuts"]["cpu_s"], 2)
    if "step_by_step" in runs:
        rows = runs["step_by_step"]["found"].rows
        out["step_by_step_same_rows"] = same_rows(rows, runs["reference"]["found"].rows)
    print(json.dumps(out))
    if args.json:
        rows = {name: r["found"].rows for name, r in runs.items()}
        pathlib.Path(args.json).write_text(json.dumps(rows, default=str))


if __name__ == "__main__":
    main()
