"""Issue 35's speed target for the search: 200 settings on lesson 10's workload within 60 s.

Lesson 10's workload: Poisson arrivals, 32-token prompts, 128 output tokens, TTFT within
300 ms and TPOT within 30 ms for 90% of the requests, TinyLM's shipped step cost; 120
simulated seconds a point, bisection to 2%. The grid below holds 200 settings (10 caps on
sequences x 5 token budgets x chunking on/off x continuous/static); ``--seqs K`` runs the
sub-grid of its first K caps on sequences, budgets 512 and 2048, chunked, continuous (2K
settings; the whole grid takes hours at today's speed) and extrapolates, per setting, from
the CPU time they took.

    .venv/bin/python benchmarks/generation/search_speed.py --seqs 3
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import labserve
from labserve.lab.demo import TINYLM_STEP_COST

GRID = {
    "max_num_seqs": [8, 16, 32, 48, 64, 96, 128, 192, 256, 384],
    "max_num_batched_tokens": [256, 512, 1024, 2048, 4096],
    "enable_chunked_prefill": [True, False],
    "strategy": ["continuous", "static"],
}


def main() -> None:
    """Search a sub-grid of ``--seqs`` caps; print the table, the time and the extrapolation."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=120.0)
    args = parser.parse_args()
    grid = {
        "max_num_seqs": GRID["max_num_seqs"][: args.seqs],
        "max_num_batched_tokens": [512, 2048],
    }
    wall, cpu = time.perf_counter(), time.process_time()
    found = labserve.search_generation(
        labserve.PoissonWorkload(32, 128),
        "ttft:300 tpot:30",
        grid=grid,
        cost=TINYLM_STEP_COST,
        duration_s=args.duration,
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    total = len(list(itertools.product(*GRID.values())))
    print(found.table())
    print(found)
    n = len(found.rows)
    out = {
        "settings": n,
        "evaluations": found.evaluations,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cpu_s_per_setting": round(cpu / n, 2),
        "cpu_s_for_the_grid": round(cpu / n * total, 0),
        "grid_settings": total,
        "loadavg": os.getloadavg(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
