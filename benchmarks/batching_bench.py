#!/usr/bin/env python3
"""Side-by-side micro-batching benchmark, in-process, one seeded open-loop trace for everyone.

Systems: labserve's strategies (off, fixed, greedy, adaptive), BentoML's CorkDispatcher (wired
the way a BentoML runner wires it), Ray Serve's ``@serve.batch`` (one replica-context check
bypassed, see RAY_BYPASS) and ``null``, which replies at once and shows what the harness itself
sustains. The driver (no ``--worker``) runs each system in its own subprocess, one after the
other, collects their JSON, prints markdown tables and writes the JSON report.

Workload: every request is one float32 row of shape (1, 16); the model records ``len(batch)``,
sleeps ``0.002 + 0.0001 * items`` seconds in a worker thread and returns ``batch * 2``, so each
caller's reply is checked against its own row. Caps: 64 items per batch, 20 ms wait.

Load: Poisson arrivals seeded by (seed, rate), identical for every system. Requests are launched
at their intended times on the system's event loop without waiting for replies (open loop); a
request's latency runs from its intended arrival time, so a late launch counts against the system
(no coordinated omission). Each rate runs ``warmup + duration`` seconds on one warm instance of the
system; only requests whose intended arrival falls in the last ``duration`` seconds are reported.
Before each measured phase the heap is collected and frozen (``gc.freeze``), for every system.

Overhead: a no-op model (records the batch size, returns its input), waves of 64 concurrent
requests (``asyncio.gather``), one wave after the other; the reported figure is the summed wall
time of the measured waves divided by the number of requests in them, nothing subtracted.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

MAX_BATCH_SIZE = 64
MAX_LATENCY_MS = 20
ROW_WIDTH = 16
COST_BASE_S = 0.002
COST_PER_ITEM_S = 0.0001
POOL_WORKERS = 4
DRAIN_TIMEOUT_S = 30.0
DEFAULT_RATES = (200, 1000, 2000, 4000, 6000, 8000)
LABSERVE_STRATEGIES = ("off", "fixed", "greedy", "adaptive")
TARGET_MS = 15  # labserve-target15: adaptive with a latency target (p99) of this many ms
SYSTEMS = (
    *(f"labserve-{s}" for s in LABSERVE_STRATEGIES),
    f"labserve-target{TARGET_MS}",
    "bentoml",
    "ray",
    "null",
)
HERE = Path(__file__).resolve().parent

OK, REJECTED, ERROR, WRONG, LOST = range(5)

RAY_BYPASS = (
    "ray.serve.batching._BatchQueue._warn_if_max_batch_size_exceeds_max_ongoing_requests is "
    "replaced by a no-op. In ray 2.60 _BatchQueue.__init__ (and set_max_batch_size) call it; it "
    "reads serve.get_replica_context()._deployment_config.max_ongoing_requests only to log a "
    "warning when max_batch_size * max_concurrent_batches exceeds it, and get_replica_context() "
    "raises RayServeException outside a replica. Nothing else is patched: batching, timers, "
    "futures and Ray's own metric calls (Cython recorders; nothing is exported without a Ray "
    "cluster, but each call is still paid) run as shipped."
)


class Rejected(Exception):
    """The system under test refused the request because it is overloaded."""


class RefusedAtAdmission(Rejected):
    """Rejected at once, at admission, because the system predicted it could not start in time."""


REJECTION = Rejected("overloaded")  # what a rejected request's reply slot keeps
REFUSAL = RefusedAtAdmission("overloaded, refused at admission")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the workload


class Model:
    """The benchmark model: records each batch's start, size and duration, then does its work.

    ``batches`` holds ``[start, items, duration]`` (monotonic s, count, s); the duration is
    filled in when the call returns (NaN until then), measured inside the model call, so it
    is the same measure of model time for every system.
    """

    def __init__(self, *, noop: bool = False) -> None:
        self.noop = noop
        self.batches: list[list[float]] = []

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        record = [time.monotonic(), len(batch), float("nan")]
        self.batches.append(record)
        if self.noop:
            record[2] = time.monotonic() - record[0]
            return batch
        time.sleep(COST_BASE_S + COST_PER_ITEM_S * len(batch))
        out = batch * 2
        record[2] = time.monotonic() - record[0]
        return out

    def expected(self, x: np.ndarray) -> np.ndarray:
        return x if self.noop else x * 2


def classify(reply: Any, x: np.ndarray, model: Model) -> int:
    """Map a reply (or the exception raised instead) to an outcome code."""
    if isinstance(reply, Rejected):
        return REJECTED
    if isinstance(reply, BaseException):
        return ERROR
    return OK if np.array_equal(reply, model.expected(x)) else WRONG


def describe(reply: Any, x: np.ndarray) -> str:
    if isinstance(reply, BaseException):
        return "".join(traceback.format_exception(reply)).strip()
    got = np.asarray(reply)
    return f"wrong reply: shape {got.shape}, first values {got.ravel()[:4]}; sent {x.ravel()[:4]}"


# --------------------------------------------------------------------------- systems under test


@dataclass
class Target:
    """One system under test: an async call, how to drive a coroutine on its loop, cleanup."""

    call: Callable[[np.ndarray], Awaitable[Any]]
    run: Callable[[Coroutine[Any, Any, Any]], Any]
    close: Callable[[], None]
    stats: Callable[[], Any] | None = None


def batch_handler(
    model: Model, pool: ThreadPoolExecutor
) -> Callable[[Sequence[np.ndarray]], Awaitable[list[np.ndarray]]]:
    """The async batch function both baselines wrap: stack, run the model in the pool, split."""

    async def handle(xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        sizes = [len(x) for x in xs]
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(pool, model, np.concatenate(xs))
        return np.split(out, np.cumsum(sizes)[:-1])

    return handle


def labserve_target(
    strategy: str, model: Model, *, latency_slo_ms: float = 0.0, on_overload: str | None = None
) -> Target:
    """A Runner with the given strategy (and latency target, and on_overload if given)."""
    import labserve

    extra: dict[str, Any] = {}
    if latency_slo_ms:
        extra["latency_slo_ms"] = latency_slo_ms
    if on_overload:
        extra["on_overload"] = on_overload

    class BenchModel(labserve.Runnable):
        @labserve.method(
            batchable=True,
            batch_dim=0,
            max_batch_size=MAX_BATCH_SIZE,
            max_latency_ms=MAX_LATENCY_MS,
        )
        def predict(self, x: np.ndarray) -> np.ndarray:
            return model(x)

    runner = labserve.Runner(
        BenchModel,
        name=f"bench_{strategy}_{'noop' if model.noop else 'sleep'}",
        strategy=strategy,
        max_batch_size=MAX_BATCH_SIZE,
        max_latency_ms=MAX_LATENCY_MS,
        **extra,
    )

    async def call(x: np.ndarray) -> Any:
        try:
            return await runner.predict.async_run(x)
        except labserve.OverloadError as exc:
            if exc.predicted_wait_s is not None:  # refused at admission, by prediction
                raise RefusedAtAdmission(str(exc)) from exc
            raise Rejected(str(exc)) from exc

    return Target(
        call=call,
        run=labserve.background_loop().run,
        close=runner.stop,
        stats=lambda: runner.stats("predict"),
    )


def bentoml_target(model: Model) -> Target:
    """CorkDispatcher built with the arguments BentoML's RunnerAppFactory gives it."""
    from bentoml._internal.marshal.dispatcher import CorkDispatcher
    from bentoml.exceptions import ServiceUnavailable

    pool = ThreadPoolExecutor(POOL_WORKERS, thread_name_prefix="bentoml-model")
    dispatcher: CorkDispatcher[np.ndarray, np.ndarray] = CorkDispatcher(
        max_latency_in_ms=MAX_LATENCY_MS,
        max_batch_size=MAX_BATCH_SIZE,
        fallback=functools.partial(ServiceUnavailable, "process is overloaded"),
        get_batch_size=lambda x: x.shape[0],
        batch_dim=(0, 0),
    )
    infer = dispatcher(batch_handler(model, pool))

    async def call(x: np.ndarray) -> Any:
        reply = await infer(x)
        if isinstance(reply, ServiceUnavailable):  # the dispatcher returns its fallback
            raise Rejected(str(reply))
        return reply

    def close() -> None:
        dispatcher.shutdown()
        pool.shutdown()

    return Target(call=call, run=run_stock, close=close)


