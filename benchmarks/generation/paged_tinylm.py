"""TinyLM before and after paged KV (issue 32): lesson 09's live runs, alternating rounds.

Issue 32's target: TinyLM's tokens/s and TTFT within 5% of today's at lesson 09's settings
(no regression from paging). Each round runs, for the old tree then the new, lesson 09's two
live runs in a fresh process that imports that tree's labserve (``before_after.py``'s
checkouts): 64 prompts ``request i: `` with lognormal output lengths (seed 0), all at once,
``max_num_seqs=32``, continuous; then its chunked-prefill mix (32 prompts, every eighth of 900
bytes, 64 tokens each, 64-token steps). Each run is done twice in the process and the second
is kept (the first warms numpy and the loop). Figures: output tokens over the wall time of
the run, the server's TTFT p50, and the process's CPU time per output token (the figure
the machine's other load moves least). The tokens are compared between trees: paging must not
change one.

    .venv/bin/python benchmarks/generation/paged_tinylm.py --old main --new . --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from before_after import checkouts, describe, run_in  # noqa: E402


def child() -> None:
    """In a process of one tree: lesson 09's live runs; prints one JSON line."""
    import numpy as np

    import labserve
    from labserve.lab.demo import TinyLM

    rng = np.random.default_rng(0)
    prompts = [f"request {i}: " for i in range(64)]
    lengths = np.clip(rng.lognormal(np.log(16), 1.0, 64).astype(int), 1, 256).tolist()
    mix = ["x" * 900 if i % 8 == 0 else f"short {i}" for i in range(32)]
    lm = labserve.Runner(TinyLM, name="paged-bench", max_num_seqs=32, request_timeout_ms=0)

    async def batch(ps: list[str], ns: list[int]) -> list[Any]:
        calls = (
            lm.generate.async_run(p, max_tokens=n, temperature=0, ignore_eos=True)
            for p, n in zip(ps, ns, strict=True)
        )
        return await asyncio.gather(*calls)

    def run(ps: list[str], ns: list[int], **knobs: Any) -> tuple[dict[str, float], list[Any]]:
        lm.configure("generate", **knobs)
        for _ in range(2):  # the second run is kept
            lm.generate.reset_stats()
            t0, c0 = time.perf_counter(), time.process_time()
            outs = lm.bg.run(batch(ps, ns))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        snap = lm.generate.stats()
        tokens = sum(len(o.token_ids) for o in outs)
        figures = {
            "tokens_per_s": tokens / wall,
            "ttft_p50_ms": snap.percentiles_ms["ttft"]["p50"],
            "cpu_us_per_token": cpu / tokens * 1e6,  # the process's CPU: what load moves least
        }
        return figures, [list(o.token_ids) for o in outs]

    lesson, tokens = run(prompts, lengths, strategy="continuous")
    chunked, chunk_tokens = run(
        mix, [64] * len(mix), enable_chunked_prefill=True, max_num_batched_tokens=64
    )
    lm.stop()
    print(
        json.dumps(
            {
                "lesson09_tokens_per_s": lesson["tokens_per_s"],
                "lesson09_ttft_p50_ms": lesson["ttft_p50_ms"],
                "chunked_tokens_per_s": chunked["tokens_per_s"],
                "chunked_ttft_p50_ms": chunked["ttft_p50_ms"],
                "lesson09_cpu_us_per_token": lesson["cpu_us_per_token"],
                "chunked_cpu_us_per_token": chunked["cpu_us_per_token"],
                "tokens": tokens + chunk_tokens,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="main", help="a directory or a commit")
    parser.add_argument("--new", default=".", help="a directory or a commit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=HERE / "paged_tinylm.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child()
        return
    with checkouts(args.old, args.new) as (old, new):
        trees = {"old": describe(old), "new": describe(new)}
        runs: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for side, tree in (("old", old), ("new", new)):
                load = Path("/proc/loadavg").read_text().split()[0]
                out = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--child"],
                    **run_in(tree),
                    capture_output=True,
                    text=True,
                    check=True,
                )
                figures = json.loads(out.stdout.strip().splitlines()[-1])
                figures.update(side=side, round=r, load=float(load))
                runs.append(figures)
                shown = {
                    k: round(v, 1)
                    for k, v in figures.items()
                    if k.endswith(("_s", "_ms", "_token"))
                }
                print(side, r, f"load {load}", shown, flush=True)
    same = all(run["tokens"] == runs[0]["tokens"] for run in runs)
    keys = [k for k in runs[0] if k.endswith(("_per_s", "_ms", "_per_token"))]
    summary = {}
    print(f"\ntokens identical in every run, old and new: {same}")
    print("| figure | old (median) | new (median) | new / old |\n|---|---:|---:|---:|")
    for key in keys:
        o = statistics.median(x[key] for x in runs if x["side"] == "old")
        n = statistics.median(x[key] for x in runs if x["side"] == "new")
        summary[key] = {"old": o, "new": n, "ratio": n / o}
        print(f"| {key} | {o:,.1f} | {n:,.1f} | {n / o:.3f} |")
    for run in runs:
        del run["tokens"]
    args.json.write_text(
        json.dumps(
            {"trees": trees, "same_tokens": same, "summary": summary, "runs": runs}, indent=1
        )
    )


if __name__ == "__main__":
    main()
