"""Issue 35's fidelity target: the simulator, calibrated on one live run, against a live model.

The model is TinyLM unless ``--model module:Class`` names another generative Runnable
(``hf_folder:FolderLM``: the batched HF decoder on ``$LABSERVE_HF_FOLDER``; run from this
folder). Each request's prompt is the same 32-character text; the simulation takes its length
in tokens from the model's own ``encode`` and its ``max_model_len`` from the model.

1. Capacity, measured: output tokens/s of 64 concurrent closed-loop streams (prompts of 32
   characters, outputs of OUTPUT, greedy, no end-of-sequence), divided by OUTPUT: requests/s.
2. Calibration: one live Poisson run (seed 0, 50% of capacity); ``labserve.calibrate`` fits a
   StepCost to its steps' start-to-next-start spans (the whole step, not the model alone).
3. Comparison: Poisson runs at 25%, 50% and 80% of capacity, seeds 1-3, each run live
   ``--repeats`` times (the spread of live against itself), and replayed on virtual time
   (``replay_generation``, same arrivals and lengths, same GenerationConfig) on the
   calibrated cost and, for TinyLM, on the shipped ``TINYLM_STEP_COST``. Live figures are
   the runner's own (``stats()``, from admission; each run fits in its 10 s window).

Target: TTFT, ITL and TPOT at p50 and p99 within 10% of live, or within the spread of the live
repeats where that is larger; the median over seeds. e2e is reported beside them. Beside the
calibrated cost (its spread kept per step size, drawn afresh each step) the same runs are
replayed on it with the spread's measured memory (``memory``), with one spread for every
step (``one spread``, the calibration before), and on the shipped cost (TinyLM's only). The
end prints a compact verdict (hits per load and cost, with the load average), and ``--out``
gets everything as JSON.

    .venv/bin/python benchmarks/generation/fidelity.py [--seconds 8] [--repeats 3]
        [--out benchmarks/generation/fidelity.json] [--model tinylm]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported

import argparse
import asyncio
import dataclasses
import json
import pathlib
import statistics
import subprocess
import time
from typing import Any

import numpy as np
from models import MODEL_HELP, model_class

import labserve
from labserve.lab.demo import TINYLM_STEP_COST, TinyLM
from labserve.sim.generation import StepCost, replay_generation

HERE = pathlib.Path(__file__).resolve().parent
PROMPT_LEN = 32
METRICS = ("ttft", "itl", "tpot", "e2e")
TARGETED = ("ttft", "itl", "tpot")
QUANTILES = ("p50", "p99")
LOADS = (0.25, 0.50, 0.80)


def _run_delay_s() -> float:
    """Seconds this process's threads have waited, runnable, for a core (Linux schedstat)."""
    total = 0
    for task in pathlib.Path("/proc/self/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile, or no schedstat here
    return total / 1e9


def _prompt(i: int) -> str:
    return f"{i:08d}" * (PROMPT_LEN // 8)


def capacity(runner: labserve.Runner, output: int, seconds: float) -> dict[str, float]:
    """Output tokens/s of 64 closed-loop streams, and that over ``output``: requests/s."""

    async def stream(k: int, until: float) -> int:
        tokens, i = 0, 0
        while time.monotonic() < until:
            done = await runner.generate.async_run(
                _prompt(k * 1000 + i), max_tokens=output, temperature=0, ignore_eos=True
            )
            tokens += len(done.token_ids)
            i += 1
        return tokens

    async def main() -> tuple[int, float]:
        t0 = time.monotonic()
        counts = await asyncio.gather(*(stream(k, t0 + seconds) for k in range(64)))
        return sum(counts), time.monotonic() - t0

    tokens, wall = asyncio.run(main())
    return {"tokens_per_s": tokens / wall, "requests_per_s": tokens / wall / output}


def trace(rate: float, seconds: float, seed: int) -> np.ndarray:
    """Poisson arrival offsets (s) for ``seconds`` at ``rate``."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate, max(1, round(rate * seconds))))


def live(runner: labserve.Runner, offsets: np.ndarray, output: int) -> dict[str, Any]:
    """Send the trace in process at its intended times; the runner's own figures after."""
    runner.generate.reset_stats()

    async def one(at: float, prompt: str) -> int:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        done = await runner.generate.async_run(
            prompt, max_tokens=output, temperature=0, ignore_eos=True
        )
        return len(done.token_ids)

    sent: list[labserve.GenerationSnapshot] = []

    async def main() -> tuple[float, list[int]]:
        start = time.monotonic() + 0.05
        runs = asyncio.gather(*(one(start + t, _prompt(i)) for i, t in enumerate(offsets.tolist())))
        # The steps as the last request is sent (what calibrate reads): the recorder keeps
        # the last 2,000, which after the drain hold only its small steps.
        await asyncio.sleep(max(0.0, start + float(offsets[-1]) - time.monotonic()))
        sent.append(runner.generate.stats())
        return start, await runs

    load = os.getloadavg()[0]
    cpu0, wait0, wall0 = time.process_time(), _run_delay_s(), time.monotonic()
    start, counts = asyncio.run(main())
    wall = time.monotonic() - wall0
    snap = runner.generate.stats()
    if snap.outcomes.get("served", 0) != len(offsets) or min(counts) != output:
        raise RuntimeError(f"a live run lost requests or tokens: {snap.outcomes}")
    return {
        "snapshot": snap,
        "sent_snapshot": sent[0],
        "start_s": start,
        "figures": {m: {q: snap.percentiles_ms[m][q] for q in QUANTILES} for m in METRICS},
        # CPU used, and time runnable but waiting for a core (another process had it).
        "cpu_share": (time.process_time() - cpu0) / wall,
        "waited_share": (_run_delay_s() - wait0) / wall,
        "loadavg": load,
    }


def step_figures(snap: labserve.GenerationSnapshot, offsets: np.ndarray, start: float) -> dict:
    """The live steps: mean span of the chained ones, and each idle restart's wake delay."""
    steps = snap.steps
    spans = steps.span_s[steps.chained]
    # A step after idle time starts when an arrival wakes the loop: how long after it.
    arrivals = start + offsets
    restarts = np.flatnonzero(~steps.chained[:-1]) + 1
    wakes = []
    for i in restarts:
        k = np.searchsorted(arrivals, steps.end_s[i - 1])
        if k < len(arrivals) and arrivals[k] <= steps.start_s[i]:
            wakes.append(steps.start_s[i] - arrivals[k])
    return {
        "steps": len(steps),
        "span_ms_mean": float(spans.mean() * 1e3) if spans.size else float("nan"),
        "seqs_mean": float(steps.num_seqs.mean()) if len(steps) else float("nan"),
        "wake_ms_median": float(np.median(wakes) * 1e3) if wakes else float("nan"),
    }


@dataclasses.dataclass(frozen=True)
class Lengths:
    """What the simulation takes from the live model: prompt lengths in its tokens, its context.

    Attributes:
        prompt_tokens: tokens of ``_prompt(i)`` by the model's ``encode`` (the same for every i:
            the prompts differ only in digits).
        max_model_len: the model's context, prompt plus outputs, in tokens.
    """

    prompt_tokens: int
    max_model_len: int

    @classmethod
    def of(cls, model: Any) -> Lengths:
        """Read both from a generative model (``runner.instance``); raises ValueError if the
        prompts do not all encode to one length."""
        sizes = {len(model.encode(_prompt(i))) for i in (0, 12_345_678, 99_999_999)}
        if len(sizes) != 1:
            raise ValueError(f"the prompts must encode to one length, got lengths {sorted(sizes)}")
        return cls(prompt_tokens=sizes.pop(), max_model_len=int(model.max_model_len))


def simulated(
    config: Any, cost: StepCost, offsets: np.ndarray, output: int, lengths: Lengths
) -> dict:
    """The same arrivals and lengths on virtual time: p50 and p99 of each metric, ms."""
    n = len(offsets)
    sim = replay_generation(
        config,
        cost,
        arrival_s=offsets,
        prompt_lens=[lengths.prompt_tokens] * n,
        output_lens=[output] * n,
        max_model_len=lengths.max_model_len,
    )
    return {m: {q: sim.percentiles_ms(m)[q] for q in QUANTILES} for m in METRICS}


def judge(lives: list[dict], sims: dict[str, list[dict]]) -> dict[str, Any]:
    """Per metric and quantile: live (median over seeds of the repeats' median), the repeats'
    half-range (%), and each simulation's error against live (%), median over seeds."""
    out: dict[str, Any] = {}
    for m in METRICS:
        for q in QUANTILES:
            per_seed_live, spreads = [], []
            for reps in lives:
                vals = [r[m][q] for r in reps]
                mid = statistics.median(vals)
                per_seed_live.append(mid)
                spreads.append(100.0 * (max(vals) - min(vals)) / 2.0 / mid)
            cell: dict[str, Any] = {
                "live_ms": statistics.median(per_seed_live),
                "live_half_range_pct": statistics.median(spreads),
            }
            for name, runs in sims.items():
                errs = [
                    100.0 * (s[m][q] / lv - 1.0) for s, lv in zip(runs, per_seed_live, strict=True)
                ]
                err = statistics.median(errs)
                cell[name] = {
                    "sim_ms": statistics.median(s[m][q] for s in runs),
                    "error_pct": err,
                    "hit": abs(err) <= max(10.0, cell["live_half_range_pct"]),
                }
            out[f"{m}_{q}"] = cell
    return out


def print_table(load: float, rate: float, cells: dict[str, Any], names: list[str]) -> None:
    """One load's table: live against each simulation."""
    print(f"\n{load:.0%} of capacity ({rate:.1f} req/s):")
    head = f"{'':>9} {'live ms':>8} {'± live':>7}"
    for name in names:
        head += f" {name + ' ms':>16} {'error':>7}"
    print(head)
    for key, c in cells.items():
        row = f"{key:>9} {c['live_ms']:>8.2f} {c['live_half_range_pct']:>6.1f}%"
        for name in names:
            s = c[name]
            mark = "" if key.split("_")[0] not in TARGETED else ("ok" if s["hit"] else "MISS")
            row += f" {s['sim_ms']:>16.2f} {s['error_pct']:>+6.1f}% {mark}"
        print(row)


def compare(
    runner: labserve.Runner, args: argparse.Namespace, costs: dict[str, StepCost], cap: float
) -> dict[str, Any]:
    """Every load x seed: live repeats and each simulation; the judged table per load."""
    config = runner.generate.config
    lengths = Lengths.of(runner.instance)
    report: dict[str, Any] = {}
    for load in LOADS:
        rate = load * cap
        lives, sims, steps = [], {name: [] for name in costs}, []
        for seed in args.seeds:
            offsets = trace(rate, args.seconds, seed)
            reps = [live(runner, offsets, args.output) for _ in range(args.repeats)]
            lives.append([r["figures"] for r in reps])
            steps.append(
                {
                    **step_figures(reps[0]["snapshot"], offsets, reps[0]["start_s"]),
                    "loadavg": [r["loadavg"] for r in reps],
                    "waited_share": [round(r["waited_share"], 3) for r in reps],
                }
            )
            for name, cost in costs.items():
                sims[name].append(simulated(config, cost, offsets, args.output, lengths))
            print(f"  {load:.0%} seed {seed}: {steps[-1]}", flush=True)
        cells = judge(lives, sims)
        print_table(load, rate, cells, list(costs))
        report[f"{load:.2f}"] = {"rate": rate, "cells": cells, "steps": steps, "lives": lives}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="arrivals per live run")
    parser.add_argument("--repeats", type=int, default=3, help="live runs of each trace")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--output", type=int, default=128, help="output tokens per request")
    parser.add_argument("--capacity-seconds", type=float, default=8.0)
    parser.add_argument("--out", default=str(HERE / "fidelity.json"))
    parser.add_argument("--model", default="tinylm", help=MODEL_HELP)
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "loadavg_before": os.getloadavg(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
    }
    cls = model_class(args.model)
    runner = labserve.Runner(cls, name="tinylm" if cls is TinyLM else "lm")
    try:
        runner.generate.run("warm up", max_tokens=4)
        report["config"] = runner.generate.config.as_dict()
        cap = capacity(runner, args.output, args.capacity_seconds)
        print(f"capacity: {cap['tokens_per_s']:,.0f} tokens/s, {cap['requests_per_s']:.1f} req/s")
        offsets = trace(0.5 * cap["requests_per_s"], args.seconds, 0)
        got = live(runner, offsets, args.output)
        cal = labserve.calibrate(got["sent_snapshot"], arrival_s=got["start_s"] + offsets)
        print(f"calibrated on seed 0 at 50%: {cal!r}\n{cal.table()}")
        costs = {
            "calibrated": cal.cost,
            "memory": dataclasses.replace(cal.cost, spread_memory=cal.memory),
            "one spread": one_spread(cal),
        }
        if cls is TinyLM:  # the shipped cost is TinyLM's; another model has none
            costs["shipped"] = TINYLM_STEP_COST
        report |= {
            "capacity": cap,
            "calibration": {
                "cost": dataclasses.asdict(cal.cost),
                "loadavg": got["loadavg"],
                "steps": len(cal.measured_ms),
                "skipped": cal.skipped,
                "rms_ms": cal.rms_ms,
                "median_error": cal.relative_error(50),
                "p90_error": cal.relative_error(90),
                "table": cal.table(),
            },
            "lengths": dataclasses.asdict(Lengths.of(runner.instance)),
            **({"shipped": dataclasses.asdict(TINYLM_STEP_COST)} if cls is TinyLM else {}),
            "loads": compare(runner, args, costs, cap["requests_per_s"]),
        }
    finally:
        runner.stop()
    report["loadavg_after"] = os.getloadavg()
    report["verdict"] = verdict(report["loads"], list(costs))
    print_verdict(report)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1, default=float) + "\n")


