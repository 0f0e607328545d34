"""Issue 33's multi-turn target, live on TinyLM: the session rate with and without the cache.

The workload of ``multiturn.py`` (a 256-token system prompt shared by every session, 4 turns
of 32-token user messages and 64-token replies, 1 s think time, sessions arriving Poisson;
each turn resends the history, so turn t's prompt is 288, 384, 480, 576 tokens). For
``enable_prefix_caching`` off, then on, TinyLM in process (``start_workload_load``): the
highest session arrival rate whose every turn keeps TTFT p99 under 200 ms, by doubling from
``--start`` sessions/s until a rate misses, then halving the bracket ``--halvings`` times;
each probe ``--seconds`` of arrivals (seed 0), its sessions run to their last turn. Target:
the rate with caching at least 2x the rate without. Beside each, the simulator's answer on
the same workload (``simulate_workload``, the shipped ``TINYLM_STEP_COST``, same bisection).

    .venv/bin/python benchmarks/generation/multiturn_live.py --json out.json
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from multiturn import TTFT_P99_MS, workload  # this folder's (the script's folder is on sys.path)
from multiturn import ttft_p99 as worst_p99

import labserve
from labserve.lab.demo import TINYLM_STEP_COST, TinyLM
from labserve.load.arrivals import PoissonArrivals
from labserve.sim.generation import simulate_workload


def bisect(probe: Callable[[float], dict[str, Any]], start: float, halvings: int) -> dict:
    """The highest rate whose probe keeps the target, and every probe tried."""
    low, high, tried = 0.0, start, []
    while True:
        got = probe(high)
        tried.append(got)
        if got["worst_ttft_p99_ms"] >= TTFT_P99_MS:
            break
        low, high = high, high * 2
    for _ in range(halvings):
        mid = (low + high) / 2
        got = probe(mid)
        tried.append(got)
        low, high = (mid, high) if got["worst_ttft_p99_ms"] < TTFT_P99_MS else (low, mid)
    return {"rate": low, "missed_at": high, "tried": tried}


def live_probe(lm: labserve.Runner, seconds: float) -> Callable[[float], dict[str, Any]]:
    def probe(rate: float) -> dict[str, Any]:
        before = lm.generate.stats()
        run = labserve.start_workload_load(
            lm.generate, workload(), arrivals=PoissonArrivals(rate), duration_s=seconds
        )
        rows = run.result()
        after = lm.generate.stats()
        queries = after.prefix_cache_queries - before.prefix_cache_queries
        hits = after.prefix_cache_hits - before.prefix_cache_hits
        per_turn = run.per_turn()
        got = {
            "rate": rate,
            "requests": len(rows),
            "served": sum(r.outcome == "served" for r in rows),
            "worst_ttft_p99_ms": worst_p99(per_turn),
            "ttft_by_turn": {str(t): v for t, v in per_turn.items()},
            "hit_rate": hits / queries if queries else 0.0,
            "load": os.getloadavg()[0],
        }
        print(
            f"  {rate:7.3f} sessions/s: worst turn's TTFT p99 {got['worst_ttft_p99_ms']:8.1f} ms,"
            f" hit rate {got['hit_rate']:.2f}, {got['served']}/{got['requests']} served"
            f" (load {got['load']:.1f})",
            flush=True,
        )
        return got

    return probe


def sim_probe(config: Any, seconds: float) -> Callable[[float], dict[str, Any]]:
    def probe(rate: float) -> dict[str, Any]:
        times = PoissonArrivals(rate).times(seconds, seed=0)
        result = simulate_workload(config, TINYLM_STEP_COST, workload(), arrival_s=times)
        return {"rate": rate, "worst_ttft_p99_ms": worst_p99(result.per_turn())}

    return probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="arrivals per probe, s")
    parser.add_argument("--start", type=float, default=1.0, help="first rate, sessions/s")
    parser.add_argument("--halvings", type=int, default=4)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    lm = labserve.Runner(TinyLM, name="tinylm")
    out: dict[str, Any] = {"args": vars(args), "loadavg_before": os.getloadavg()}
    try:
        lm.generate.run("warm up", max_tokens=2)
        for caching in (False, True):
            lm.configure("generate", enable_prefix_caching=caching)
            name = "on" if caching else "off"
            print(f"caching {name}, live:", flush=True)
            t0 = time.time()
            live = bisect(live_probe(lm, args.seconds), args.start, args.halvings)
            config = dataclasses.replace(lm.generate.config, enable_prefix_caching=caching)
            sim = bisect(sim_probe(config, args.seconds), args.start, args.halvings)
            out[name] = {"live": live, "sim": sim, "took_s": time.time() - t0}
            print(
                f"caching {name}: live {live['rate']:.3f} sessions/s, simulated {sim['rate']:.3f}",
                flush=True,
            )
    finally:
        lm.stop()
    out["loadavg_after"] = os.getloadavg()
    out["live_ratio"] = out["on"]["live"]["rate"] / max(out["off"]["live"]["rate"], 1e-9)
    out["sim_ratio"] = out["on"]["sim"]["rate"] / max(out["off"]["sim"]["rate"], 1e-9)
    print(f"on / off: live {out['live_ratio']:.2f}x, simulated {out['sim_ratio']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
