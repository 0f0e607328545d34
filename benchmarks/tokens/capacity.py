"""Issue 21's targets on all-MiniLM-L6-v2's profiled surface: highest rate at p99 < 250 ms.

For exact-shape grouping (padding off), pad-to-longest and length-aware settings (at most 8
length buckets, with or without a token budget), each on the same seeded trace (lognormal
lengths, median 16, p99 128; cap 64 items; 10 s per point), the rate is raised in 5% steps
until p99 passes the target. Simulated on virtual time with the surface profile_minilm.py
measured (minilm_surface.json). Run:
    .venv/bin/python benchmarks/tokens/capacity.py [--out capacity.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

import labserve
from labserve.lab.surface import CostSurface, TokenCost

HERE = pathlib.Path(__file__).resolve().parent
LENGTHS = "lognormal:16:128"
TARGET_MS = 250.0

SETTINGS = {
    "exact-shape grouping": {"padding": False},
    "pad-to-longest": {},
    "buckets 8,16,32,64,128": {"length_buckets": [8, 16, 32, 64, 128]},
    "buckets 16,32,64": {"length_buckets": [16, 32, 64]},
    "buckets 12,16,24,32,48,64,96,128": {"length_buckets": [12, 16, 24, 32, 48, 64, 96, 128]},
    "buckets 8,16,32,64,128 + budget 2048": {
        "length_buckets": [8, 16, 32, 64, 128],
        "max_batch_tokens": 2048,
    },
    "budget 1024": {"max_batch_tokens": 1024},
}


def load_surface(path: pathlib.Path = HERE / "minilm_surface.json") -> CostSurface:
    data = json.loads(path.read_text())
    fit = TokenCost(**data["fit"])
    grid = tuple(tuple(row) for row in data["median_s"])
    return CostSurface(tuple(data["sizes"]), tuple(data["widths"]), grid, fit)


def point(cost, rate: float, settings: dict, seed: int = 0, duration_s: float = 10.0) -> dict:
    result = labserve.simulate(
        labserve.arrivals("poisson", rate_rps=rate),
        duration_s=duration_s,
        seed=seed,
        input_len=LENGTHS,
        cost=cost,
        strategy="fixed",
        max_batch_size=64,
        max_latency_ms=20,
        **settings,
    )
    return {"rate": rate, **result.summary()}


def capacity(cost, settings: dict, start: float = 1.0) -> tuple[dict | None, list[dict]]:
    """The highest rate (5% steps from ``start``) whose p99 stays under the target."""
    rows, best, rate = [], None, start
    while rate < 10_000:
        row = point(cost, rate, settings)
        rows.append(row)
        ok = row["latency_p99_ms"] < TARGET_MS and row["served_rps"] >= 0.95 * row["offered_rps"]
        if not ok:
            break
        best, rate = row, round(rate * 1.05, 3)
    return best, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(HERE / "capacity.json"))
    parser.add_argument(
        "--synthetic",
        help="fixed_ms,per_item_ms,per_token_ms: a TokenCost instead of the profiled surface",
    )
    args = parser.parse_args()
    if args.synthetic:
        fixed, item, token = (float(v) for v in args.synthetic.split(","))
        cost = TokenCost(fixed, item, token)
    else:
        cost = load_surface()
    table = {}
    for name, settings in SETTINGS.items():
        best, _ = capacity(cost, settings)
        table[name] = best
        if best is None:
            print(f"{name:>40}: no rate meets p99 < {TARGET_MS:g} ms")
            continue
        print(
            f"{name:>40}: {best['rate']:7.2f} req/s  p99 {best['latency_p99_ms']:6.1f} ms"
            f"  mean batch {best['mean_batch']:5.2f}  padding {best.get('padding_pct', 0):5.1f}%"
        )
    exact, longest = table["exact-shape grouping"], table["pad-to-longest"]
    aware = {k: v for k, v in table.items() if k not in ("exact-shape grouping", "pad-to-longest")}
    name, best = max(aware.items(), key=lambda kv: kv[1]["rate"] if kv[1] else 0.0)
    print(
        f"best length-aware: {name}: {best['rate'] / exact['rate']:.2f}x exact-shape,"
        f" {best['rate'] / longest['rate']:.2f}x pad-to-longest,"
        f" padding {best['padding_pct']:.1f}% (pad-to-longest {longest['padding_pct']:.1f}%)"
    )
    pathlib.Path(args.out).write_text(json.dumps(table, indent=1, default=float) + "\n")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
