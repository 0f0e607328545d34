#!/usr/bin/env python3
"""What the 15 ms latency target is fed in a live run, stage by stage, for one tree.

Runs a tree's own ``benchmarks/batching_bench.py`` target15 system (adaptive with a 15 ms
target, cap 64, 20 ms wait, a 2 ms + 0.1 ms an item sleep model in a worker thread) on one
Poisson trace, importing whichever labserve is first on PYTHONPATH, with the queue's calls
wrapped to log: every strategy decision (fit, item rate, budget, the answer), every batch's
fire, release (the cost model's input) and answer times (the budget's feedback), and each
request's admission. Prints, as JSON, the percentiles of each stage of a request's latency
(intended send, launch, call, admission stamp, batch start, model start and end, release,
answer on the loop, done in the caller), of the target's inputs, the garbage collections and
their pauses, and the CPU seconds of the process and of each thread (its own CPU clock). Two
trees' outputs compare stage by stage. The loop is asyncio, the harness's default, unless
``--loop uvloop``. The log keeps every request, so a run holds more long-lived objects than
the harness alone (longer gen-2 pauses): compare trees with it, not its p99 with the
harness's. ``--calls`` counts labserve's Python calls a request by function instead (a
profile hook on every thread, which slows the run: its timings then mean nothing).

    PYTHONPATH=/work/bench-f698 .venv/bin/python scripts/target_live_inputs.py \
        --tree /work/bench-f698 --out old.json
    .venv/bin/python scripts/target_live_inputs.py --tree . --out new.json
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np


class Log:
    """What the wrapped queue calls saw, on the runner's clock (``time.monotonic``)."""

    def __init__(self) -> None:
        self.decisions: list[tuple[Any, ...]] = []
        self.requests: list[tuple[float, Any]] = []  # (made at, the Request)
        self.released: dict[int, tuple[float, float, int, float]] = {}  # id: start, end, n, oldest
        self.answered: dict[int, tuple[float, float]] = {}  # id: answered at, budget after
        self.hold_ends: list[tuple[float, float]] = []  # (decided as of, now - the hold's end)


def instrument(log: Log) -> None:
    """Wrap the queue's strategy call and the events that feed the target."""
    from labserve.batching import queue as queue_module
    from labserve.batching.queue import BatchQueue

    decide = queue_module.decide

    def logged_decide(view: Any, now: float, config: Any, fit: Any, rates: Any, budget_s: float):
        decision = decide(view, now, config, fit, rates, budget_s)
        until = getattr(decision, "until_s", None)
        if until is None and view.hold_until_s is not None:  # a hold ends: how late, really
            log.hold_ends.append((now, time.monotonic() - view.hold_until_s))
        log.decisions.append(
            (now, view.items, view.oldest_arrival_s, fit.a_s, fit.b_s, rates[1], budget_s, until)
        )
        return decision

    queue_module.decide = logged_decide  # type: ignore[assignment]
    new_request = BatchQueue.new_request

    def logged_new_request(self: Any, args: Any, handle: Any = None) -> Any:
        request = new_request(self, args, handle)
        log.requests.append((time.monotonic(), request))
        return request

    BatchQueue.new_request = logged_new_request  # type: ignore[method-assign]
    release = BatchQueue.release

    def logged_release(self: Any, batch: Any, now: float, *, ok: bool) -> None:
        oldest = batch.parts[0][0].arrival_s if batch.parts else now
        log.released[batch.id] = (batch.start_s, now, batch.items, oldest)
        release(self, batch, now, ok=ok)

    BatchQueue.release = logged_release  # type: ignore[method-assign]
    answered = BatchQueue.answered

    def logged_answered(self: Any, batch: Any, now: float) -> None:
        answered(self, batch, now)
        log.answered[batch.id] = (now, self._budget.budget_s)

    BatchQueue.answered = logged_answered  # type: ignore[method-assign]


