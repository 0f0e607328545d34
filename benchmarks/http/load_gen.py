"""The HTTP load generator against wrk and against the server's own /stats, side by side.

Run from the repository root (needs Debian's `wrk`: `apt-get install -y wrk`):

    .venv/bin/python benchmarks/http/load_gen.py [--repeats 3] [--seconds 10] [--rate 2500]

One `labserve serve`-style server process (benchmarks/http/servers.py: the sleep model
2 ms + 0.1 ms x items, cap 64, wait cap 20 ms, simple route), then, per repeat, in this
order: wrk -t1 -c64, `labserve load URL --concurrency 64`, `labserve load URL --rate R`
(open loop, Poisson), each its own process, each for --seconds. Prints one row per run and
the targets (issue 14) over the repeats: min / median / max.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import wrkrun  # this folder's wrk runner (the script's folder is on sys.path)

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
PORT = 18779
URL = f"http://127.0.0.1:{PORT}/runners/m/predict"


def wrk(seconds: float, connections: int = 64) -> dict[str, float]:
    result = wrkrun.run(URL, seconds=seconds, connections=connections)
    return {"rps": result["rps"], "non2xx": float(result["non_2xx"])}


def load(args: list[str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        subprocess.run(
            [sys.executable, "-m", "labserve.cli", "load", URL, *args, "--json", path],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        with open(path, encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
        return data
    finally:
        os.unlink(path)


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    ordered = sorted(values)
    parts = [ordered[0], statistics.median(ordered), ordered[-1]]
    return " / ".join(fmt.format(v) for v in parts)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2500.0)
    parser.add_argument("--loop", default="auto", help="auto, asyncio or uvloop")
    parser.add_argument(
        "--server",
        choices=("labserve", "bare"),
        default="labserve",
        help="bare: tornado answering at once (the generator's own limits; no /stats)",
    )
    return parser.parse_args()


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the server, then per repeat: wrk, the closed-loop load, the open-loop load."""
    s = args.seconds
    server = subprocess.Popen(
        [sys.executable, str(HERE / "servers.py"), args.server, str(PORT), "sleep"],
        stdout=subprocess.PIPE,
        text=True,
    )
    rows: list[dict[str, Any]] = []
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        wrk(2.0, connections=8)  # warm-up
        for r in range(args.repeats):
            w = wrk(s)
            time.sleep(1.0)
            closed = load(["--concurrency", "64", "--duration", f"{s:g}", "--loop", args.loop])
            time.sleep(1.0)
            opened = load(["--rate", f"{args.rate:g}", "--duration", f"{s:g}", "--loop", args.loop])
            time.sleep(1.0)
            rows.append({"repeat": r + 1, "wrk": w, "closed": closed, "open": opened})
    finally:
        server.terminate()
        server.wait(10)
    return rows


def print_rows(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """One table row per repeat; returns each target's measure over the repeats."""
    print(
        "| repeat | wrk -c64 req/s | load -c64 req/s | load/wrk | open: offered | served | "
        "send lag p99 ms | client p50 ms | server p50 ms | served / server's | batch (server) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios, lags, kept, counts, p50s = [], [], [], [], []
    for row in rows:
        c, o = row["closed"]["summary"], row["open"]["summary"]
        ratio = c["served_rps"] / row["wrk"]["rps"]
        served_share = o["served_rps"] / o["offered_rps"]
        server_p50 = o.get("server_latency_p50_ms", math.nan)
        count_ratio = o["requests"] * served_share / o.get("server_served", math.nan)
        p50_ratio = o["latency_p50_ms"] / server_p50
        ratios.append(ratio)
        lags.append(o["send_lag_p99_ms"])
        kept.append(served_share)
        counts.append(count_ratio)
        p50s.append(p50_ratio)
        print(
            f"| {row['repeat']} | {row['wrk']['rps']:,.0f} | {c['served_rps']:,.0f} | "
            f"{ratio:.0%} | {o['offered_rps']:,.0f} | {o['served_rps']:,.0f} | "
            f"{o['send_lag_p99_ms']:.2f} | {o['latency_p50_ms']:.2f} | "
            f"{server_p50:.2f} | {count_ratio:.3f} | {o['mean_batch']:.1f} |"
        )
    return {"ratios": ratios, "lags": lags, "kept": kept, "counts": counts, "p50s": p50s}


def print_targets(m: dict[str, list[float]]) -> None:
    print("\n| target | min / median / max |")
    print("|---|---|")
    print(f"| closed loop >= 90% of wrk | {spread(m['ratios'], '{:.0%}')} |")
    print(f"| open loop send lag p99 <= 2 ms | {spread(m['lags'], '{:.2f} ms')} |")
    print(f"| served within 5% of offered | {spread(m['kept'], '{:.1%}')} |")
    print(f"| served count / server's count (1 +- 10%) | {spread(m['counts'], '{:.3f}')} |")
    print(f"| client p50 / server p50 (1 +- 10%) | {spread(m['p50s'], '{:.2f}')} |")


def main() -> None:
    args = parse_args()
    load_before = os.getloadavg()
    rows = measure(args)
    load_after = os.getloadavg()

    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(
        f"{args.repeats} repeats of {args.seconds:g} s each, generator loop {args.loop}; server: "
        + ("sleep model 2 ms + 0.1 ms x items\n" if args.server == "labserve" else "bare tornado\n")
    )
    print_targets(print_rows(rows))
    with open(HERE / "load_gen_results.json", "w", encoding="utf-8") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
