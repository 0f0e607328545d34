"""Per-request overhead, before and after, on asyncio and on uvloop: rounds that alternate.

Each round runs, one process each, `batching_bench.py --rates none` (the overhead phase
only: a no-op model, waves of 64 concurrent requests) for labserve's strategies in the
`--before` tree (its own labserve, imported through PYTHONPATH) and in this one, then
BentoML's dispatcher and the harness alone (`null`), every system on the event loop of the
round (`--loop`: asyncio, then uvloop). The before tree runs on the loops of
`--before-loops` (asyncio alone by default: a labserve older than the loop choice runs on
asyncio whatever it is asked). `--baselines` names the peers run in the after tree; without
benchmarks/.venv-baselines (BentoML), `--baselines null` runs labserve's systems and the
harness alone. Prints a table of median [min-max] µs per request with the load average, and
writes the rows as JSON.

    benchmarks/.venv-baselines/bin/python benchmarks/overhead_ab.py --before /tmp/before
    .venv/bin/python benchmarks/overhead_ab.py --before /work/wt-old --baselines null \
        --before-loops asyncio,uvloop --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parent
LABSERVE = ("labserve-fixed", "labserve-greedy", "labserve-adaptive")
BASELINES = ("bentoml", "null")


def overhead(tree: Path, systems: list[str], loop: str, waves: int) -> dict[str, float]:
    """µs per request of each system, one worker process each, in one harness run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run(
            [
                sys.executable,
                str(HERE / "batching_bench.py"),
                "--systems",
                ",".join(systems),
                "--rates",
                "none",
                "--overhead-waves",
                str(waves),
                "--loop",
                loop,
                "--json",
                str(out),
            ],
            env={**os.environ, "PYTHONPATH": str(tree)},
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        results = json.loads(out.read_text())["results"]
    return {r["system"]: (r.get("overhead") or {}).get("us_per_request") for r in results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the tree to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--waves", type=int, default=1000)
    parser.add_argument("--loops", default="asyncio,uvloop", type=lambda s: s.split(","))
    parser.add_argument("--json", default=str(HERE / "overhead_ab_before_after.json"))
    parser.add_argument("--baselines", default=",".join(BASELINES), type=lambda s: s.split(","))
    parser.add_argument("--before-loops", default="asyncio", type=lambda s: s.split(","))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for i in range(args.rounds):
        for loop in args.loops:
            runs = [("after", ROOT, [*LABSERVE, *args.baselines])]
            if loop in args.before_loops:
                runs.insert(i % 2, ("before", args.before, list(LABSERVE)))
            for side, tree, systems in runs:
                load = os.getloadavg()[0]
                for system, us in overhead(tree, systems, loop, args.waves).items():
                    row = {"round": i + 1, "loop": loop, "side": side, "system": system}
                    rows.append({**row, "us_per_request": us, "load": round(load, 2)})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))
    print("| loop | tree | system | µs per request, median [min-max] | load average |")
    print("|---|---|---|---:|---|")
    for loop in args.loops:
        for side in ("before", "after"):
            for system in (*LABSERVE, *BASELINES):
                got = [
                    r
                    for r in rows
                    if (r["loop"], r["side"], r["system"]) == (loop, side, system)
                    and r["us_per_request"] is not None
                ]
                if not got:
                    continue
                us = [r["us_per_request"] for r in got]
                loads = [r["load"] for r in got]
                print(
                    f"| {loop} | {side} | {system} | {statistics.median(us):.1f} "
                    f"[{min(us):.1f}-{max(us):.1f}] | {min(loads):.1f}-{max(loads):.1f} |"
                )


if __name__ == "__main__":
    main()
