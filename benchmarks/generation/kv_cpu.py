"""TinyLM's CPU per output token on paged KV: over HTTP, and in process at issue 33 (c).

Two measures, each in CPU seconds (the process's own work, which other engineers' load on
this 2-core machine barely moves), trees alternating round by round:

- ``http``: ``labserve serve labserve.lab.demo:TinyLM`` from each tree in its own process,
  loaded by this tree's generation load generator: 64 streams, 32-token prompts, 256
  output tokens (closed loop, ``--seconds``), after 3 s of the same load uncounted. The
  figure is the server process's CPU (``/proc``) over the output tokens streamed.
- ``c``: issue 33 (c) in a fresh process of each tree: 32 fresh 256-token sessions at once,
  32 output tokens each, ``--bursts`` bursts alternating caching on and off (on first in
  rounds 0, 2, ...); per burst the process's CPU over its output tokens, its tokens/s and
  its minor page faults (``getrusage``). The process's first ``--warmup`` bursts are
  reported apart (a fresh process's warm-up).

    .venv/bin/python benchmarks/generation/kv_cpu.py --trees /tmp/kv/b3229 /tmp/kv/base . \\
        --measures http --rounds 3 --json benchmarks/generation/kv_cpu_http.json
    .venv/bin/python benchmarks/generation/kv_cpu.py --trees /tmp/kv/base . --measures c \\
        --rounds 2 --bursts 24 --warmup 8 --json benchmarks/generation/kv_cpu_c.json
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
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tinylm_server import process_cpu_s, tinylm_process  # noqa: E402  (this folder's)


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}


def http(tree: Path, seconds: float) -> dict[str, float]:
    """Server CPU per output token of 64 streams x 256 tokens against ``tree``'s server."""
    import labserve

    with tinylm_process(tree=tree) as (base, pid):
        url = f"{base}/v1/completions"
        load = {"concurrency": 64, "input_len": 32, "output_len": 256}
        labserve.load_test(url, duration_s=3.0, **load)  # warm: not counted
        cpu = process_cpu_s(pid)
        summary = labserve.load_test(url, duration_s=seconds, **load).summary()
        cpu = process_cpu_s(pid) - cpu
    tokens = summary["output_tokens"]
    return {
        "server_cpu_us_per_token": cpu / tokens * 1e6,
        "tokens_per_s": summary["output_tokens_per_s"],
        "output_tokens": tokens,
    }


def c_bursts(bursts: int, on_first: bool) -> list[dict[str, Any]]:
    """Issue 33 (c) in this process: per burst, caching, CPU us per token, tokens/s."""
    import resource

    import labserve
    from labserve.lab.demo import TinyLM

    lm = labserve.Runner(TinyLM, name="lm")
    rows = []
    try:
        for k in range(bursts):
            caching = (k % 2 == 0) == on_first
            lm.configure("generate", enable_prefix_caching=caching)
            fresh = labserve.SharedPrefixWorkload(
                prefix_len=0, input_len=256, output_len=32, seed=10_000 + k
            )
            cpu, wall = time.process_time(), time.perf_counter()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            load = labserve.start_workload_load(
                lm.generate,
                fresh,
                arrivals=labserve.arrivals("trace", timestamps=[0.0] * 32),
                duration_s=1.0,
            )
            served = [r for r in load.result(timeout=600) if r.outcome == "served"]
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            tokens = sum(len(r.reply) for r in served)
            rows.append(
                {
                    "caching": caching,
                    "cpu_us_per_token": cpu / tokens * 1e6,
                    "tokens_per_s": tokens / wall,
                    "page_faults": faults,
                }
            )
    finally:
        lm.stop()
    return rows


def c(tree: Path, bursts: int, on_first: bool) -> list[dict[str, Any]]:
    """:func:`c_bursts` in a fresh process of ``tree``."""
    argv = [sys.executable, str(HERE / "kv_cpu.py"), "--child-c", str(bursts)]
    argv += ["--on-first"] if on_first else []
    done = subprocess.run(
        argv, env=_env(tree), cwd=tree, capture_output=True, text=True, check=True
    )
    return list(json.loads(done.stdout.splitlines()[-1]))


def summarize_c(rows: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Medians after the warm-up, on and off, and the warm-up's own bursts."""
    after = rows[warmup:]

    def med(key: str, caching: bool) -> float:
        return statistics.median(r[key] for r in after if r["caching"] == caching)

    return {
        "warmup_tokens_per_s": [round(r["tokens_per_s"]) for r in rows[:warmup]],
        "warmup_cpu_us_per_token": [round(r["cpu_us_per_token"]) for r in rows[:warmup]],
        "warmup_page_faults": [r["page_faults"] for r in rows[:warmup]],
        "on_page_faults": med("page_faults", True),
        "off_page_faults": med("page_faults", False),
        "on_cpu_us_per_token": med("cpu_us_per_token", True),
        "off_cpu_us_per_token": med("cpu_us_per_token", False),
        "on_tokens_per_s": med("tokens_per_s", True),
        "off_tokens_per_s": med("tokens_per_s", False),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path(".")])
    parser.add_argument("--measures", default="http,c")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="http: counted seconds")
    parser.add_argument("--bursts", type=int, default=24, help="c: bursts per process")
    parser.add_argument("--warmup", type=int, default=8, help="c: bursts reported apart")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child-c", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--on-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_c:
        print(json.dumps(c_bursts(args.child_c, args.on_first)))
        return
    runs: list[dict[str, Any]] = []
    measures = args.measures.split(",")
    for r in range(args.rounds):
        trees = args.trees if r % 2 == 0 else args.trees[::-1]
        for tree in trees:
            row: dict[str, Any] = {"round": r, "tree": str(tree), "load": os.getloadavg()[0]}
            if "http" in measures:
                row["http"] = http(tree.resolve(), args.seconds)
            if "c" in measures:
                bursts = c(tree.resolve(), args.bursts, on_first=r % 2 == 0)
                row["c"] = summarize_c(bursts, args.warmup)
            print(json.dumps(row), flush=True)
            runs.append(row)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
