"""Why a live TinyLM step's cost moves with the rate and between processes (issue 35).

Each trial is a FRESH process (a subprocess): TinyLM in process (``labserve.Runner``, as
``fidelity.py`` builds it, OpenBLAS on one thread), 64 closed-loop streams first (tokens/s
and CPU per token), then Poisson at 25%, 50% and 80% of one capacity (measured once, in a
process of its own, before the trials), each ``--seconds`` of arrivals. The model's step is
wrapped in a probe that records, per call, on the thread that runs it: when it began and
ended (``time.monotonic``, the runner's clock), its thread CPU time, the time it spent
runnable but waiting for a core (``/proc/thread-self/schedstat``), its minor page faults
(``getrusage(RUSAGE_THREAD)``) and which thread ran it. Each recorded step
(``stats().steps``) is matched to its probe, and a chained step's span (start to the next
step's start) is split into:

- ``wake``: from the step's planning on the loop to the model call starting in a worker
  (the hand-off to a pool thread and its wake-up);
- ``model``: the model call (its CPU, its wait for a core, and the rest: waiting for the GIL);
- ``after``: sampling and detokenising in the worker, the hop back to the loop, the loop's
  completion and the next plan.

Figures are medians over decode-only steps binned by sequences (1, 2-4, 5-8, 9-16, 17-32).
``--variants`` names source trees to compare (``name=path``, the path put first on the
child's ``PYTHONPATH``; ``.``: this checkout): each trial runs every variant, in an order
that alternates from trial to trial.

    nice -n 10 .venv/bin/python benchmarks/generation/step_drift.py --trials 4 \\
        --variants main=/tmp/ls35-main,thread35=. --out benchmarks/generation/step_drift.json
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LOADS = (0.25, 0.50, 0.80)
Probe = tuple[float, float, float, float, int, str, int]
"""A model call: start, end (s), thread CPU (s), wait for a core (s), minor faults, thread,
the CPU it started on."""
BINS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32))
OUTPUT = 128


def _run_delay_s() -> float:
    """This thread's time runnable but waiting for a core, in seconds (Linux schedstat)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _steal_s() -> float:
    """CPU time the hypervisor gave the machine's vCPUs to others, in seconds (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _core() -> int:
    """The CPU this thread runs on now (field 39 of /proc/thread-self/stat; -1 if unknown)."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def decode8_times(lm: Any) -> tuple[list[float], list[float], list[float]]:
    """TinyLM's decode step of 8 sequences called directly on this thread, 60 times (wall and
    thread CPU seconds of each), and a pure-Python loop 5 times (thread CPU seconds)."""
    from labserve.generation.batch import SeqBatch

    ids = tuple(range(1, 9))
    prompt = np.arange(32, dtype=np.int64) % 90 + 32
    lm.generate(SeqBatch(ids, tuple(prompt for _ in ids), (0,) * 8, (True,) * 8))
    walls, cpus = [], []
    for pos in range(32, 92):
        batch = SeqBatch(ids, tuple(np.array([65]) for _ in ids), (pos,) * 8, (True,) * 8)
        t0, c0 = time.perf_counter(), time.thread_time()
        lm.generate(batch)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    lm.free_sequences(ids)
    loops = []
    for _ in range(5):
        c0 = time.thread_time()
        sum(range(1_000_000))
        loops.append(time.thread_time() - c0)
    return walls, cpus, loops


def _machine() -> dict[str, float]:
    """The machine's speed now, without labserve's runtime: TinyLM's decode step of 8
    sequences called directly on this thread (median of 60), and a pure-Python loop."""
    from labserve.lab.demo import TinyLM

    walls, cpus, loops = decode8_times(TinyLM())
    return {
        "decode8_wall_ms": statistics.median(walls) * 1e3,
        "decode8_cpu_ms": statistics.median(cpus) * 1e3,
        "python_loop_ms": min(loops) * 1e3,
    }


