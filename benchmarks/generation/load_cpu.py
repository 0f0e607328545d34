"""What the generation load generator costs: its own CPU per streamed token.

Run from the repository root: `.venv/bin/python benchmarks/generation/load_cpu.py`.
A stand-in server (benchmarks/generation/standin_server.py: labserve's real /v1 routes
and SSE framing over tornado, tokens from a timer instead of a model) in its own process;
each client run in a process of its own streams completions from it (prompts of
--input-len bytes, --output-len tokens each with ignore_eos, closed loop of
--concurrency streams, or open loop Poisson at --rate) for --seconds, and reports its
own CPU time (time.process_time over the run: both of its threads, imports and the
server excluded) over the output tokens it received. The target (issue 23): at most
50 µs per token, so that on a machine shared with the server it does not bend what it
measures. Prints a Markdown table and writes --json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def client(args: argparse.Namespace) -> None:
    """One measured run in this process; prints its figures as JSON."""
    os.environ["LABSERVE_LOOP"] = args.loop
    import warnings

    from labserve.load.arrivals import PoissonArrivals
    from labserve.load.generation import generation_load_test
    from labserve.load.loop import load_loop

    warnings.simplefilter("ignore")
    load_loop()  # started before the clock: a thread and a loop are not per-token costs
    url = f"http://127.0.0.1:{args.port}/v1/completions"
    cpu0, wall0 = time.process_time(), time.perf_counter()
    r = generation_load_test(
        url,
        duration_s=args.seconds,
        arrivals=PoissonArrivals(args.rate) if args.rate else None,
        concurrency=None if args.rate else args.concurrency,
        input_len=args.input_len,
        output_len=args.output_len,
        connections=args.concurrency if args.rate else None,
    )
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    s = r.summary()
    chunks = int(r.generation.itl_offsets[-1]) + int(s["served"])
    print(
        json.dumps(
            {
                "cpu_s": cpu,
                "wall_s": wall,
                "tokens": s["output_tokens"],
                "chunks": chunks,
                "requests": s["requests"],
                "served": s["served"],
                "tokens_per_s": s["output_tokens_per_s"],
                "us_per_token": 1e6 * cpu / max(s["output_tokens"], 1),
                "us_per_request": 1e6 * cpu / max(s["requests"], 1),
                "itl_p50_ms": s["itl_p50_ms"],
                "ttft_p50_ms": s["ttft_p50_ms"],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=18791)
    parser.add_argument("--itl-ms", type=float, default=10.0, help="the stand-in's token gap")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=float, default=0.0, help="open loop req/s (0: closed)")
    parser.add_argument("--input-len", default="32")
    parser.add_argument("--output-len", default="256")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(args)
        return
    server = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "standin_server.py"),
            "--port",
            str(args.port),
            "--itl-ms",
            str(args.itl_ms),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "standin serving at ..."
        for _ in range(args.repeats):
            for loop in args.loops.split(","):
                runs.setdefault(loop, []).append(_one(args, loop))
    finally:
        server.terminate()
        server.wait(10)
    _print(args, runs)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))


def _one(args: argparse.Namespace, loop: str) -> dict[str, float]:
    argv = [sys.executable, __file__, "--client", "--loop", loop]
    for flag in ("port", "concurrency", "rate", "input_len", "output_len", "seconds"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    sys.stderr.write(f"{loop}: {figures}\n")
    return figures


def _print(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    mode = f"Poisson {args.rate:g} req/s" if args.rate else f"{args.concurrency} streams"
    print(
        f"{mode}, prompts {args.input_len} B, outputs {args.output_len} tokens, stand-in token"
        f" gap {args.itl_ms:g} ms, {args.seconds:g} s per run, min / median / max of"
        f" {args.repeats}:\n"
    )
    print("| loop | CPU µs per token | tokens/s | CPU µs per request | ITL p50 ms |")
    print("|---|---:|---:|---:|---:|")
    for loop, figures in runs.items():
        print(
            f"| {loop} | {_spread(figures, 'us_per_token', '.1f')} | "
            f"{_spread(figures, 'tokens_per_s', ',.0f')} | "
            f"{_spread(figures, 'us_per_request', ',.0f')} | "
            f"{statistics.median(f['itl_p50_ms'] for f in figures):.2f} |"
        )


def _spread(figures: list[dict[str, float]], key: str, fmt: str) -> str:
    values = sorted(f[key] for f in figures)
    return " / ".join(format(v, fmt) for v in (values[0], statistics.median(values), values[-1]))


if __name__ == "__main__":
    main()
