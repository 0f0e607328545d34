"""Goodput of TinyLM over HTTP at 1.2x its default settings' capacity: defaults against tuned.

Issue 23's target: TTFT p99 within 300 ms and TPOT p99 within 30 ms, Poisson load at 1.2x the
default settings' capacity for 60 s; the settings found in lesson 10 (``max_num_seqs=256``)
give at least 1.5x the defaults' goodput. The capacity is measured live first (closed loop,
enough streams to keep 32 sequences running, output tokens/s over the run / 128 tokens per
request), then each setting gets the same seeded Poisson trace through ``labserve serve`` in
another process, alternating.

    .venv/bin/python benchmarks/generation/goodput.py --seconds 60 --rounds 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tinylm_server import tinylm_server  # this folder's (the script's folder is on sys.path)

import labserve

WORK = {"input_len": 32, "output_len": 128}
GOODPUT = "ttft:300 tpot:30"
TUNED = {"max_num_seqs": 256}
TOKEN = "goodput-bench"


@contextlib.contextmanager
def serving(config: dict[str, int]) -> Iterator[str]:
    """TinyLM served with ``config`` changed live (PATCH /config); yields its completions URL."""
    with tinylm_server(token=TOKEN) as base:
        if config:
            body = json.dumps({"tinylm": {"generate": config}}).encode()
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
            req = urllib.request.Request(f"{base}/config", body, headers, method="PATCH")
            urllib.request.urlopen(req, timeout=10).read()
        yield f"{base}/v1/completions"


def run(url: str, seconds: float, **load: object) -> dict[str, float]:
    result = labserve.load_test(url, duration_s=seconds, goodput=GOODPUT, **WORK, **load)
    s = result.summary()
    p = {m: result.percentiles_ms(m) for m in ("ttft", "tpot")}
    return {
        "goodput_rps": result.goodput_rps(),
        "served_rps": s["served_rps"],
        "output_tokens_per_s": s["output_tokens_per_s"],
        "ttft_p99_ms": p["ttft"]["p99"],
        "tpot_p99_ms": p["tpot"]["p99"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with serving({}) as url:
        cap = run(url, min(args.seconds, 20.0), concurrency=48)
    capacity = cap["output_tokens_per_s"] / WORK["output_len"]
    rate = 1.2 * capacity
    print(
        f"capacity at the defaults {capacity:.1f} req/s (load {os.getloadavg()[0]:.1f}); "
        f"offering {rate:.1f} req/s",
        flush=True,
    )
    rows = []
    for r in range(args.rounds):
        for name, config in (("defaults", {}), ("tuned", TUNED)):
            with serving(config) as url:
                got = run(url, args.seconds, arrivals=labserve.arrivals("poisson", rate_rps=rate))
            got.update(setting=name, round=r, load=os.getloadavg()[0])
            rows.append(got)
            print(
                f"{name:>8}: goodput {got['goodput_rps']:.2f} req/s, served "
                f"{got['served_rps']:.1f}, TTFT p99 {got['ttft_p99_ms']:.0f} ms, TPOT p99 "
                f"{got['tpot_p99_ms']:.1f} ms (load {got['load']:.1f})",
                flush=True,
            )
    d = [x["goodput_rps"] for x in rows if x["setting"] == "defaults"]
    t = [x["goodput_rps"] for x in rows if x["setting"] == "tuned"]
    print(f"tuned / defaults goodput: {sum(t) / max(sum(d), 1e-9):.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"capacity_rps": capacity, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