def thread_cpu() -> dict[str, float]:
    """CPU seconds each live thread has used, by name (ns resolution: its own CPU clock)."""
    used: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            clock = time.pthread_getcpuclockid(thread.ident)
            used[thread.name] = time.clock_gettime(clock)
        except OSError:  # ended meanwhile
            continue
    return used


def count_calls() -> collections.Counter[str]:
    """Count labserve's Python calls by ``module:function`` on every thread from now on."""
    counts: collections.Counter[str] = collections.Counter()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and "labserve/" in frame.f_code.co_filename:
            name = frame.f_code.co_filename.split("labserve/", 1)[1]
            counts[f"{name}:{frame.f_code.co_name}"] += 1

    threading.setprofile(hook)
    sys.setprofile(hook)
    return counts


def watch_gc() -> dict[int, list[float]]:
    """Each garbage collection's pause from now on, in seconds, by generation."""
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started[0])

    gc.callbacks.append(callback)
    return pauses


def pct(values: Any) -> dict[str, float]:
    """Mean and percentiles of ``values`` (seconds), in milliseconds."""
    v = np.asarray(values, dtype=float) * 1000.0
    if not len(v):
        return {}
    q = np.percentile(v, [50, 90, 99, 99.9])
    return {
        "mean": round(float(v.mean()), 4),
        "p50": round(float(q[0]), 4),
        "p90": round(float(q[1]), 4),
        "p99": round(float(q[2]), 4),
        "p999": round(float(q[3]), 4),
    }


def stages(bench: Any, trace: Any, start: float, out: Any, model: Any, log: Log) -> dict:
    """Each request's latency cut at every point the log or the harness stamped."""
    intended = start + trace.offsets
    w0 = start + trace.warmup
    measured = np.flatnonzero((intended >= w0) & (intended < w0 + trace.duration))
    by_start = {s: (bid, e, n, o) for bid, (s, e, n, o) in log.released.items()}
    model_starts = sorted((t, d) for t, _, d in model.batches)
    model_at = np.array([t for t, _ in model_starts])
    rows: dict[str, list[float]] = {
        k: []
        for k in (
            "total",
            "intended_to_launched",
            "launched_to_called",
            "called_to_request",
            "request_to_admitted",
            "admitted_to_fired",
            "fired_to_model_start",
            "model",
            "model_end_to_release",
            "release_to_answered",
            "answered_to_done",
            "labserve_seen",
        )
    }
    mismatched = 0
    for i in measured:
        made, request = log.requests[i]
        if request.args[0] is not trace.rows[i] and not np.array_equal(
            request.args[0], trace.rows[i]
        ):
            mismatched += 1
            continue
        batch = by_start.get(request.start_s)
        if batch is None or np.isnan(out.done[i]):
            continue
        bid, end, _, _ = batch
        if bid not in log.answered:
            continue
        k = int(np.searchsorted(model_at, request.start_s))
        if k >= len(model_starts):
            continue
        m_start, m_dur = model_starts[k]
        answered_at = log.answered[bid][0]
        cuts = {
            "total": out.done[i] - intended[i],
            "intended_to_launched": out.launched[i] - intended[i],
            "launched_to_called": out.called[i] - out.launched[i],
            "called_to_request": made - out.called[i],
            "request_to_admitted": request.arrival_s - made,
            "admitted_to_fired": request.start_s - request.arrival_s,
            "fired_to_model_start": m_start - request.start_s,
            "model": m_dur,
            "model_end_to_release": end - (m_start + m_dur),
            "release_to_answered": answered_at - end,
            "answered_to_done": out.done[i] - answered_at,
            "labserve_seen": answered_at - request.arrival_s,
        }
        for key, value in cuts.items():
            rows[key].append(value)
    result: dict[str, Any] = {"requests": len(rows["total"]), "mismatched": mismatched}
    result["all"] = {k: pct(v) for k, v in rows.items()}
    total = np.asarray(rows["total"])
    tail = total >= np.percentile(total, 98) if len(total) else total
    result["slowest_2pct"] = {k: pct(np.asarray(v)[tail]) for k, v in rows.items()}
    return result


