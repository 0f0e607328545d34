"""Output tokens/s of TinyLM through HTTP streaming against the same workload in process.

Issue 23's target: 64 concurrent streams, prompts of 32 tokens, outputs of 256 (ignore_eos),
the same scheduler settings (TinyLM's defaults); through ``labserve serve`` with the client
(labserve's generation load generator, closed loop) in another process, at least 80% of the
in-process figure (64 callers looping ``async_run`` on the runner). Rounds alternate; each
figure is output tokens over the run's span (first send to last token), as the load
generator's summary counts it.

    .venv/bin/python benchmarks/generation/http_vs_inprocess.py --rounds 3 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from tinylm_server import tinylm_server  # this folder's (the script's folder is on sys.path)

import labserve
from labserve.lab.demo import TinyLM

PROMPT = "abcdefgh" * 4  # 32 bytes: 32 tokens for a byte-level model


def in_process(seconds: float, streams: int, output: int) -> float:
    runner = labserve.Runner(TinyLM, name="tinylm")
    runner.generate.run(PROMPT, max_tokens=2)  # start-up outside the measure
    tokens = 0

    async def caller(stop_at: float) -> None:
        nonlocal tokens
        while time.monotonic() < stop_at:
            done = await runner.generate.async_run(
                PROMPT, max_tokens=output, temperature=0, ignore_eos=True
            )
            tokens += len(done.token_ids)

    async def main() -> float:
        start = time.monotonic()
        await asyncio.gather(*(caller(start + seconds) for _ in range(streams)))
        return time.monotonic() - start

    span = asyncio.run(main())
    runner.stop()
    return tokens / span


def over_http(seconds: float, streams: int, output: int) -> float:
    with tinylm_server() as base:
        result = labserve.load_test(
            f"{base}/v1/completions",
            duration_s=seconds,
            concurrency=streams,
            input_len=32,
            output_len=output,
        )
        return float(result.summary()["output_tokens_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--output", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        local = in_process(args.seconds, args.streams, args.output)
        http = over_http(args.seconds, args.streams, args.output)
        rows.append(
            {
                "round": r,
                "in_process": local,
                "http": http,
                "ratio": http / local,
                "load_before": load,
            }
        )
        print(
            f"round {r}: in process {local:,.0f} tokens/s, HTTP {http:,.0f} tokens/s, "
            f"ratio {http / local:.2f} (load {load:.1f})",
            flush=True,
        )
    ratios = sorted(row["ratio"] for row in rows)
    print(f"median ratio {ratios[len(ratios) // 2]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
