"""HTTP throughput side by side: wrk against bare tornado and labserve; HTTP vs in-process.

Run from the repository root: `.venv/bin/python benchmarks/http/run.py` (needs `wrk`, from
Debian: `apt-get install wrk`). Each server runs in its own process; wrk runs in another.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import wrkrun  # this folder's wrk runner (the script's folder is on sys.path)

HERE = Path(__file__).parent
PORT = 18777
SECONDS = 10
CONNECTIONS = 64


def wrk() -> tuple[float, str]:
    result = wrkrun.run(
        f"http://127.0.0.1:{PORT}/runners/m/predict", seconds=SECONDS, connections=CONNECTIONS
    )
    return result["rps"], wrkrun.replies(result)


def stats_mean_batch() -> float:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/stats", timeout=10) as reply:
        return float(json.loads(reply.read())["m"]["predict"]["mean_batch_size"] or "nan")


def in_process_rps() -> tuple[float, float]:
    import labserve
    from labserve.lab.demo import SleepModel

    runner = labserve.Runner(SleepModel(2.0, 0.1), name="m", max_batch_size=64, max_latency_ms=20)
    x = np.ones((1, 4))
    labserve.load_test(runner.predict, example=x, duration_s=2, concurrency=CONNECTIONS)
    result = labserve.load_test(
        runner.predict, example=x, duration_s=SECONDS, concurrency=CONNECTIONS
    )
    runner.stop()
    return result.summary()["served_rps"], result.summary()["mean_batch"]


def measure(kind: str, model: str | None = None) -> tuple[float, str, float]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "servers.py"), kind, str(PORT), *([model] if model else [])],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        wrkrun.run(f"http://127.0.0.1:{PORT}/runners/m/predict", seconds=2, connections=8)
        rps, status = wrk()
        batch = stats_mean_batch() if kind == "labserve" else float("nan")
        return rps, status, batch
    finally:
        proc.terminate()
        proc.wait(10)
        time.sleep(0.5)


def main() -> None:
    print(f"wrk -t1 -c{CONNECTIONS} -d{SECONDS}s, one JSON row per POST, loopback\n")
    bare_rps, bare_status, _ = measure("bare")
    noop_rps, noop_status, noop_batch = measure("labserve", "noop")
    print("| server | req/s | replies | mean batch |")
    print("|---|---:|---|---:|")
    print(f"| bare tornado (same reply bytes) | {bare_rps:,.0f} | {bare_status} | - |")
    print(
        f"| labserve, no-op batchable model | {noop_rps:,.0f} | {noop_status} | {noop_batch:.1f} |"
    )
    print(f"\nlabserve / bare tornado: {noop_rps / bare_rps:.0%} (target >= 70%)\n")
    http_rps, http_status, http_batch = measure("labserve", "sleep")
    proc_rps, proc_batch = in_process_rps()
    print("| sleep model 2 ms + 0.1 ms x items, 64 callers | req/s | mean batch |")
    print("|---|---:|---:|")
    print(f"| in-process, 64 closed-loop callers | {proc_rps:,.0f} | {proc_batch:.1f} |")
    print(f"| HTTP (wrk), 64 connections ({http_status}) | {http_rps:,.0f} | {http_batch:.1f} |")
    print(f"\nHTTP / in-process: {http_rps / proc_rps:.0%} (target >= 80%)")


if __name__ == "__main__":
    main()
