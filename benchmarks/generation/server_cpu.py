"""The server's own CPU per streamed token, over a fixed amount of work: TinyLM over HTTP.

``labserve serve labserve.lab.demo:TinyLM`` (defaults: 32 sequences, 512 tokens a step) in a
process of its own, importing the labserve of the directory it runs from; this process is
the client, on the standard library alone: --streams threads, each streaming --requests
greedy completions in turn (a prompt of 32 bytes, 256 tokens, ``ignore_eos``). Recorded: the
server process's CPU time (user + system, from /proc) from the first send to the last token
over the tokens streamed, and the tokens/s of that span. Every run does the same work, so
the CPU per token does not move with how much of the machine the server got, as tokens/s
does on a shared machine (and a timed run's tokens come in waves of 32 x 256, which a fixed
count avoids).

    .venv/bin/python benchmarks/generation/server_cpu.py --rounds 3
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tinylm_server import process_cpu_s, tinylm_process  # this folder's (on sys.path)

BODY = {
    "model": "tinylm",
    "prompt": "abcdefgh" * 4,
    "max_tokens": 256,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}


def one_run(streams: int, requests: int) -> dict[str, Any]:
    """A fresh server and the fixed work against it."""
    with tinylm_process() as (base, pid):
        port = int(base.rsplit(":", 1)[1])
        _stream(port, {**BODY, "max_tokens": 8})  # start-up outside the measure
        load = os.getloadavg()[0]
        counts: list[int] = []

        def caller() -> None:
            counts.extend(_stream(port, BODY) for _ in range(requests))

        threads = [threading.Thread(target=caller) for _ in range(streams)]
        cpu0, wall0 = process_cpu_s(pid), time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu, wall = process_cpu_s(pid) - cpu0, time.perf_counter() - wall0
    tokens = streams * requests * BODY["max_tokens"]
    if len(counts) != streams * requests or min(counts) < BODY["max_tokens"]:
        sys.exit(f"a stream brought fewer than {BODY['max_tokens']} events: {sorted(counts)[:5]}")
    return {
        "load_before": load,
        "server_cpu_s": cpu,
        "wall_s": wall,
        "tokens": tokens,
        "server_us_per_token": 1e6 * cpu / tokens,
        "tokens_per_s": tokens / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--requests", type=int, default=3, help="per stream, one after another")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = []
    for _ in range(args.rounds):
        runs.append(one_run(args.streams, args.requests))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    for key in ("server_us_per_token", "tokens_per_s"):
        print(f"{key}: median {statistics.median(r[key] for r in runs):,.1f}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")


def _stream(port: int, body: dict[str, Any]) -> int:
    """One streamed completion; the number of its JSON events (its tokens, then the last)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), _JSON)
        reply = conn.getresponse()
        if reply.status != 200:
            sys.exit(f"status {reply.status}: {reply.read()[:300]!r}")
        return sum(1 for line in iter(reply.readline, b"") if line.startswith(b"data: {"))
    finally:
        conn.close()


_JSON = {"Content-Type": "application/json"}


if __name__ == "__main__":
    main()
