"""The process's CPU per generated token in process, over a fixed amount of work: TinyLM.

The in-process half of ``http_vs_inprocess.py`` as fixed work instead of a timed run:
``labserve.Runner(TinyLM)`` with its default scheduler settings, --streams callers on one
asyncio loop, each awaiting --requests greedy completions in turn (a prompt of 32 bytes, 256
tokens, ``ignore_eos``). Recorded: this process's CPU time (``time.process_time``: every
thread, the runner's loop and workers included) from the first call to the last reply over
the tokens generated, and the tokens/s of that span. On a shared machine tokens/s measures
how much of the machine the process got (issue 30's in-process tokens/s spread 1,277-2,569
over ten runs at load 7-20); the CPU per token of a fixed amount of work moves much less.

    .venv/bin/python benchmarks/generation/inprocess_cpu.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import labserve
from labserve.lab.demo import TinyLM

PROMPT = "abcdefgh" * 4  # 32 bytes: 32 tokens for a byte-level model
OUTPUT = 256


def one_run(streams: int, requests: int) -> dict[str, Any]:
    """A fresh runner and the fixed work through it."""
    runner = labserve.Runner(TinyLM, name="tinylm")
    try:
        runner.generate.run(PROMPT, max_tokens=2)  # start-up outside the measure
        load = os.getloadavg()[0]
        counts: list[int] = []

        async def caller() -> None:
            for _ in range(requests):
                done = await runner.generate.async_run(
                    PROMPT, max_tokens=OUTPUT, temperature=0, ignore_eos=True
                )
                counts.append(len(done.token_ids))

        async def main() -> None:
            await asyncio.gather(*(caller() for _ in range(streams)))

        cpu0, wall0 = time.process_time(), time.perf_counter()
        asyncio.run(main())
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        runner.stop()
    tokens = sum(counts)
    if len(counts) != streams * requests or min(counts) < OUTPUT:
        sys.exit(f"a call brought fewer than {OUTPUT} tokens: {sorted(counts)[:5]}")
    return {
        "load_before": load,
        "cpu_s": cpu,
        "wall_s": wall,
        "tokens": tokens,
        "in_process_us_per_token": 1e6 * cpu / tokens,
        "tokens_per_s": tokens / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--requests", type=int, default=3, help="per caller, one after another")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = []
    for _ in range(args.rounds):
        runs.append(one_run(args.streams, args.requests))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    for key in ("in_process_us_per_token", "tokens_per_s"):
        print(f"{key}: median {statistics.median(r[key] for r in runs):,.1f}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
