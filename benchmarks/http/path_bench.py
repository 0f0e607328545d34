"""The server's request path, side by side: event loop (asyncio, uvloop) and JSON (stdlib, orjson).

wrk -t1 -c64 against `labserve.serve` (the sleep model 2 ms + 0.1 ms x items, cap 64), one
row per POST, on the simple route (`/runners/m/predict`) and the v2 route with JSON tensors
(`/v2/models/m/infer`). Each configuration is a server process of its own, chosen with
`$LABSERVE_LOOP` and `$LABSERVE_JSON`; `before` runs another tree of labserve (say, the
start commit: `git archive COMMIT | tar -x -C /tmp/before`) given with `--before`. Rounds
alternate the configurations, so that the machine's load falls on each alike.

Per run: wrk's req/s and p99, and the server process's CPU time per request (from
/proc/PID/stat: steadier than req/s on a shared machine). Run from the repository root:

    .venv/bin/python benchmarks/http/path_bench.py --rounds 3 --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import wrkrun  # this folder's wrk runner (the script's folder is on sys.path)

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
PORT = 18779
ROUTES = {
    "simple": ("/runners/m/predict", "post.lua"),
    "v2": ("/v2/models/m/infer", "post_v2.lua"),
}
# name: (tree, $LABSERVE_LOOP, $LABSERVE_JSON); "before" takes its tree from --before.
CONFIGS = {
    "before": (None, "asyncio", "stdlib"),
    "asyncio+json": (ROOT, "asyncio", "stdlib"),
    "uvloop+json": (ROOT, "uvloop", "stdlib"),
    "asyncio+orjson": (ROOT, "asyncio", "orjson"),
    "uvloop+orjson": (ROOT, "uvloop", "orjson"),
}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wrk(path: str, script: str, seconds: int, connections: int = 64) -> dict[str, Any]:
    url = f"http://127.0.0.1:{PORT}{path}"
    result = wrkrun.run(url, seconds=seconds, connections=connections, script=script)
    return {k: result[k] for k in ("rps", "requests", "p99_ms", "non_2xx")}


def mean_batch() -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/stats", timeout=10) as reply:
        value = json.loads(reply.read())["m"]["predict"]["mean_batch_size"]
    return None if value is None else round(float(value), 1)


def run_config(name: str, tree: Path, loop: str, codec: str, seconds: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "LABSERVE_LOOP": loop, "LABSERVE_JSON": codec}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "servers.py"), "labserve", str(PORT), "sleep"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    rows: dict[str, Any] = {"config": name, "load": os.getloadavg()[0]}
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        wrk(ROUTES["simple"][0], ROUTES["simple"][1], 2, connections=8)  # warm-up
        for route, (path, script) in ROUTES.items():
            before = cpu_s(proc.pid)
            row = wrk(path, script, seconds)
            used = cpu_s(proc.pid) - before
            row["cpu_us_per_request"] = round(used / max(row["requests"], 1) * 1e6, 1)
            row["mean_batch"] = mean_batch()
            rows[route] = row
            print(f"{name:16s} {route:6s} {json.dumps(row)}", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
        time.sleep(0.5)
    return rows


def summary(results: list[dict[str, Any]], configs: list[str]) -> str:
    def spread(values: list[float], fmt: str) -> str:
        return (
            f"{format(statistics.median(values), fmt)} "
            f"[{format(min(values), fmt)}-{format(max(values), fmt)}]"
        )

    lines = [
        "| server | route | req/s, median [min-max] | p99 ms | server CPU µs/request "
        "| mean batch | non-2xx |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in configs:
        for route in ROUTES:
            rows = [r[route] for r in results if r["config"] == name and route in r]
            if not rows:
                continue
            lines.append(
                f"| {name} | {route} | {spread([r['rps'] for r in rows], ',.0f')} "
                f"| {spread([r['p99_ms'] for r in rows if r['p99_ms']], '.1f')} "
                f"| {spread([r['cpu_us_per_request'] for r in rows], '.0f')} "
                f"| {spread([r['mean_batch'] or 0.0 for r in rows], '.1f')} "
                f"| {sum(r['non_2xx'] for r in rows)} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--configs", default=",".join(CONFIGS), type=lambda s: s.split(","))
    parser.add_argument("--before", type=Path, help="a labserve tree to run as `before`")
    parser.add_argument("--json", default=str(HERE / "path_results.json"))
    args = parser.parse_args()
    configs = [c for c in args.configs if c != "before" or args.before]
    results = []
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    for i in range(args.rounds):
        # Rotate the order each round: no configuration always runs first (or last).
        order = configs[i % len(configs) :] + configs[: i % len(configs)]
        for name in order:
            tree, loop, codec = CONFIGS[name]
            results.append(run_config(name, tree or args.before, loop, codec, args.seconds))
    table = summary(results, configs)
    print(table)
    Path(args.json).write_text(
        json.dumps({"started_utc": started, "seconds": args.seconds, "results": results}, indent=1)
    )


if __name__ == "__main__":
    main()
