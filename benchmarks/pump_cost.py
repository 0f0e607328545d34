"""CPU cost of the dashboard's pump thread, in a real kernel with a view displayed.

    .venv/bin/python benchmarks/pump_cost.py [--seconds 20] [--rate 1000]

Starts an ipykernel (jupyter_client), builds the sleep model's runner, displays a Dashboard
(so every tick is serialised and sent as a comm message, as in JupyterLab), runs a Poisson
load, and reads the pump thread's own CPU time (``time.thread_time`` around each tick) at 5
and 10 Hz. Target (issue 5): at most 5% of one core at 10 Hz.
"""

from __future__ import annotations

import argparse
import json
import queue
import time

import jupyter_client

SETUP = """
import json, time, numpy as np, labserve
from labserve.lab.demo import SleepModel
from labserve.widgets import Dashboard
runner = labserve.Runner(SleepModel(a_ms=1.0, b_ms=0.05), name="sleep")
"""

MEASURE = """
dash = Dashboard(runner, example=np.ones((1, 4)), hz={hz})
display(dash)
load = labserve.start_load(runner.predict, example=np.ones((1, 4)), duration_s={seconds} + 5,
                           arrivals=labserve.arrivals("poisson", rate_rps={rate}))
time.sleep(2)  # warm up: the first ticks and the view's creation
cpu0, ticks0, t0 = dash.pump.cpu_s, dash.pump.ticks, time.monotonic()
time.sleep({seconds})
cpu, ticks, wall = dash.pump.cpu_s - cpu0, dash.pump.ticks - ticks0, time.monotonic() - t0
load.stop(); load.result()
dash.close()
print(json.dumps({{"hz": {hz}, "ticks": ticks, "wall_s": wall, "cpu_s": cpu,
                  "core_pct": 100 * cpu / wall, "ms_per_tick": 1000 * cpu / max(ticks, 1),
                  "error": repr(dash.pump.last_error)}}))
"""


def run(kc: jupyter_client.BlockingKernelClient, code: str, timeout: float) -> list[str]:
    """Execute ``code``; return its stdout lines (raises on an error in the kernel)."""
    msg_id = kc.execute(code)
    out: list[str] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "stream" and msg["content"]["name"] == "stdout":
            out += msg["content"]["text"].splitlines()
        elif kind == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            return out
    raise TimeoutError(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    args = parser.parse_args()
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        run(kc, SETUP, 60)
        print("| pump rate | ticks | pump CPU, % of one core | CPU per tick |")
        print("|---:|---:|---:|---:|")
        for hz in (5, 10):
            code = MEASURE.format(hz=hz, seconds=args.seconds, rate=args.rate)
            lines = run(kc, code, args.seconds + 60)
            r = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
            print(
                f"| {hz} Hz | {r['ticks']} | {r['core_pct']:.2f}% | {r['ms_per_tick']:.2f} ms |"
                + ("" if r["error"] == "None" else f" error: {r['error']}")
            )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
