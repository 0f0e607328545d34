"""The settings search over fleets (issue 35): replicas x routers on lesson 12's tenants.

``search_generation`` with ``replicas`` and ``router`` in the grid, on lesson 12's workload
(16 tenants' 512-token prefixes, 64-token questions and answers; each replica holds its
running batch's blocks and 4 of the 16 prefixes), TTFT 200 ms and TPOT 30 ms for 90% of
turns, the shipped TinyLM cost. Prints the table, the best fleet, its router's export, and
the CPU seconds the search took (this process's; each point is a full ``simulate_fleet``
run: the single replica's shortcuts do not apply).

    .venv/bin/python benchmarks/generation/fleet_search.py [--duration 30] [--replicas 2,4]
        [--routers round_robin,power_of_two,prefix] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import time

import labserve
from labserve.lab.demo import TINYLM_STEP_COST


def main() -> None:
    """Search the fleets; print the table, the best, the export and the CPU seconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0, help="simulated s a point")
    parser.add_argument("--replicas", default="2,4")
    parser.add_argument("--routers", default="round_robin,power_of_two,prefix")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    config = labserve.GenerationConfig(
        max_num_seqs=16, num_kv_blocks=16 * 8 + 4 * 32, enable_prefix_caching=True
    )
    tenants = labserve.SharedPrefixWorkload(
        prefix_len=512, num_prefixes=16, input_len=64, output_len=64, seed=0
    )
    grid = {
        "replicas": [int(v) for v in args.replicas.split(",")],
        "router": args.routers.split(","),
    }
    load, cpu0, wall0 = os.getloadavg()[0], time.process_time(), time.monotonic()
    found = labserve.search_generation(
        tenants,
        "ttft:200 tpot:30",
        grid=grid,
        cost=TINYLM_STEP_COST,
        base=config,
        duration_s=args.duration,
        warmup_s=min(5.0, args.duration / 4),
    )
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    print(found.table())
    print(found)
    print(found.export("sglang-router"))
    print(
        f"{len(found.rows)} fleets, {found.evaluations} simulated points: {cpu:.1f} CPU s"
        f" ({cpu / max(found.evaluations, 1):.2f} a point), {wall:.1f} s wall, load {load:.1f}"
    )
    if args.json:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        report = {"commit": commit, "cpu_s": cpu, "wall_s": wall, "loadavg": load,
                  "points": found.evaluations, "rows": found.rows}  # fmt: skip
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
