"""Issue 22's fidelity target: the simulator on TinyLM's profiled step cost against live TinyLM.

At each Poisson rate, requests (prompts of 32 tokens, outputs of OUTPUT tokens, greedy, no
end-of-sequence) are sent in process to ``Runner(TinyLM).generate`` at their intended times;
the runner's own figures (``stats()``: TTFT and TPOT from admission) are the live side. The
same arrival times and lengths are then replayed on virtual time (``replay_generation``) with
the same GenerationConfig and a StepCost: the shipped ``TINYLM_STEP_COST`` (CPU time), and a
profile taken in wall time just before the runs (what this loaded machine gives a step).
Target: TTFT and TPOT p50 within 10%. The live steps' own times are set beside the cost's
prediction for them, and the gap between steps (the driver's own work) is reported.

    .venv/bin/python benchmarks/generation/fidelity.py [--rates 20,60] [--seconds 20]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported

import argparse
import asyncio
import dataclasses
import json
import pathlib
import subprocess
import time
from typing import Any

import numpy as np

import labserve
from labserve.lab.demo import TINYLM_STEP_COST, TinyLM
from labserve.lab.steps import profile_steps
from labserve.sim.generation import replay_generation

HERE = pathlib.Path(__file__).resolve().parent
PROMPT_LEN = 32


def _run_delay_s() -> float:
    """Seconds this process's threads have waited, runnable, for a core (Linux schedstat)."""
    total = 0
    for task in pathlib.Path("/proc/self/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile, or no schedstat here
    return total / 1e9


def live(runner: labserve.Runner, rate: float, seconds: float, output: int, seed: int) -> dict:
    """Send a Poisson trace in process; the runner's own figures and the trace."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.exponential(1.0 / rate, max(1, round(rate * seconds))))
    prompts = [f"{i:08d}" * (PROMPT_LEN // 8) for i in range(len(offsets))]
    runner.generate.reset_stats()

    async def one(at: float, prompt: str) -> int:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        done = await runner.generate.async_run(
            prompt, max_tokens=output, temperature=0, ignore_eos=True
        )
        return len(done.token_ids)

    async def main() -> list[int]:
        start = time.monotonic() + 0.05
        return await asyncio.gather(
            *(one(start + t, p) for t, p in zip(offsets.tolist(), prompts, strict=True))
        )

    cpu0, wait0, wall0 = time.process_time(), _run_delay_s(), time.monotonic()
    counts = asyncio.run(main())
    wall = time.monotonic() - wall0
    # CPU time used, and time spent runnable but waiting for a core (another process had
    # it): a live run that waited long was starved by the machine, not mispredicted.
    cpu_share = (time.process_time() - cpu0) / wall
    waited_share = (_run_delay_s() - wait0) / wall
    snap = runner.generate.stats()
    steps = snap.steps
    durations = steps.end_s - steps.start_s
    gaps = steps.start_s[1:] - steps.end_s[:-1]
    return {
        "offsets": offsets,
        "tokens": counts,
        "cpu_share": cpu_share,
        "waited_share": waited_share,
        "ttft_p50_ms": snap.percentiles_ms["ttft"]["p50"],
        "tpot_p50_ms": snap.percentiles_ms["tpot"]["p50"],
        "window_s": snap.window_s,
        "steps": steps,
        "step_ms_mean": float(durations.mean() * 1e3),
        "gap_ms_median": float(np.median(gaps[gaps < 0.005]) * 1e3) if len(gaps) else 0.0,
        "busy_gap_ms_mean": float(gaps[gaps < 0.005].mean() * 1e3) if len(gaps) else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="20,60")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--output", type=int, default=128, help="output tokens per request")
    parser.add_argument("--out", default=str(HERE / "fidelity.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    wall = profile_steps(TinyLM(), repeats=9, warmup=2).fit
    print(f"wall-time profile now: {wall}")
    runner = labserve.Runner(TinyLM, name="tinylm")
    runner.generate.run("warm up", max_tokens=4)
    config = runner.generate.config
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "loadavg_before": load_before,
        "config": config.as_dict(),
        "output": args.output,
        "wall_profile": dataclasses.asdict(wall),
        "cpu_profile": dataclasses.asdict(TINYLM_STEP_COST),
        "rates": {},
    }
    try:
        for rate in [float(r) for r in args.rates.split(",")]:
            got = live(runner, rate, args.seconds, args.output, seed=int(rate))
            n = len(got["offsets"])
            row: dict[str, Any] = {
                "requests": n,
                "live": {k: got[k] for k in ("ttft_p50_ms", "tpot_p50_ms", "window_s")},
                "live_steps": {
                    "count": len(got["steps"]),
                    "mean_ms": got["step_ms_mean"],
                    "mean_seqs": float(got["steps"].num_seqs.mean()),
                    "gap_ms_median": got["gap_ms_median"],
                    "busy_gap_ms_mean": got["busy_gap_ms_mean"],
                },
                "cpu_share": got["cpu_share"],
                "waited_share": got["waited_share"],
            }
            for name, cost in (("cpu profile", TINYLM_STEP_COST), ("wall profile", wall)):
                sim = replay_generation(
                    config,
                    cost,
                    arrival_s=got["offsets"],
                    prompt_lens=[PROMPT_LEN] * n,
                    output_lens=[args.output] * n,
                    max_model_len=TinyLM().max_model_len,
                )
                ttft = sim.percentiles_ms("ttft")["p50"]
                tpot = sim.percentiles_ms("tpot")["p50"]
                row[name] = {
                    "ttft_p50_ms": ttft,
                    "tpot_p50_ms": tpot,
                    "ttft_off_pct": 100.0 * (ttft / row["live"]["ttft_p50_ms"] - 1.0),
                    "tpot_off_pct": 100.0 * (tpot / row["live"]["tpot_p50_ms"] - 1.0),
                    "mean_step_ms": float((sim.steps.end_s - sim.steps.start_s).mean() * 1e3),
                    "mean_seqs": float(sim.steps.num_seqs.mean()),
                }
            report["rates"][str(rate)] = row
            lv = row["live"]
            print(
                f"{rate:g} req/s ({n} requests): live TTFT p50 {lv['ttft_p50_ms']:.2f} ms, TPOT"
                f" p50 {lv['tpot_p50_ms']:.2f} ms; steps {row['live_steps']['mean_ms']:.2f} ms"
                f" mean at {row['live_steps']['mean_seqs']:.1f} seqs, gap between busy steps"
                f" {row['live_steps']['busy_gap_ms_mean']:.2f} ms; CPU/wall {got['cpu_share']:.2f},"
                f" waited for a core {got['waited_share']:.2f} of the wall time"
            )
            for name in ("cpu profile", "wall profile"):
                s = row[name]
                print(
                    f"   sim on {name}: TTFT p50 {s['ttft_p50_ms']:.2f} ms"
                    f" ({s['ttft_off_pct']:+.0f}%), TPOT p50 {s['tpot_p50_ms']:.2f} ms"
                    f" ({s['tpot_off_pct']:+.0f}%); steps {s['mean_step_ms']:.2f} ms mean at"
                    f" {s['mean_seqs']:.1f} seqs"
                )
    finally:
        runner.stop()
    report["loadavg_after"] = os.getloadavg()
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
