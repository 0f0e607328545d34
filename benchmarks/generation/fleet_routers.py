"""Issue 34's first target on virtual time: routers compared on a 4-replica fleet.

4 replicas, each a TinyLM-costed scheduler (the step cost fitted in
``tinylm_step_cost.json``) with a KV pool of 256 blocks of 16 tokens: its running batch's own
blocks (16 sequences x 8 blocks of question and output) plus 128 blocks, 4 of the 16
tenants' 512-token prefixes (25%). 16 tenants chosen uniformly, 64-token questions, 64-token
outputs. Capacity: the fleet's served requests/s (x 64 output tokens: its tokens/s) under
power of two with caching off, offered 400 req/s (about 4x what it serves) for 120 s: the
requests finished from 20 s to the last arrival, over that time. Then Poisson at 80%
of that with caching on, ``--duration`` simulated seconds, the first ``--warmup`` excluded,
for each router and seed; the median over seeds of each figure. Targets: prefix's hit rate
>= 2x power of two's, its TTFT p50 <= 0.5x, no replica's time-averaged load over 1.5x the
mean. The pile-up case: one tenant sends half the traffic (the other 15 share the rest),
pure affinity against prefix with the fallback and power of two.

    .venv/bin/python benchmarks/generation/fleet_routers.py \
        --json benchmarks/generation/fleet_routers.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from typing import Any

import numpy as np

import labserve

TENANTS, PREFIX, QUESTION, OUTPUT, REPLICAS = 16, 512, 64, 64, 4
# TinyLM's step, fitted on this machine (benchmarks/generation/tinylm_step_cost.json).
COST = labserve.StepCost(
    fixed_ms=0.443, per_seq_ms=0.0685, per_batched_token_ms=0.0226, per_context_token_ms=5.95e-05
)
CONFIG = labserve.GenerationConfig(
    max_num_seqs=16, block_size=16, num_kv_blocks=16 * 8 + 4 * PREFIX // 16
)


def workload(seed: int, hot: bool = False) -> labserve.SharedPrefixWorkload:
    """The 16 tenants; ``hot``: tenant 0 sends half (a Zipf law with that share)."""
    dist = f"zipf:{HOT_EXPONENT}" if hot else "uniform"
    return labserve.SharedPrefixWorkload(
        prefix_len=PREFIX, num_prefixes=TENANTS, prefix_dist=dist, input_len=QUESTION,
        output_len=OUTPUT, seed=seed, prefix_seed=0,
    )  # fmt: skip


def _hot_exponent() -> float:
    """The Zipf exponent that gives tenant 0 of 16 half the traffic (bisection)."""
    low, high = 0.5, 4.0
    for _ in range(60):
        s = (low + high) / 2
        share = 1.0 / sum(1.0 / (j**s) for j in range(1, TENANTS + 1))
        low, high = (s, high) if share < 0.5 else (low, s)
    return round((low + high) / 2, 4)


HOT_EXPONENT = _hot_exponent()


def poisson(rate: float, duration_s: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 34])
    n = int(rate * duration_s * 1.2) + 10
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    return t[t < duration_s]


def run(router: str, rate: float, args: Any, seed: int, *, caching: bool = True, hot: bool = False):
    config = CONFIG.replace(enable_prefix_caching=caching)
    cpu = time.process_time()
    r = labserve.simulate_fleet(
        config, COST, workload(seed, hot), arrival_s=poisson(rate, args.duration, seed),
        replicas=REPLICAS, router=router, seed=seed, measure_from_s=args.warmup,
    )  # fmt: skip
    s = r.summary()
    s["max_replica_load_over_mean"] = s["load_skew"]
    s["replica_loads"] = [round(x.load, 3) for x in r.per_replica()]
    s["replica_hit_rates"] = [round(x.hit_rate, 4) for x in r.per_replica()]
    s["reasons"] = r.reasons
    g = r.generation
    measured = g.arrival_s >= args.warmup
    s["not_served"] = float((measured & ~g.served).sum()) + g.refused  # timed out, refused
    s["cpu_s"] = time.process_time() - cpu
    return s


CAPACITY_RUN_S, CAPACITY_WARMUP_S = 120.0, 20.0


def capacity() -> dict[str, float]:
    """Served requests/s of the fleet, power of two, caching off, offered more than it serves.

    Counted as requests finished from the warm-up to the last arrival, over that time (a
    backlog draining afterwards does not count). No request timeout in this run: with the
    default 60 s, queued requests time out mid-run once the backlog is a minute long and
    the fleet spends steps on them (served fell from 110 to 65 req/s in a 100 s run).
    """
    offered = 400.0  # about 4x what 4 replicas serve (checked below)
    config = CONFIG.replace(enable_prefix_caching=False, request_timeout_ms=0)
    cpu = time.process_time()
    r = labserve.simulate_fleet(
        config, COST, workload(0), arrival_s=poisson(offered, CAPACITY_RUN_S, 0),
        replicas=REPLICAS, router="power_of_two", seed=0,
    )  # fmt: skip
    g = r.generation
    ends = g.end_s[g.served]
    window = CAPACITY_RUN_S - CAPACITY_WARMUP_S
    served = float(((ends >= CAPACITY_WARMUP_S) & (ends < CAPACITY_RUN_S)).sum()) / window
    if served > offered / 1.5:
        raise SystemExit(f"offered {offered} req/s is not saturating: served {served:.1f}")
    return {
        "offered_rps": offered,
        "run_s": CAPACITY_RUN_S,
        "warmup_s": CAPACITY_WARMUP_S,
        "capacity_rps": served,
        "tokens_per_s": served * (PREFIX + QUESTION + OUTPUT),
        "output_tokens_per_s": served * OUTPUT,
        "refused": g.refused,
        "cpu_s": time.process_time() - cpu,
    }


def median_over(rows: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k, v in rows[0].items() if isinstance(v, float)]
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--warmup", type=float, default=60.0)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed-from", type=int, default=0, help="seeds seed-from .. + seeds - 1")
    p.add_argument("--routers", default="power_of_two,prefix,round_robin,least_kv,prefix_affinity")
    p.add_argument("--cases", default="uniform,hot_tenant", help="which workloads to run")
    p.add_argument(
        "--capacity-rps", type=float, help="skip the capacity run: use this (a run's figure)"
    )
    p.add_argument("--json")
    p.add_argument("--merge", nargs="+", help="combine these runs' JSON files into --json")
    args = p.parse_args()
    if args.merge:
        merge(args.merge, args.json)
        return
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "loadavg_before": os.getloadavg(),
        "duration_s": args.duration, "warmup_s": args.warmup,
        "seeds": list(range(args.seed_from, args.seed_from + args.seeds)),
        "config": repr(CONFIG), "cost": repr(COST), "hot_zipf_exponent": HOT_EXPONENT,
    }  # fmt: skip
    cap = capacity() if args.capacity_rps is None else {"capacity_rps": args.capacity_rps}
    out["capacity"] = cap
    rate = 0.8 * cap["capacity_rps"]
    out["rate_rps"] = rate
    print(f"capacity {cap['capacity_rps']:.1f} req/s; offered {rate:.1f} req/s", flush=True)
    jobs = [("uniform", r) for r in args.routers.split(",")[:2]]  # the targets first
    jobs += [("hot_tenant", r) for r in ("prefix_affinity", "prefix", "power_of_two")]
    jobs += [("uniform", r) for r in args.routers.split(",")[2:]]
    jobs = [(case, router) for case, router in jobs if case in args.cases.split(",")]
    for case, router in jobs:
        rows = [
            run(router, rate, args, seed, hot=case == "hot_tenant")
            for seed in range(args.seed_from, args.seed_from + args.seeds)
        ]
        out.setdefault(case, {})[router] = {"median": median_over(rows), "runs": rows}
        m = out[case][router]["median"]
        print(
            f"{case:>10} {router:>15}: hit {m['hit_rate']:.3f} ttft p50 {m['ttft_p50_ms']:.1f} ms "
            f"p99 {m['ttft_p99_ms']:.1f} skew {m['load_skew']:.2f} mean load {m['mean_load']:.2f} "
            f"cpu {sum(r['cpu_s'] for r in rows):.1f} s, load avg {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        targets(out)
        out["loadavg_after"] = os.getloadavg()
        if args.json:  # after each router: a long run that is stopped keeps what it measured
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    print(json.dumps(out.get("targets"), indent=1))


def merge(paths: list[str], into: str) -> None:
    """One JSON from runs made apart (seeds or routers in parallel processes): medians again."""
    out: dict[str, Any] = {"merged_from": paths, "parts": {}}
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        out["parts"][path] = {k: v for k, v in part.items() if k not in ("uniform", "hot_tenant")}
        out.setdefault("rate_rps", part["rate_rps"])
        for case in ("uniform", "hot_tenant"):
            for router, got in part.get(case, {}).items():
                runs = out.setdefault(case, {}).setdefault(router, {"runs": []})["runs"]
                runs += got["runs"]
    for case in ("uniform", "hot_tenant"):
        for got in out.get(case, {}).values():
            got["median"] = median_over(got["runs"])
    targets(out)
    print(json.dumps(out.get("targets"), indent=1))
    with open(into, "w") as f:
        json.dump(out, f, indent=1)


def targets(out: dict[str, Any]) -> None:
    """The issue's ratios, once prefix and power of two have run on the uniform case."""
    u = out.get("uniform", {})
    if "prefix" in u and "power_of_two" in u:
        a, b = u["prefix"]["median"], u["power_of_two"]["median"]
        out["targets"] = {
            "hit_rate_ratio": a["hit_rate"] / b["hit_rate"] if b["hit_rate"] else float("inf"),
            "ttft_p50_ratio": a["ttft_p50_ms"] / b["ttft_p50_ms"],
            "prefix_max_load_over_mean": a["load_skew"],
        }


if __name__ == "__main__":
    main()
