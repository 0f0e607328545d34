"""Output tokens/s of TinyLM through Ray Serve's proxy (one replica) against the kernel server.

Issue 34's target: through the proxy, one replica, at least 0.8x the kernel server's output
tokens/s at the same load: the proxy's per-chunk cost (each SSE event crosses the replica,
Serve's streaming protocol and the proxy). Both servers are ``labserve serve
labserve.lab.demo:TinyLM`` in their own process (one with ``--ray --replicas 1`` and its own
local Ray), both up for the whole run so each round sees the same background; rounds
alternate, and each drives one server with labserve's generation load generator (closed
loop, streaming, prompts of 32 bytes, ``ignore_eos`` outputs). A figure is output tokens
over the run's span, as the load generator's summary counts it.

    .venv/bin/python benchmarks/generation/ray_proxy.py --rounds 3 --seconds 20 --streams 16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import labserve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(*extra: str, attempts: int = 1) -> Iterator[str]:
    """``labserve serve labserve.lab.demo:TinyLM [extra]`` until the block ends (Ctrl-C).

    ``attempts``: starts tried. Ray's driver waits a fixed 30 s for its raylet, which waits
    for its metrics agent: at load 10-15 on these two cores most local starts failed so
    (2026-12-04, 16:00 UTC), and a later one got through.
    """
    for attempt in range(attempts):
        started = False
        try:
            with _served(*extra) as base:
                started = True
                yield base
                return
        except RuntimeError as exc:
            if started:  # the measure's own error, not the start's
                raise
            print(f"start {attempt + 1} of {attempts} failed: {exc}", flush=True)
    raise RuntimeError(f"labserve serve {' '.join(extra)} did not start in {attempts} tries")


@contextlib.contextmanager
def _served(*extra: str) -> Iterator[str]:
    port = _free_port()
    argv = [sys.executable, "-m", "labserve.cli", "serve", "labserve.lab.demo:TinyLM"]
    argv += ["--port", str(port), *extra]
    server = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # "serving tinylm ...": it listens
        if "serving" not in line:
            raise RuntimeError(f"{' '.join(argv)} did not start: {line!r}")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.send_signal(signal.SIGINT)  # as a user's Ctrl-C: Ray's processes go too
        server.wait(120)


def tokens_per_s(base: str, seconds: float, streams: int, output: int) -> dict[str, float]:
    result = labserve.load_test(
        f"{base}/v1/completions",
        duration_s=seconds,
        concurrency=streams,
        input_len=32,
        output_len=output,
    )
    s = result.summary()
    return {k: float(s[k]) for k in ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms") if k in s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with served() as kernel, served("--ray", "--replicas", "1", attempts=6) as ray:
        tokens_per_s(kernel, 3, args.streams, args.output)  # warm both outside the measure
        tokens_per_s(ray, 3, args.streams, args.output)
        for r in range(args.rounds):
            load = os.getloadavg()[0]
            here = tokens_per_s(kernel, args.seconds, args.streams, args.output)
            proxy = tokens_per_s(ray, args.seconds, args.streams, args.output)
            ratio = proxy["output_tokens_per_s"] / here["output_tokens_per_s"]
            rows.append({"round": r, "kernel": here, "ray": proxy, "ratio": ratio, "load": load})
            print(
                f"round {r}: kernel {here['output_tokens_per_s']:,.0f} tokens/s, through Ray's "
                f"proxy {proxy['output_tokens_per_s']:,.0f}, ratio {ratio:.2f} (load {load:.1f})",
                flush=True,
            )
            time.sleep(1)
    ratios = sorted(row["ratio"] for row in rows)
    print(f"median ratio {ratios[len(ratios) // 2]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
