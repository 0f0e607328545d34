#!/usr/bin/env python3
"""Pool several batching_bench.py JSON reports: per rate and system, median [min-max] over runs.

Also each system's p99 over BentoML's, run by run (the runs paired in order), and the load
generator's launch lag p99 (how far the machine let the harness fall behind its schedule).
Run: `python benchmarks/pool_runs.py [--max-lag MS] benchmarks/batching_side_by_side_*.json`

``--max-lag MS`` keeps only the runs whose launch lag p99 was at most MS (the quiet spells of
a shared machine; the same rule for every system), and pairs nothing with BentoML then.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np


def spread(values: list[float]) -> str:
    return f"{np.median(values):.4g} [{min(values):.4g}-{max(values):.4g}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-lag", type=float, help="only runs with launch lag p99 <= MS")
    parser.add_argument("reports", nargs="+")
    args = parser.parse_args()
    rows: dict[tuple[int, str], list[dict[str, Any]]] = {}
    rates: list[int] = []
    systems: list[str] = []
    for path in args.reports:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        rates += [r for r in report["params"]["rates"] if r not in rates]
        for result in report["results"]:
            if result["system"] not in systems:
                systems.append(result["system"])
            for row in result.get("rates", []):
                lag = row.get("launch_lag_p99_ms")
                if args.max_lag is not None and (lag is None or lag > args.max_lag):
                    continue
                if "crash" not in row:
                    rows.setdefault((row["rate"], result["system"]), []).append(row)
    print(
        "| rate | system | runs | p99 ms | p50 ms | mean batch | model ms/req "
        "| p99 / BentoML's | launch lag p99 ms |"
    )
    print("|---:|---|---:|---|---|---|---|---|---|")
    for rate in rates:
        base = rows.get((rate, "bentoml"), [])
        for system in systems:
            got = rows.get((rate, system), [])
            if not got:
                continue
            cells = [spread([x[k] for x in got]) for k in ("p99_ms", "p50_ms", "mean_batch")]
            cells.append(spread([x["model_ms_per_request"] for x in got]))
            ratio = [x["p99_ms"] / b["p99_ms"] for x, b in zip(got, base, strict=False)]
            paired = ratio and system != "bentoml" and args.max_lag is None
            cells.append(spread(ratio) if paired else "—")
            cells.append(spread([x["launch_lag_p99_ms"] for x in got]))
            print(f"| {rate} | {system} | {len(got)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