def one_spread(cal: labserve.Calibration) -> StepCost:
    """The calibrated cost with one spread for every step size, drawn afresh each step (the
    calibration before)."""
    ratio = cal.measured_ms / np.maximum(cal.predicted_ms, 1e-9)
    q = np.percentile(ratio, np.linspace(0, 100, len(cal.cost.block_of(0.0))))
    one = tuple(float(v) for v in q)
    return dataclasses.replace(cal.cost, spread=one, spread_edges_ms=(), spread_memory=0.0)


def verdict(loads: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Per load and cost: targeted figures hit, of how many, and the live load averages."""
    out: dict[str, Any] = {}
    for load, got in loads.items():
        keys = [k for k in got["cells"] if k.split("_")[0] in TARGETED]
        averages = [a for s in got["steps"] for a in s["loadavg"]]
        out[load] = {
            "rate": got["rate"],
            "loadavg": [min(averages), max(averages)],
            **{n: sum(bool(got["cells"][k][n]["hit"]) for k in keys) for n in names},
            "of": len(keys),
        }
    return out


def print_verdict(report: dict[str, Any]) -> None:
    """The compact table the lead reads: hits per load and cost, and the machine's load."""
    rows = report["verdict"]
    names = [n for n in next(iter(rows.values())) if n not in ("rate", "loadavg", "of")]
    cal = report["calibration"]
    model = "" if report["args"]["model"] == "tinylm" else f"{report['args']['model']}, "
    print(
        f"\nverdict ({model}{report['date']}, {report['commit']}; capacity"
        f" {report['capacity']['requests_per_s']:.1f} req/s; calibrated at load"
        f" {cal['loadavg']:.1f}): TTFT/ITL/TPOT p50+p99 within 10% or the live spread"
    )
    print(f"{'load':>5} {'req/s':>6} {'load avg':>10} " + " ".join(f"{n:>11}" for n in names))
    total = dict.fromkeys(names, 0)
    of = 0
    for load, r in rows.items():
        lo, hi = r["loadavg"]
        cells = " ".join(f"{str(r[n]) + '/' + str(r['of']):>11}" for n in names)
        print(f"{float(load):>5.0%} {r['rate']:>6.1f} {lo:>4.1f}-{hi:<5.1f} {cells}")
        for n in names:
            total[n] += r[n]
        of += r["of"]
    print(
        f"{'all':>5} {'':>6} {'':>10} "
        + " ".join(f"{str(total[n]) + '/' + str(of):>11}" for n in names)
    )


if __name__ == "__main__":
    main()