def inputs(log: Log, w0: float, w1: float) -> dict[str, Any]:
    """The target's inputs in the measured window: decisions, costs, feedback."""
    d = np.array([x[:7] for x in log.decisions if w0 <= x[0] < w1 + 1.0], dtype=float)
    holds = [x[7] - x[0] for x in log.decisions if w0 <= x[0] < w1 and x[7] is not None]
    batches = [v for v in log.released.values() if w0 <= v[0] < w1]
    seen = [
        log.answered[b][0] - log.released[b][3]
        for b in log.answered
        if b in log.released and w0 <= log.released[b][0] < w1
    ]
    budgets = [log.answered[b][1] for b in log.answered if w0 <= log.answered[b][0] < w1]
    return {
        "decisions": len(d),
        "hold_end_late_ms": pct([late for at, late in log.hold_ends if w0 <= at < w1]),
        "fit_a_ms": pct(d[:, 3]) if len(d) else {},
        "fit_b_ms": pct(d[:, 4]) if len(d) else {},
        "item_rate_per_s": (
            {"mean": round(float(d[:, 5].mean()), 1), "p50": float(np.median(d[:, 5]))}
            if len(d)
            else {}
        ),
        "budget_ms_at_decisions": pct(d[:, 6]) if len(d) else {},
        "planned_hold_ms": pct(holds),
        "batches": len(batches),
        "batch_items_mean": round(float(np.mean([b[2] for b in batches])), 2) if batches else 0,
        "observed_duration_ms": pct([b[1] - b[0] for b in batches]),
        "oldest_latency_seen_ms": pct(seen),
        "oldest_missed_15ms_pct": round(100.0 * float(np.mean(np.array(seen) > 0.015)), 3)
        if seen
        else 0,
        "budget_ms_after_answers": pct(budgets),
    }


def main() -> int:
    """Run one tree's target15 on its trace and write the stage report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", required=True, help="whose benchmarks/batching_bench.py")
    parser.add_argument("--rate", type=int, default=4000)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"])
    parser.add_argument(
        "--calls", action="store_true", help="count labserve's calls a request (slows the run)"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ["LABSERVE_LOOP"] = args.loop  # as batching_bench's worker sets it (default asyncio)
    sys.path.insert(0, str(Path(args.tree).resolve() / "benchmarks"))
    import batching_bench as bench

    import labserve

    log = Log()
    instrument(log)
    calls = count_calls() if args.calls else None
    model = bench.Model()
    target = bench.build_target(f"labserve-target{bench.TARGET_MS}", model)
    trace = bench.poisson_trace(args.rate, args.warmup, args.duration, args.seed)
    load = os.getloadavg()[0]
    pauses = watch_gc()
    threads0 = thread_cpu()
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        bench.settle_heap()
        start, out = target.run(bench.run_open_loop(target.call, trace))
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        threads = {k: v - threads0.get(k, 0.0) for k, v in thread_cpu().items()}
    finally:
        target.close()
    if calls is not None:
        sys.setprofile(None)
        counted = dict(calls)  # the workers' hooks stay until they end: a copy, now
    summary = bench.summarize(trace, start, out, model)
    w0 = start + trace.warmup
    report = {
        "labserve": labserve.__file__,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "gc": {
            f"gen{g}": {"count": len(p), "total_ms": round(1000 * sum(p), 3), **pct(p)}
            for g, p in pauses.items()
        },
        "thread_cpu_s": {k: round(v, 4) for k, v in sorted(threads.items()) if v > 0.001},
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "bench": {k: summary[k] for k in ("served_rps", "p50_ms", "p99_ms", "mean_batch")},
        "inputs": inputs(log, w0, w0 + trace.duration),
        "stages": stages(bench, trace, start, out, model, log),
    }
    if calls is not None:
        n = len(trace.offsets)
        report["calls_a_request"] = round(sum(counted.values()) / n, 3)
        top = sorted(counted.items(), key=lambda kv: -kv[1])[:40]
        report["calls_a_request_by_function"] = {k: round(v / n, 3) for k, v in top}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("labserve", "cpu_s", "load_before", "bench")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