def _child(capacity_only: bool, req_per_s: float, seconds: float, seed: int) -> dict[str, Any]:
    """One fresh process's trial: 64 streams, then 25/50/80% of ``req_per_s``."""
    import fidelity

    import labserve
    from labserve.lab.demo import TinyLM

    probes: list[Probe] = []

    class Probed(TinyLM):  # type: ignore[misc]
        @labserve.method(generative=True, max_num_seqs=32, max_num_batched_tokens=512)
        def generate(self, batch: Any) -> Any:
            f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            core = _core()
            d0, c0, t0 = _run_delay_s(), time.thread_time(), time.monotonic()
            out = TinyLM.generate(self, batch)
            t1, c1, d1 = time.monotonic(), time.thread_time(), _run_delay_s()
            f1 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            name = threading.current_thread().name
            probes.append((t0, t1, c1 - c0, d1 - d0, f1 - f0, name, core))
            return out

    result: dict[str, Any] = {"labserve": labserve.__file__, "pid": os.getpid()}
    result["machine_before"] = _machine()
    runner = labserve.Runner(Probed, name="tinylm")
    try:
        runner.generate.run("warm up", max_tokens=4)
        cpu0, wall0 = time.process_time(), time.monotonic()
        cap = fidelity.capacity(runner, OUTPUT, seconds)
        tokens = cap["tokens_per_s"] * (time.monotonic() - wall0)
        result["streams64"] = {
            **cap,
            "cpu_ms_per_token": (time.process_time() - cpu0) * 1e3 / tokens,
            "loadavg": os.getloadavg()[0],
        }
        if capacity_only:
            return result
        rates = {}
        for load in LOADS:
            del probes[:]
            offsets = fidelity.trace(load * req_per_s, seconds, seed)
            flt0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            steal0, wall0 = _steal_s(), time.monotonic()
            got = fidelity.live(runner, offsets, OUTPUT)
            steal = (_steal_s() - steal0) / (time.monotonic() - wall0)
            flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt0
            rates[f"{load:.2f}"] = {
                "rate": load * req_per_s,
                "loadavg": got["loadavg"],
                "cpu_share": got["cpu_share"],
                "waited_share": got["waited_share"],
                "process_minflt": flt,
                "steal_share": steal,  # of one vCPU: stolen by the hypervisor
                "itl_p50_ms": got["figures"]["itl"]["p50"],
                "tpot_p50_ms": got["figures"]["tpot"]["p50"],
                **_steps(got["snapshot"].steps, probes),
            }
        result["rates"] = rates
        result["threads_alive"] = threading.active_count()
    finally:
        runner.stop()
    result["machine_after"] = _machine()
    return result