def run_stock(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a baseline's coroutine on a fresh loop of the kind asked for (--loop)."""
    if os.environ.get("LABSERVE_LOOP") == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


def bypass_ray_replica_check() -> None:
    """Skip the one replica-context lookup @serve.batch makes (see RAY_BYPASS)."""
    from ray.serve import batching

    def no_replica_warning(self: Any) -> None:
        return None

    name = "_warn_if_max_batch_size_exceeds_max_ongoing_requests"
    if hasattr(batching._BatchQueue, name):
        setattr(batching._BatchQueue, name, no_replica_warning)


def ray_target(model: Model) -> Target:
    from ray import serve

    bypass_ray_replica_check()
    pool = ThreadPoolExecutor(POOL_WORKERS, thread_name_prefix="ray-model")
    handle = batch_handler(model, pool)

    class RayBench:
        @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=MAX_LATENCY_MS / 1000)
        async def predict(self, xs: list[np.ndarray]) -> list[np.ndarray]:
            return await handle(xs)

    return Target(call=RayBench().predict, run=run_stock, close=pool.shutdown)


def null_target(model: Model) -> Target:
    """Harness calibration: replies at once on the loop; no batching, no model call."""

    async def call(x: np.ndarray) -> np.ndarray:
        return model.expected(x)

    return Target(call=call, run=run_stock, close=lambda: None)


