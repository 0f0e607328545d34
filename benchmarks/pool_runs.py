#!/usr/bin/env python3
"""Pool several batching_bench.py JSON reports: per rate and system, median [min-max] over runs.

Also each system's p99 over BentoML's, run by run (the runs paired in order), and the load
generator's launch lag p99 (how far the machine let the harness fall behind its schedule).
Run: `python benchmarks/pool_runs.py benchmarks/batching_results_issue12*.json`
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np


def spread(values: list[float]) -> str:
    return f"{np.median(values):.4g} [{min(values):.4g}-{max(values):.4g}]"


def main() -> None:
    rows: dict[tuple[int, str], list[dict[str, Any]]] = {}
    rates: list[int] = []
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        rates += [r for r in report["params"]["rates"] if r not in rates]
        for result in report["results"]:
            for row in result.get("rates", []):
                if "crash" not in row:
                    rows.setdefault((row["rate"], result["system"]), []).append(row)
    systems = list(dict.fromkeys(s for _, s in rows))
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
            cells.append(spread(ratio) if ratio and system != "bentoml" else "—")
            cells.append(spread([x["launch_lag_p99_ms"] for x in got]))
            print(f"| {rate} | {system} | {len(got)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
