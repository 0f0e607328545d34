"""Does one vCPU's work slow the other's? The same TinyLM step, timed in thread CPU seconds.

This process is pinned to CPU 0 and times, in its own thread's CPU time (so waiting for a
core does not count), TinyLM's decode step of 8 sequences called directly (median of 60) and
a pure-Python loop (best of 5), while CPU 1 is (a) left alone, (b) running a pure-Python spin
loop, (c) running float64 matrix products of 512 x 512 (2 MiB operands: the caches and the
memory bus). Conditions alternate, ``--rounds`` times. Equal figures: the two vCPUs do not
share a core's execution units or caches; higher ones under (b) or (c): what the other vCPU
runs (another process, or the runner's own loop thread) changes a step's CPU cost, a property
of the machine (SMT siblings or shared caches on the host), not of labserve.

    nice -n 10 .venv/bin/python benchmarks/generation/core_interference.py --rounds 3
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

from step_drift import decode8_times

from labserve.lab.demo import TinyLM

NEIGHBOURS = {
    "idle": None,
    "python spin": "while True: pass",
    "numpy matmul": (
        "import numpy as np\na = np.random.rand(512, 512)\nwhile True: a @ a"  # 2 MiB operands
    ),
}


def _neighbour(code: str) -> subprocess.Popen[bytes]:
    """``code`` in a child pinned to CPU 1 (OpenBLAS on one thread)."""
    pinned = f"import os\nos.sched_setaffinity(0, {{1}})\n{code}"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-c", pinned], env=env)


def _waits() -> tuple[float, float, float]:
    """Wall clock, this thread's wait for a core, and the machine's steal, in seconds."""
    with open("/proc/thread-self/schedstat") as f:
        delay = int(f.read().split()[1]) / 1e9
    with open("/proc/stat") as f:
        steal = int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
    return time.monotonic(), delay, steal


def _measure(lm: TinyLM) -> dict[str, float]:
    """TinyLM's decode of 8 sequences (median thread CPU of 60) and a Python loop (best of 5),
    with the share of the time this thread waited for its core (another process had it) and
    the machine's steal (its vCPUs' time the hypervisor gave to others), over the wall."""
    wall0, delay0, steal0 = _waits()
    _, cpus, loops = decode8_times(lm)
    wall1, delay1, steal1 = _waits()
    return {
        "decode8_cpu_ms": statistics.median(cpus) * 1e3,
        "python_loop_ms": min(loops) * 1e3,
        "waited_share": (delay1 - delay0) / (wall1 - wall0),
        "steal_share": (steal1 - steal0) / (wall1 - wall0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    lm = TinyLM()
    _measure(lm)  # warm: the weights, the arena
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in NEIGHBOURS}
    for _ in range(args.rounds):
        for name, code in NEIGHBOURS.items():
            child = _neighbour(code) if code else None
            try:
                time.sleep(0.5)  # the neighbour is running
                got = _measure(lm) | {"loadavg": os.getloadavg()[0]}
            finally:
                if child is not None:
                    child.terminate()
                    child.wait()
            rows[name].append(got)
            print(
                f"{name:>13}: decode8 {got['decode8_cpu_ms']:.3f} ms CPU, Python loop "
                f"{got['python_loop_ms']:.1f} ms CPU; waited {got['waited_share']:.2f}, steal "
                f"{got['steal_share']:.2f} (load {got['loadavg']:.2f})",
                flush=True,
            )
    for name, got in rows.items():
        print(
            f"{name:>13}: median decode8 "
            f"{statistics.median(g['decode8_cpu_ms'] for g in got):.3f} ms, loop "
            f"{statistics.median(g['python_loop_ms'] for g in got):.1f} ms"
        )
    if args.out:
        report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