def _steps(steps: Any, probes: list[Probe]) -> dict:
    """Each chained decode-only step matched to its probe, split, and binned by size."""
    p_start = np.array([p[0] for p in probes])
    n = len(steps)
    rows = []
    threads_seen: list[str] = []
    # How many steps ran back to back before each one since the method was last idle: a
    # step at a low rate is more often one of the first after the core did something else.
    in_run = np.zeros(n, np.int64)
    for i in range(1, n):
        in_run[i] = in_run[i - 1] + 1 if steps.chained[i - 1] else 0
    by_run: dict[str, list[float]] = {"0": [], "1-3": [], "4-15": [], "16+": []}
    for i in range(n - 1):
        if not steps.chained[i] or steps.num_prefill_tokens[i] > 0:
            continue
        k = int(np.searchsorted(p_start, steps.start_s[i]))
        if k >= len(probes) or probes[k][0] > steps.end_s[i]:
            continue  # its probe fell out (recorder window) or did not run
        t0, t1, cpu, delay, flt, thread, core = probes[k]
        if 2 <= steps.num_seqs[i] <= 8:
            r = int(in_run[i])
            by_run["0" if r == 0 else "1-3" if r <= 3 else "4-15" if r <= 15 else "16+"].append(cpu)
        switched = k > 0 and probes[k - 1][5] != thread  # the model call before it
        moved_core = k > 0 and probes[k - 1][6] != core
        rows.append(
            (
                int(steps.num_seqs[i]),
                steps.start_s[i + 1] - steps.start_s[i],
                t0 - steps.start_s[i],
                t1 - t0,
                cpu,
                delay,
                steps.start_s[i + 1] - t1,
                flt,
                thread,
                switched,
                moved_core,
            )
        )
        threads_seen.append(thread)
    by_bin: dict[str, Any] = {}
    for lo, hi in BINS:
        sel = [r for r in rows if lo <= r[0] <= hi]
        if len(sel) < 5:
            continue

        def med(j: int, sel: list[tuple[Any, ...]] = sel) -> float:
            return round(statistics.median(r[j] for r in sel) * 1e3, 4) if sel else float("nan")

        moved = [r for r in sel if r[9]]
        stayed = [r for r in sel if not r[9]]
        other_core = [r for r in sel if r[10]]
        same_core = [r for r in sel if not r[10]]

        by_bin[f"{lo}-{hi}"] = {
            "steps": len(sel),
            "span_ms": med(1),
            "wake_ms": med(2),
            "model_ms": med(3),
            "model_cpu_ms": med(4),
            "model_run_delay_ms": med(5),
            "after_ms": med(6),
            "minflt_mean": round(statistics.fmean(r[7] for r in sel), 1),
            "threads": len({r[8] for r in sel}),
            # The span when the step ran on another thread than the step before, and not.
            "thread_switches": len(moved),
            "span_ms_switched": med(1, moved),
            "span_ms_same_thread": med(1, stayed),
            "model_cpu_ms_switched": med(4, moved),
            "model_cpu_ms_same_thread": med(4, stayed),
            # The same split by the core the model call started on.
            "core_moves": len(other_core),
            "span_ms_core_moved": med(1, other_core),
            "span_ms_same_core": med(1, same_core),
            "model_cpu_ms_core_moved": med(4, other_core),
            "model_cpu_ms_same_core": med(4, same_core),
        }
    return {
        "steps": n,
        "decode_steps_matched": len(rows),
        "step_threads": len(set(threads_seen)),
        "thread_names": sorted(set(threads_seen)),
        "minflt_per_step": round(statistics.fmean(r[7] for r in rows), 1) if rows else 0.0,
        "bins": by_bin,
        # Decodes of 2-8 sequences: the model's CPU by the step's place in its run of steps.
        "cpu_ms_by_place_in_run": {
            key: [len(v), round(statistics.median(v) * 1e3, 4) if v else float("nan")]
            for key, v in by_run.items()
        },
    }


