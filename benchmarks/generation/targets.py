"""Issue 22's simulator targets: static against continuous, chunked prefill, the scheduler's cost.

All on virtual time (labserve.sim.generation.simulate_generation, the real Scheduler):

- ``capacity``: output tokens/s at saturation, static and continuous, 5 ms fixed per step,
  no KV limit, max_num_seqs=32, prompts 8, outputs uniform 1-512; the ratio against the
  ideal E[max of 32 outputs] / E[output], computed here exactly from the distribution.
- ``latency``: the highest Poisson rate at which p50 end-to-end latency stays under L, for
  L = 2x and 4x the unloaded p50, for each strategy; the continuous/static ratio.
- ``chunked``: step cost 5 ms + 0.02 ms per batched token, 95% prompts of 64 tokens and 5%
  of 2,048, outputs 128; chunked prefill with max_num_batched_tokens=512 against none with
  2,048 (and 2,048 + max_num_seqs, so a long prompt fits beside the running decodes): the
  highest Poisson rate with p99 ITL < 25 ms while the system keeps up (median TTFT < 2 s).
- ``scheduler``: the scheduler's own wall time per step (schedule + complete) at 32
  running sequences, decoding (no cost model: only the Python work).

Run:
    .venv/bin/python benchmarks/generation/targets.py [--parts capacity,latency,chunked,scheduler]
        [--out benchmarks/generation/targets.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from labserve.config.generation import GenerationConfig
from labserve.generation.scheduler import Scheduler
from labserve.sim.generation import StepCost, simulate_generation

HERE = pathlib.Path(__file__).resolve().parent
SLOTS = 32
OUTPUT_HIGH = 512
OUTPUTS = f"uniform:1:{OUTPUT_HIGH}"
FIVE_MS = StepCost(fixed_ms=5.0)
# 19 entries of 64 and one of 2,048, drawn with replacement: 5% long prompts.
MIXED_PROMPTS = "list:" + ",".join(["64"] * 19 + ["2048"])
CHUNK_COST = StepCost(fixed_ms=5.0, per_batched_token_ms=0.02)
ITL_TARGET_MS = 25.0
TTFT_KEEP_UP_MS = 2000.0  # Sarathi-Serve also bounds the median scheduling delay (2 s)


def _config(**knobs: Any) -> GenerationConfig:
    """The knobs, with no timeout and a queue that never refuses (every request measured)."""
    return GenerationConfig(request_timeout_ms=0, max_queue_size=10_000_000, **knobs)


def ideal_ratio(slots: int = SLOTS, high: int = OUTPUT_HIGH) -> tuple[float, float, float]:
    """E[max of ``slots`` draws of U{1..high}], E[draw] and their ratio, exactly.

    P(max >= k) = 1 - ((k - 1) / high) ** slots, summed over k = 1..high.
    """
    e_max = sum(1 - Fraction(k - 1, high) ** slots for k in range(1, high + 1))
    e_one = Fraction(high + 1, 2)
    return float(e_max), float(e_one), float(e_max / e_one)


def capacity(n_requests: int) -> dict[str, Any]:
    """Output tokens/s with every request queued at time 0 (saturation)."""
    out: dict[str, Any] = {"n_requests": n_requests}
    for strategy in ("static", "continuous"):
        config = _config(strategy=strategy, max_num_seqs=SLOTS)
        r = simulate_generation(
            config, FIVE_MS, n_requests=n_requests, input_len=8, output_len=OUTPUTS
        )
        out[strategy] = {
            "output_tokens_per_s": r.output_tokens_per_s,
            "steps": len(r.steps),
            "mean_running": float(r.steps.num_seqs.mean()),
        }
    e_max, e_one, ideal = ideal_ratio()
    measured = out["continuous"]["output_tokens_per_s"] / out["static"]["output_tokens_per_s"]
    out.update(
        ideal_e_max=e_max,
        ideal_e_output=e_one,
        ideal_ratio=ideal,
        measured_ratio=measured,
        off_ideal_pct=100.0 * (measured / ideal - 1.0),
    )
    return out


def _run(config: GenerationConfig, cost: StepCost, rate: float, duration_s: float, **lengths: Any):
    n = max(500, round(rate * duration_s))
    return simulate_generation(config, cost, n_requests=n, rate=rate, seed=1, **lengths)


def highest_rate(passes: Callable[[float], bool], lo: float, hi: float, steps: int) -> float:
    """Bisect (on a log scale) for the highest rate that passes; ``lo`` must pass."""
    if not passes(lo):
        return math.nan
    while passes(hi):
        lo, hi = hi, hi * 2
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


def latency(duration_s: float, steps: int) -> dict[str, Any]:
    """Highest Poisson rate with p50 e2e under 2x and 4x the unloaded p50, per strategy."""
    lengths = {"input_len": 8, "output_len": OUTPUTS}

    def p50_e2e_ms(strategy: str, rate: float) -> float:
        config = _config(strategy=strategy, max_num_seqs=SLOTS)
        return _steady_p50_ms(_run(config, FIVE_MS, rate, duration_s, **lengths).e2e_s)

    # Unloaded: one request in flight at a time, almost always (mean gap 1,000 s).
    unloaded = {s: p50_e2e_ms(s, 0.001) for s in ("static", "continuous")}
    out: dict[str, Any] = {"duration_s": duration_s, "unloaded_p50_ms": unloaded, "limits": {}}
    base = unloaded["continuous"]
    for factor in (2, 4):
        limit = factor * base
        row: dict[str, Any] = {"limit_ms": limit}
        for strategy in ("static", "continuous"):
            rate = highest_rate(
                lambda r, s=strategy, lim=limit: p50_e2e_ms(s, r) < lim,
                lo=0.05,
                hi=1.0,
                steps=steps,
            )
            row[strategy] = {"rate": rate, "p50_e2e_ms": p50_e2e_ms(strategy, rate)}
        row["ratio"] = row["continuous"]["rate"] / row["static"]["rate"]
        out["limits"][f"{factor}x"] = row
    return out


def _steady_p50_ms(values_s: np.ndarray) -> float:
    """p50 over the whole run, or over its last quarter of arrivals if that is higher (ms).

    Over capacity the queue grows without end, yet a finite run's p50 can stay under a
    limit; the last quarter's p50 shows the growth.
    """
    tail = values_s[-(len(values_s) // 4) :]
    return 1000.0 * max(float(np.median(values_s)), float(np.median(tail)))


def chunk_settings(max_num_seqs: int) -> dict[str, dict[str, Any]]:
    """The three prefill settings compared (knobs of GenerationConfig)."""
    return {
        "chunked, budget 512": {"enable_chunked_prefill": True, "max_num_batched_tokens": 512},
        "no chunking, budget 2048": {
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": 2048,
        },
        # Room for a long prompt beside every running decode: it never waits for a drain,
        # and the decodes wait for it instead (Sarathi-Serve's generation stall).
        f"no chunking, budget {2048 + max_num_seqs}": {
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": 2048 + max_num_seqs,
        },
    }


def chunked(duration_s: float, steps: int, max_num_seqs: int) -> dict[str, Any]:
    """Highest Poisson rate with p99 ITL < 25 ms and median TTFT < 2 s, per setting."""
    lengths = {"input_len": MIXED_PROMPTS, "output_len": 128}
    out: dict[str, Any] = {"duration_s": duration_s, "max_num_seqs": max_num_seqs, "settings": {}}
    for name, knobs in chunk_settings(max_num_seqs).items():
        config = _config(max_num_seqs=max_num_seqs, **knobs)

        def summary(rate: float, config: GenerationConfig = config) -> dict[str, float]:
            r = _run(config, CHUNK_COST, rate, duration_s, **lengths)
            return {**r.summary(), "ttft_steady_p50_ms": _steady_p50_ms(r.ttft_s)}

        def passes(rate: float, summary: Callable[[float], dict[str, float]] = summary) -> bool:
            s = summary(rate)
            return s["itl_p99_ms"] < ITL_TARGET_MS and s["ttft_steady_p50_ms"] < TTFT_KEEP_UP_MS

        rate = highest_rate(passes, lo=1.0, hi=8.0, steps=steps)
        out["settings"][name] = {
            "knobs": knobs,
            "rate": rate,
            "at_rate": summary(rate),
            # What fails just above: the ITL target, or keeping up.
            "at_1.1x": summary(rate * 1.1),
        }
    s = out["settings"]
    out["ratio"] = s["chunked, budget 512"]["rate"] / s["no chunking, budget 2048"]["rate"]
    return out


def scheduler_step(rounds: int, steps: int) -> dict[str, Any]:
    """The scheduler's own time per step (schedule + complete), 32 sequences decoding (µs).

    CPU time of this process (``time.process_time``: the scheduler's own work, not time
    spent waiting for a core on a shared machine) and wall time, per round.
    """
    results = []
    for kv, timeout_ms in ((0, 0.0), (SLOTS * 4_000, 60_000.0)):
        cpu, wall = [], []
        for _ in range(rounds):
            config = GenerationConfig(
                max_num_seqs=SLOTS, num_kv_blocks=kv, request_timeout_ms=timeout_ms
            )
            sched = Scheduler(config)
            for i in range(SLOTS):
                sched.add(i, prompt_len=8, max_tokens=steps + 10, now=0.0)
            now = 0.0
            plan = sched.schedule(now)
            sched.complete(plan, now)
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(steps):
                plan = sched.schedule(now)
                sched.complete(plan, now)
            cpu.append((time.process_time() - c0) / steps * 1e6)
            wall.append((time.perf_counter() - w0) / steps * 1e6)
            assert sched.num_running == SLOTS and len(plan.scheduled) == SLOTS
        results.append(
            {
                "num_kv_blocks": kv,
                "request_timeout_ms": timeout_ms,
                "cpu_us_per_step_median": statistics.median(cpu),
                "wall_us_per_step_median": statistics.median(wall),
                "cpu_us_per_step_rounds": cpu,
                "wall_us_per_step_rounds": wall,
            }
        )
    return {"running": SLOTS, "steps_per_round": steps, "rounds": results}


def _machine() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "loadavg": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="capacity,latency,chunked,scheduler")
    parser.add_argument("--out", default=str(HERE / "targets.json"))
    parser.add_argument("--n-saturation", type=int, default=16_000)
    parser.add_argument("--duration", type=float, default=600.0, help="virtual s per point")
    parser.add_argument("--bisect", type=int, default=10, help="bisection steps per search")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="for the chunked part")
    args = parser.parse_args()
    parts = args.parts.split(",")
    report: dict[str, Any] = {"machine": _machine()}
    if "capacity" in parts:
        report["capacity"] = c = capacity(args.n_saturation)
        print(
            f"capacity: static {c['static']['output_tokens_per_s']:,.0f} tok/s, continuous "
            f"{c['continuous']['output_tokens_per_s']:,.0f} tok/s, ratio "
            f"{c['measured_ratio']:.3f} against ideal {c['ideal_ratio']:.3f} "
            f"(E[max]={c['ideal_e_max']:.2f}, E[out]={c['ideal_e_output']:.1f}): "
            f"{c['off_ideal_pct']:+.1f}%"
        )
    if "latency" in parts:
        report["latency"] = lat = latency(args.duration, args.bisect)
        print(f"unloaded p50 e2e ms: {lat['unloaded_p50_ms']}")
        for key, row in lat["limits"].items():
            print(
                f"L={key} ({row['limit_ms']:.0f} ms): static {row['static']['rate']:.3f} req/s,"
                f" continuous {row['continuous']['rate']:.3f} req/s, ratio {row['ratio']:.2f}x"
            )
    if "chunked" in parts:
        report["chunked"] = ch = chunked(args.duration, args.bisect, args.max_num_seqs)
        for name, row in ch["settings"].items():
            at, above = row["at_rate"], row["at_1.1x"]
            print(
                f"{name}: {row['rate']:.2f} req/s (ITL p99 {at['itl_p99_ms']:.1f} ms, TTFT p50"
                f" {at['ttft_p50_ms']:.0f} ms; at 1.1x: ITL p99 {above['itl_p99_ms']:.1f},"
                f" TTFT p50 {above['ttft_p50_ms']:.0f},"
                f" last quarter {above['ttft_steady_p50_ms']:.0f})"
            )
        print(f"chunked / no chunking (2048): {ch['ratio']:.2f}x")
    if "scheduler" in parts:
        report["scheduler"] = sc = scheduler_step(rounds=5, steps=20_000)
        for row in sc["rounds"]:
            print(
                f"scheduler, 32 running, kv={row['num_kv_blocks']}, timeout="
                f"{row['request_timeout_ms']:g}: {row['cpu_us_per_step_median']:.1f} µs/step CPU,"
                f" {row['wall_us_per_step_median']:.1f} µs wall"
            )
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
