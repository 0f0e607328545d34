"""Issue 21 on the real model: 1,000 mixed-length requests against their solo runs, and
simulated against real at two rates (mean batch, padding share, p50 latency).

all-MiniLM-L6-v2, one torch thread, float32; lengths lognormal (median 16, p99 128, at most
256 tokens); buckets 8,16,32,64,128, cap 64, fixed 20 ms. The simulated run replays the real
run's trace (its arrival times and each request's length) on minilm_surface.json. Run:
    .venv/bin/python benchmarks/tokens/real.py [--rates 30,60] [--duration 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib

import numpy as np

import labserve
from labserve.lab.text import MiniLM
from labserve.load.mix import LengthMix

HERE = pathlib.Path(__file__).resolve().parent
LENGTHS = "lognormal:16:128:256"
SETTINGS = {
    "strategy": "fixed",
    "max_batch_size": 64,
    "max_latency_ms": 20,
    "length_buckets": [8, 16, 32, 64, 128],
}


def request(length: int) -> dict[str, np.ndarray]:
    """A tokenized text of ``length`` tokens ([CLS], word ids, [SEP])."""
    rng = np.random.default_rng(length)
    ids = rng.integers(1000, 20000, size=(1, length), dtype=np.int64)
    ids[0, 0], ids[0, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones((1, length), dtype=np.int64)}


def correctness(model: MiniLM, n: int) -> dict[str, float]:
    mix = LengthMix(LENGTHS, request, seed=11)
    requests = [mix.payload(k) for k in range(n)]
    runner = labserve.Runner(model, name="minilm", **SETTINGS)
    try:

        async def send() -> list[np.ndarray]:
            return await asyncio.gather(*(runner.embed.async_run(r) for r in requests))

        results = asyncio.run_coroutine_threadsafe(send(), runner.bg.loop).result(600)
        stats = runner.embed.stats()
    finally:
        runner.stop()
    worst = max(
        float(np.abs(got - model.embed(r)).max()) for r, got in zip(requests, results, strict=True)
    )
    return {
        "requests": n,
        "worst_abs_diff": worst,
        "batches": stats.batches,
        "mean_batch": stats.mean_batch_size,
        "max_batch": stats.max_batch_size_seen,
    }


def sim_vs_real(model: MiniLM, rate: float, duration_s: float) -> dict[str, dict[str, float]]:
    from capacity import load_surface  # the sibling script (its folder is on sys.path)

    runner = labserve.Runner(model, name="minilm", **SETTINGS)
    arrivals = labserve.arrivals("poisson", rate_rps=rate)
    try:
        real = labserve.load_test(
            runner.embed,
            example=request,
            input_len=LENGTHS,
            arrivals=arrivals,
            duration_s=duration_s,
            seed=5,
        )
    finally:
        runner.stop()
    mix = LengthMix(LENGTHS, request, seed=5)  # the same draws as the run's
    lengths = [mix.length(k) for k in range(len(real.arrival_s))]
    sim = labserve.simulate(
        real.arrival_s,
        duration_s=duration_s,
        input_len=lengths,
        cost=load_surface(),
        **SETTINGS,
    )
    keys = ("served_rps", "mean_batch", "padding_pct", "latency_p50_ms", "latency_p99_ms")
    return {
        "real": {k: real.summary()[k] for k in keys},
        "sim": {k: sim.summary()[k] for k in keys},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", default="30,60")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    model = MiniLM(threads=1)
    out: dict[str, object] = {"load_before": os.getloadavg()}
    out["correctness"] = check = correctness(model, args.requests)
    print(f"correctness: {check}")
    for rate in (float(r) for r in args.rates.split(",")):
        out[f"rate_{rate:g}"] = row = sim_vs_real(model, rate, args.duration)
        print(f"rate {rate:g}: real {row['real']}\n          sim  {row['sim']}")
    out["load_after"] = os.getloadavg()
    (HERE / "real.json").write_text(json.dumps(out, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