def _spawn(path: str, argv: list[str]) -> dict[str, Any]:
    """Run this script as a child on the labserve at ``path``; its JSON result."""
    env = dict(os.environ)
    src = str((ROOT if path == "." else pathlib.Path(path)).resolve())
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, __file__, "--child", *argv],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=str(HERE),
    )
    if out.returncode != 0:  # reported and left out, so that one lost run keeps the others
        print(f"a trial on {path} failed:\n{out.stderr[-2000:]}", flush=True)
        return {}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _summary(trials: list[dict[str, Any]], names: list[str]) -> None:
    """Per variant, load and bin: the span's median over processes and its range."""
    for name in names:
        runs = [t[name] for t in trials]
        print(f"\n== {name}: 64 streams, tokens/s and CPU ms/token per process")
        print(
            "   "
            + ", ".join(
                f"{r['streams64']['tokens_per_s']:.0f} ({r['streams64']['cpu_ms_per_token']:.3f})"
                for r in runs
            )
        )
        for load in (f"{x:.2f}" for x in LOADS):
            at = [r["rates"][load] for r in runs]
            shares = " ".join(f"{a['waited_share']:.2f}/{a.get('steal_share', 0):.2f}" for a in at)
            print(
                f"-- {name} at {float(load):.0%}: span ms by sequences [per process] (parts); "
                f"waited for a core / stolen, per process: {shares}"
            )
            for lo, hi in BINS:
                key = f"{lo}-{hi}"
                cells = [r["rates"][load]["bins"].get(key) for r in runs]
                cells = [c for c in cells if c]
                if not cells:
                    continue
                switches = sum(c["thread_switches"] for c in cells)
                core_moves = sum(c["core_moves"] for c in cells)
                total = sum(c["steps"] for c in cells)
                spans = [c["span_ms"] for c in cells]
                parts = " ".join(
                    f"{p}={statistics.median(c[p] for c in cells):.3f}"
                    for p in (
                        "wake_ms",
                        "model_ms",
                        "model_cpu_ms",
                        "model_run_delay_ms",
                        "after_ms",
                        "minflt_mean",
                        "span_ms_switched",
                        "span_ms_same_thread",
                        "model_cpu_ms_switched",
                        "model_cpu_ms_same_thread",
                        "span_ms_core_moved",
                        "span_ms_same_core",
                        "model_cpu_ms_core_moved",
                        "model_cpu_ms_same_core",
                    )
                )
                # Within each process: the span of a step on another thread (core) than the
                # step before over the span of one on the same, in the same minute.
                paired = [
                    f"{tag}{c[a] / c[b]:.2f}"
                    for c in cells
                    for tag, a, b in (
                        ("t", "span_ms_switched", "span_ms_same_thread"),
                        ("c", "span_ms_core_moved", "span_ms_same_core"),
                    )
                    if c[a] == c[a] and c[b] == c[b]  # both measured (not NaN)
                ]
                print(
                    f"   {key:>5}: {statistics.median(spans):.3f} "
                    f"[{' '.join(f'{s:.3f}' for s in spans)}] "
                    f"spread {100 * (max(spans) / min(spans) - 1):.0f}%  {parts} "
                    f"switched={switches}/{total} core_moves={core_moves}/{total} "
                    f"moved/stayed (t: thread, c: core) {' '.join(paired)}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--capacity-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--req-per-s", type=float, default=0.0, help="capacity (0: measure)")
    parser.add_argument("--seconds", type=float, default=6.0, help="arrivals per rate")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trials", type=int, default=4, help="fresh processes per variant")
    parser.add_argument("--variants", default="current=.", help="name=path,...")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.child:
        got = _child(args.capacity_only, args.req_per_s, args.seconds, args.seed)
        print(json.dumps(got, default=float))
        return
    variants = dict(v.split("=", 1) for v in args.variants.split(","))
    names = list(variants)
    common = ["--seconds", str(args.seconds), "--seed", str(args.seed)]
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "loadavg_before": os.getloadavg(),
        "variants": variants,
        "args": vars(args),
    }
    cap = args.req_per_s
    if cap <= 0:
        cap = _spawn(variants[names[0]], [*common, "--capacity-only"])["streams64"][
            "requests_per_s"
        ]
    report["req_per_s"] = cap
    print(f"capacity {cap:.1f} req/s; load {os.getloadavg()[0]:.2f}", flush=True)
    trials = []
    for trial in range(args.trials):
        order = names if trial % 2 == 0 else names[::-1]
        got = {}
        for name in order:
            got[name] = _spawn(variants[name], [*common, "--req-per-s", str(cap)])
            if not got[name]:
                continue
            r = got[name]["rates"]
            print(
                f"trial {trial} {name}: load {os.getloadavg()[0]:.2f}, 64 streams "
                f"{got[name]['streams64']['tokens_per_s']:.0f} tok/s; model alone "
                f"{got[name]['machine_before']['decode8_wall_ms']:.3f}/"
                f"{got[name]['machine_after']['decode8_wall_ms']:.3f} ms, loop "
                f"{got[name]['machine_before']['python_loop_ms']:.1f} ms; ITL p50 "
                + " / ".join(f"{r[k]['itl_p50_ms']:.2f}" for k in r)
                + " ms; step threads "
                + " / ".join(str(r[k]["step_threads"]) for k in r),
                flush=True,
            )
        if len(got) == len(names) and all(got.values()):
            trials.append(got)  # a trial counts only with every variant run in it
        report["trials"] = trials
        if args.out:  # after every trial: a run stopped half way keeps what it measured
            pathlib.Path(args.out).write_text(json.dumps(report, indent=1, default=float) + "\n")
    report["loadavg_after"] = os.getloadavg()
    _summary(trials, names)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