def build_target(system: str, model: Model, on_overload: str | None = None) -> Target:
    if system == f"labserve-target{TARGET_MS}":
        return labserve_target("adaptive", model, latency_slo_ms=TARGET_MS, on_overload=on_overload)
    if system.startswith("labserve-"):
        return labserve_target(system.removeprefix("labserve-"), model, on_overload=on_overload)
    if system == "bentoml":
        return bentoml_target(model)
    if system == "ray":
        return ray_target(model)
    if system == "null":
        return null_target(model)
    raise ValueError(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")


# --------------------------------------------------------------------------- open-loop load


def settle_heap() -> None:
    """Collect, then freeze what survives (imports, the system, the trace) out of the GC's scans.

    Done before every measured phase, the same for every system, so that full collections scan
    only the objects of the run itself and not, say, Ray's or BentoML's import-time heap.
    """
    gc.collect()
    gc.freeze()


@dataclass
class Trace:
    """Intended arrival offsets (s from the trace start) and one distinct input per request."""

    rate: int
    offsets: np.ndarray
    rows: np.ndarray
    warmup: float
    duration: float


def poisson_trace(rate: int, warmup: float, duration: float, seed: int) -> Trace:
    rng = np.random.default_rng([seed, rate])
    total = warmup + duration
    gaps = rng.exponential(1.0 / rate, int(rate * total * 1.2) + 100)
    while gaps.sum() < total:
        gaps = np.concatenate([gaps, rng.exponential(1.0 / rate, rate + 100)])
    offsets = np.cumsum(gaps)
    offsets = offsets[offsets < total]
    rows = rng.standard_normal((len(offsets), 1, ROW_WIDTH), dtype=np.float32)
    return Trace(rate, offsets, rows, warmup, duration)


_PENDING = object()  # the reply slot of a request that never finished


@dataclass
class Outcomes:
    """Per-request launch time, call time, completion time and reply (monotonic seconds).

    ``launched``: the task was created; ``called``: the task ran and called the system (later
    than launched when the generator catches up on a backlog without yielding).

    Replies are kept and checked after the run, so the check costs the event loop nothing.
    """

    launched: np.ndarray
    called: np.ndarray
    done: np.ndarray
    replies: list[Any]

    @classmethod
    def empty(cls, n: int) -> Outcomes:
        nan = np.full(n, np.nan)
        return cls(nan.copy(), nan.copy(), nan.copy(), [_PENDING] * n)

    def classify(self, rows: np.ndarray, model: Model) -> tuple[np.ndarray, str | None]:
        """Outcome code of every request, and the first error or wrong reply, verbatim."""
        codes = np.full(len(self.replies), LOST, dtype=np.int8)
        first_problem = None
        for i, reply in enumerate(self.replies):
            if reply is _PENDING:
                continue
            codes[i] = classify(reply, rows[i], model)
            if codes[i] in (ERROR, WRONG) and first_problem is None:
                first_problem = describe(reply, rows[i])
        return codes, first_problem


async def send(call: Callable, x: np.ndarray, i: int, out: Outcomes) -> None:
    out.called[i] = time.monotonic()
    try:
        reply = await call(x)
    except Rejected as exc:
        # Drop the traceback: thousands of them would load the GC.
        reply = REFUSAL if isinstance(exc, RefusedAtAdmission) else REJECTION
    except Exception as exc:
        reply = exc
    out.done[i] = time.monotonic()
    out.replies[i] = reply


async def run_open_loop(call: Callable, trace: Trace) -> tuple[float, Outcomes]:
    """Launch each request at its intended time, never waiting for replies; then drain."""
    out = Outcomes.empty(len(trace.offsets))
    in_flight: set[asyncio.Task] = set()  # done tasks are dropped at once, to spare the GC
    start = time.monotonic() + 0.01
    for i, offset in enumerate(trace.offsets):
        delay = start + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        out.launched[i] = time.monotonic()
        task = asyncio.create_task(send(call, trace.rows[i], i, out))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        _, pending = await asyncio.wait(in_flight, timeout=DRAIN_TIMEOUT_S)
        for task in pending:
            task.cancel()
    return start, out


def percentile(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if len(values) else None


def summarize(trace: Trace, start: float, out: Outcomes, model: Model) -> dict[str, Any]:
    """Statistics over the requests whose intended arrival falls in the measured window."""
    status, first_problem = out.classify(trace.rows, model)
    w0 = start + trace.warmup
    w1 = w0 + trace.duration
    intended = start + trace.offsets
    measured = (intended >= w0) & (intended < w1)
    n = int(measured.sum())
    codes = status[measured]
    ok = measured & (status == OK)
    latency_ms = (out.done[ok] - intended[ok]) * 1000
    served = (status == OK) & (out.done >= w0) & (out.done < w1)
    window = [(t, size, seconds) for t, size, seconds in list(model.batches) if w0 <= t < w1]
    sizes = [size for _, size, _ in window]
    finished = [(t, seconds) for t, _, seconds in window if not math.isnan(seconds)]
    model_s = sum(seconds for _, seconds in finished)
    # The model's idle time between one batch's end and the next one's start (one batch at
    # a time here): what keeps a saturated model under its ceiling.
    runs = sorted((t, t + d) for t, d in finished)
    gaps_ms = np.array([1000 * (b[0] - a[1]) for a, b in itertools.pairwise(runs)])
    n_served = int(served.sum())
    lag_ms = (out.launched[measured] - intended[measured]) * 1000
    refused = measured & (status == REJECTED)
    refused_ms = (out.done[refused] - out.called[refused]) * 1000  # call made -> refusal
    at_admission = np.array([out.replies[i] is REFUSAL for i in np.flatnonzero(refused)], bool)
    return {
        "rate": trace.rate,
        "requests": n,
        "offered_rps": round(n / trace.duration, 1),
        "served_rps": round(n_served / trace.duration, 1),
        "p50_ms": percentile(latency_ms, 50),
        "p90_ms": percentile(latency_ms, 90),
        "p99_ms": percentile(latency_ms, 99),
        "p999_ms": percentile(latency_ms, 99.9),
        "max_ms": percentile(latency_ms, 100),
        "mean_batch": round(float(np.mean(sizes)), 2) if sizes else None,
        "batches": len(sizes),
        "model_ms_per_request": round(1000 * model_s / n_served, 4) if n_served else None,
        "model_busy_pct": round(100 * model_s / trace.duration, 2),
        "gap_between_batches_p50_ms": percentile(gaps_ms, 50),
        "gap_between_batches_p99_ms": percentile(gaps_ms, 99),
        "gap_between_batches_mean_ms": round(float(gaps_ms.mean()), 3) if len(gaps_ms) else None,
        "refused_call_to_refusal_p50_ms": percentile(refused_ms, 50),
        "refused_call_to_refusal_p99_ms": percentile(refused_ms, 99),
        "refused_call_to_refusal_max_ms": percentile(refused_ms, 100),
        "refused_within_1ms_pct": (
            round(100 * float(np.mean(refused_ms <= 1.0)), 2) if len(refused_ms) else None
        ),
        "refused_at_admission": int(at_admission.sum()),
        "refused_at_admission_p99_ms": percentile(refused_ms[at_admission], 99),
        "rejected_at_deadline": int((~at_admission).sum()),
        "rejected_pct": round(100 * float(np.mean(codes == REJECTED)), 2),
        "errored_pct": round(100 * float(np.mean(codes >= ERROR)), 2),
        "errors": int((codes == ERROR).sum()),
        "wrong_rows": int((codes == WRONG).sum()),
        "lost": int((codes == LOST).sum()),
        "launch_lag_p99_ms": percentile(lag_ms, 99),
        "launch_lag_max_ms": percentile(lag_ms, 100),
        "first_problem": first_problem,
    }


async def run_rate(target: Target, model: Model, trace: Trace) -> dict[str, Any]:
    model.batches.clear()
    settle_heap()
    start, out = await run_open_loop(target.call, trace)
    return summarize(trace, start, out, model)


# --------------------------------------------------------------------------- overhead


async def wave(call: Callable, xs: Sequence[np.ndarray]) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    replies = await asyncio.gather(*(call(x) for x in xs), return_exceptions=True)
    return time.perf_counter() - t0, replies


async def run_overhead(target: Target, model: Model, waves: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng([seed, 64])
    xs = list(rng.standard_normal((MAX_BATCH_SIZE, 1, ROW_WIDTH), dtype=np.float32))
    for _ in range(max(10, waves // 20)):  # warm-up waves, not reported
        await wave(target.call, xs)
    model.batches.clear()
    settle_heap()
    wall = 0.0
    counts = np.zeros(5, dtype=np.int64)
    first_problem = None
    for _ in range(waves):
        seconds, replies = await wave(target.call, xs)
        wall += seconds
        for x, reply in zip(xs, replies, strict=True):
            code = classify(reply, x, model)
            counts[code] += 1
            if code in (ERROR, WRONG) and first_problem is None:
                first_problem = describe(reply, x)
    n = waves * len(xs)
    sizes = [size for _, size, _ in model.batches]
    return {
        "requests": n,
        "us_per_request": round(wall / n * 1e6, 2),
        "mean_batch": round(float(np.mean(sizes)), 2) if sizes else None,
        "rejected": int(counts[REJECTED]),
        "errors": int(counts[ERROR]),
        "wrong_rows": int(counts[WRONG]),
        "first_problem": first_problem,
    }


# --------------------------------------------------------------------------- worker process


async def run_all_rates(target: Target, model: Model, args: argparse.Namespace) -> list[dict]:
    results = []
    for rate in args.rates:
        trace = poisson_trace(rate, args.warmup, args.duration, args.seed)
        try:
            row = await run_rate(target, model, trace)
        except Exception:
            row = {"rate": rate, "crash": traceback.format_exc()}
        if target.stats is not None:
            row["own_stats"] = own_stats(target)
        log(f"[{args.worker}] {rate} req/s: {brief(row)}")
        results.append(row)
    return results


def own_stats(target: Target) -> str:
    """labserve's own Snapshot after this rate, as text, to cross-check our batch count.

    The runner lives across all rates, so its figure covers every rate run so far (warm-ups too).
    """
    try:
        snap = target.stats() if target.stats else None
        if snap is None:
            return ""
        wait = snap.queue_wait_ms_window
        return (
            f"mean_batch_size={snap.mean_batch_size:.2f} "
            f"queue_wait_ms_p99={wait.p99:.2f} queue_wait_ms_p999={wait.p999:.2f} "
            f"served={snap.served} rejected={snap.rejected} refused={snap.refused} "
            f"model_ms_per_request={snap.model_ms_per_request:.3f} "
            f"latency_slo_met={snap.latency_slo_met:.4f} "
            f"latency_budget_ms={snap.latency_budget_ms:.2f}"
        )
    except Exception as exc:
        return f"stats() failed: {exc!r}"


def brief(row: dict[str, Any]) -> str:
    if "crash" in row:
        return "CRASHED\n" + row["crash"]
    return (
        f"served {row['served_rps']}/s p50 {row['p50_ms']} p99 {row['p99_ms']} ms "
        f"batch {row['mean_batch']} model {row['model_ms_per_request']} ms/req "
        f"rejected {row['rejected_pct']}% "
        f"errored {row['errored_pct']}% lag p99 {row['launch_lag_p99_ms']} ms"
    )


def run_phase(
    system: str,
    noop: bool,
    body: Callable[[Target, Model], Coroutine],
    on_overload: str | None = None,
) -> Any:
    """Build a fresh instance of the system, drive `body` on its loop, always clean up."""
    model = Model(noop=noop)
    target = build_target(system, model, on_overload)
    try:
        return target.run(body(target, model))
    finally:
        target.close()


def worker_main(args: argparse.Namespace) -> None:
    # Every system's loop, labserve's background loop included, is of this kind.
    os.environ["LABSERVE_LOOP"] = args.loop
    result: dict[str, Any] = {"system": args.worker, "rates": [], "overhead": None}
    try:
        if args.rates:
            result["rates"] = run_phase(
                args.worker, False, lambda t, m: run_all_rates(t, m, args), args.on_overload
            )
        if args.overhead_waves > 0:
            result["overhead"] = run_phase(
                args.worker,
                True,
                lambda t, m: run_overhead(t, m, args.overhead_waves, args.seed),
                args.on_overload,
            )
        log(f"[{args.worker}] overhead: {result['overhead']}")
    except Exception:
        result["crash"] = traceback.format_exc()
        log(f"[{args.worker}] CRASHED\n{result['crash']}")
    Path(args.out).write_text(json.dumps(result, indent=2))


# --------------------------------------------------------------------------- driver


def worker_command(system: str, out: Path, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        system,
        "--out",
        str(out),
        "--rates",
        ",".join(map(str, args.rates)) or "none",
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--seed",
        str(args.seed),
        "--overhead-waves",
        str(args.overhead_waves),
        *(["--on-overload", args.on_overload] if args.on_overload else []),
        "--loop",
        args.loop,
    ]


def run_worker(system: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one system's worker subprocess; its stderr streams through, its JSON comes back."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        proc = subprocess.Popen(
            worker_command(system, out, args), stderr=subprocess.PIPE, text=True
        )
        tail: list[str] = []
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            tail = [*tail[-60:], line]
        code = proc.wait()
        if out.exists():
            return json.loads(out.read_text())
        return {"system": system, "crash": f"worker exited {code}:\n{''.join(tail)}"}


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_describe() -> str:
    """The commit labserve ran from, "+dirty" if labserve/ has uncommitted changes (editable)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "../labserve"],
            cwd=HERE,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head}{'+dirty' if dirty else ''}" or "unknown"


def environment() -> dict[str, Any]:
    return {
        "labserve_commit": git_describe(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": {
            name: package_version(name) for name in ("labserve", "bentoml", "ray", "numpy")
        },
        "ray_bypass": RAY_BYPASS,
    }


def fmt(value: Any) -> str:
    return "—" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def rates_table(results: list[dict[str, Any]], rates: Sequence[int]) -> str:
    """One line per rate, system and repeat, with the load average before that worker ran."""
    lines = [
        "| rate (req/s) | system | run | load avg | served req/s | p50 ms | p99 ms | mean batch "
        "| model ms/req | rejected % | errored % |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rate in rates:
        for result in results:
            row = next((r for r in result.get("rates", []) if r["rate"] == rate), None)
            lines.append(rate_line(rate, result, row))
    return "\n".join(lines)


def rate_line(rate: int, result: dict[str, Any], row: dict[str, Any] | None) -> str:
    head = f"| {rate} | {result['system']} | {result.get('repeat', 1)} | {result.get('load1', '')}"
    if row is None or "crash" in row:
        return head + " | crashed | | | | | | |"
    keys = ("served_rps", "p50_ms", "p99_ms", "mean_batch", "model_ms_per_request")
    cells = [row.get(k) for k in keys] + [row["rejected_pct"], row["errored_pct"]]
    return head + " | " + " | ".join(fmt(c) for c in cells) + " |"


SPREAD_KEYS = ("served_rps", "p50_ms", "p99_ms", "mean_batch", "model_ms_per_request")


def spread_table(results: list[dict[str, Any]], rates: Sequence[int]) -> str:
    """Per rate and system, each figure as median [min-max] over the repeats."""
    lines = [
        "| rate (req/s) | system | runs | "
        + " | ".join(k.replace("_", " ") for k in SPREAD_KEYS)
        + " | rejected % |",
        "|---:|---|---:|" + "---:|" * (len(SPREAD_KEYS) + 1),
    ]
    systems = list(dict.fromkeys(r["system"] for r in results))
    for rate in rates:
        for system in systems:
            rows = [
                r
                for result in results
                if result["system"] == system
                for r in result.get("rates", [])
                if r["rate"] == rate and "crash" not in r
            ]
            if not rows:
                lines.append(f"| {rate} | {system} | 0 |" + " |" * (len(SPREAD_KEYS) + 1))
                continue
            cells = [spread([r.get(k) for r in rows]) for k in (*SPREAD_KEYS, "rejected_pct")]
            lines.append(f"| {rate} | {system} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread(values: Sequence[Any]) -> str:
    """Median [min-max] of the known values ('—' if none)."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return "—"
    if len(known) == 1:
        return f"{known[0]:g}"
    return f"{float(np.median(known)):.4g} [{min(known):.4g}-{max(known):.4g}]"


def overhead_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| system | µs per request (no-op model, waves of 64) | mean batch | rejected | errors |",
        "|---|---:|---:|---:|---:|",
    ]
    for result in results:
        o = result.get("overhead")
        if not o:
            lines.append(f"| {result['system']} | not run or crashed | | | |")
            continue
        errors = o["errors"] + o["wrong_rows"]
        cells = [o["us_per_request"], o["mean_batch"], o["rejected"], errors]
        lines.append(f"| {result['system']} | " + " | ".join(fmt(c) for c in cells) + " |")
    return "\n".join(lines)


def problems(results: list[dict[str, Any]]) -> list[str]:
    """Crashes, wrong rows and first errors, verbatim, for the report's end."""
    found = []
    for result in results:
        if "crash" in result:
            found.append(f"{result['system']}: {result['crash']}")
        rows = [*result.get("rates", []), result.get("overhead") or {}]
        for row in rows:
            text = row.get("crash") or row.get("first_problem")
            if text:
                found.append(f"{result['system']} @ {row.get('rate', 'overhead')}: {text}")
    return found


def driver_main(args: argparse.Namespace) -> None:
    started, load_before = time.monotonic(), os.getloadavg()
    results = []
    for repeat in range(1, args.repeats + 1):  # round-robin: each repeat runs every system
        for system in args.systems:
            load1 = round(os.getloadavg()[0], 2)
            log(f"== {system}, run {repeat} of {args.repeats}, load average {load1}")
            result = run_worker(system, args)
            result["repeat"], result["load1"] = repeat, load1
            results.append(result)
    report = {"environment": environment(), "params": params(args), "results": results}
    report["environment"]["wall_s"] = round(time.monotonic() - started, 1)
    report["environment"]["loadavg_1_5_15_before_after"] = [load_before, os.getloadavg()]
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(rates_table(results, args.rates))
    print()
    if args.repeats > 1:
        print(spread_table(results, args.rates))
        print()
    print(overhead_table(results))
    for problem in problems(results):
        print(f"\nPROBLEM {problem}")
    print(f"\nJSON written to {args.json}")


def params(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "rates": args.rates,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "seed": args.seed,
        "overhead_waves": args.overhead_waves,
        "repeats": args.repeats,
        "loop": args.loop,
        "on_overload": args.on_overload or "labserve's default",
        "latency_slo_ms (labserve-target systems)": TARGET_MS,
        "max_batch_size": MAX_BATCH_SIZE,
        "max_latency_ms": MAX_LATENCY_MS,
        "model": f"sleep({COST_BASE_S} + {COST_PER_ITEM_S} * items) in a thread; returns x * 2",
        "request": f"float32 array of shape (1, {ROW_WIDTH})",
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS), type=lambda s: s.split(","))
    parser.add_argument(
        "--rates",
        default=DEFAULT_RATES,
        type=lambda s: [] if s == "none" else [int(r) for r in s.split(",")],
        help="comma-separated req/s; none: the overhead phase only",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=2.0, help="unreported seconds per rate")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument(
        "--overhead-waves", type=int, default=1000, help="0 skips the overhead phase"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of every system, round-robin")
    parser.add_argument(
        "--on-overload",
        choices=("wait", "reject"),
        help="labserve systems' on_overload (default: labserve's own default)",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop of every system (labserve's background loop and the baselines')",
    )
    parser.add_argument("--json", default=str(HERE / "batching_by_rate.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        worker_main(args)
    else:
        driver_main(args)


if __name__ == "__main__":
    main()
