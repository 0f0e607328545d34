"""labserve on Ray Serve, measured: the proxy, the handle's scaling, and sweep fan-out.

Run from the repository root (needs the ray extra, and Debian's `wrk` for the proxy part):

    .venv/bin/python benchmarks/ray_bench.py            # all three
    .venv/bin/python benchmarks/ray_bench.py proxy      # or: strategies, handle, sweep
    .venv/bin/python benchmarks/ray_bench.py alternate 5 2   # 5 rounds each, 2 replicas each

One local Ray (`ray.init(num_cpus=2)`), Serve's proxy on 127.0.0.1:8123.

- proxy: wrk -t1 -c64 -d10s, one JSON row per POST, through Ray's proxy, against (a) labserve
  on one replica (sleep model 2 ms + 0.1 ms x items, cap 64, max_latency_ms 20) and (b) a plain
  Ray Serve deployment with @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.02) doing
  the same sleep; both with max_ongoing_requests 128 and half a CPU per replica.
  `strategies` adds labserve on `fixed` (waits like @serve.batch) and alternates adaptive,
  fixed, plain, plain, fixed, adaptive. `alternate N R [STRATEGY]`: labserve (default
  strategy unless given) and plain, N rounds each (labserve, plain, plain, labserve, ...), R
  replicas each, and the medians; STRATEGY `response` puts plain answering with a Starlette
  Response (as labserve's replica does) in labserve's place. `split N R` (default 10 2):
  labserve, its queue without its HTTP routes, and plain, N rounds each.
- handle: 64 closed-loop callers on a DeploymentHandle for 10 s; sleep model 20 ms + 1 ms x
  items, cap 8 (one replica's capacity: 8 / 28 ms = 285 req/s); one replica, then two.
- sweep: a 1,000-point simulated grid of 10 s Poisson traces, serial, then as Ray tasks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import serve
from starlette.responses import Response

import labserve
import labserve.ray
from labserve.lab.demo import SleepModel

sys.path.insert(0, str(Path(__file__).parent / "http"))
import wrkrun

PORT = 8123
SECONDS = 10
HERE = Path(__file__).parent


def wrk(path: str) -> tuple[float, str, str]:
    """req/s, whether every reply was 2xx, and wrk's latency p50 / p99."""
    result = wrkrun.run(f"http://127.0.0.1:{PORT}{path}", seconds=SECONDS)
    return result["rps"], wrkrun.replies(result), f"{result['p50_ms']} / {result['p99_ms']} ms"


def warm(path: str) -> None:
    wrkrun.run(f"http://127.0.0.1:{PORT}{path}", seconds=3)


@serve.deployment(max_ongoing_requests=128, ray_actor_options={"num_cpus": 0.5})
class PlainBatch:
    """Ray Serve's own batching: the same sleep, per batch.

    ``response``: answer with a Starlette Response, as labserve's replica does, instead of the
    list Ray encodes itself. (Decorated in place: a bare class reachable by its module name
    would be pickled by reference, and Ray's workers cannot import this script.)
    """

    def __init__(self, response: bool = False) -> None:
        self.response = response

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.02)
    async def predict(self, rows: list[list[float]]) -> list[list[float]]:
        await asyncio.to_thread(time.sleep, (2.0 + 0.1 * len(rows)) / 1000.0)
        return [[float(sum(r))] for r in rows]

    async def __call__(self, request: Any) -> Any:
        body = json.loads(await request.body())
        out = [await self.predict(body[0])]
        if self.response:
            return Response(json.dumps(out).encode(), 200, {"content-type": "application/json"})
        return out


@serve.deployment(max_ongoing_requests=128, ray_actor_options={"num_cpus": 0.5})
class QueueOnly:
    """labserve's queue without its HTTP routes: plain's parsing, then a Runner on the
    replica's own loop, as labserve's replica runs it (its private host loop, for that)."""

    def __init__(self, strategy: str = "adaptive") -> None:
        from labserve.ray.replica import _HostLoop

        self.runner = labserve.Runner(
            SleepModel(2.0, 0.1),
            name="q",
            loop=_HostLoop("q"),
            max_batch_size=64,
            max_latency_ms=20,
            strategy=strategy,
        )
        self.runner.predict.start()

    async def __call__(self, request: Any) -> Any:
        body = json.loads(await request.body())
        out = await self.runner.predict.async_run(np.asarray(body, dtype=float))
        return out.tolist()


def served_round(app: Any, name: str, label: str) -> str:
    """Run ``app`` on Serve at ``/``, warm it, measure it with wrk, delete it: its row."""
    serve.run(app, name=name, route_prefix="/")
    try:
        warm("/")
        rps, status, latency = wrk("/")
        return f"| {label} | {rps:,.0f} | {latency} | {status} | - | - |"
    finally:
        serve.delete(name)


def queue_round(replicas: int = 1, strategy: str = "adaptive") -> str:
    app = QueueOnly.options(num_replicas=replicas).bind(strategy)
    return served_round(app, "q", f"labserve's queue, no routes, {strategy}")


def in_turn(kinds: dict[str, Callable[[], str]], rounds: int) -> dict[str, list[str]]:
    """Each kind's round, ``rounds`` times, in turn (forwards, then backwards); rows by kind."""
    order = list(kinds)
    rows: dict[str, list[str]] = {k: [] for k in order}
    for i in range(rounds):
        for kind in order if i % 2 == 0 else order[::-1]:
            row = kinds[kind]()
            rows[kind].append(row)
            print(row, flush=True)
    return rows


def rps_of(rows: list[str]) -> list[float]:
    return [float(r.split("|")[2].replace(",", "")) for r in rows]


def split(rounds: int, replicas: int) -> None:
    """labserve's replica, its queue alone (plain's request handling around it), and plain
    @serve.batch, ``rounds`` each, in turn (forwards, then backwards); the medians."""
    print(
        f"## Through Ray's proxy: wrk -t1 -c64 -d{SECONDS}s, {replicas} replica(s) each, "
        f"{rounds} rounds each: labserve, its queue without its routes, plain\n"
    )
    print("| deployment | req/s | latency p50 / p99 | replies | mean batch | fired by |")
    print("|---|---:|---:|---|---:|---|")
    rows = in_turn(
        {
            "labserve": functools.partial(labserve_round, "adaptive", replicas),
            "queue only": functools.partial(queue_round, replicas),
            "plain": functools.partial(plain_round, replicas),
        },
        rounds,
    )
    med = {k: float(np.median(rps_of(v))) for k, v in rows.items()}
    print(
        "\nmedians: "
        + ", ".join(f"{k} {v:.0f} req/s ({v / med['plain']:.2f}x plain)" for k, v in med.items())
        + "\n"
    )


def labserve_round(strategy: str = "adaptive", replicas: int = 1) -> str:
    app = labserve.ray.deploy(
        functools.partial(SleepModel, 2.0, 0.1),
        name="m",
        max_batch_size=64,
        max_latency_ms=20,
        max_ongoing_requests=128,
        strategy=strategy,
        num_replicas=replicas,
    )
    try:
        warm("/runners/m/predict")
        time.sleep(0.6)
        before = app.snapshots()
        rps, status, latency = wrk("/runners/m/predict")
        time.sleep(0.6)
        after = app.snapshots()
        batches = sum(a.batches - b.batches for a, b in zip(after, before, strict=True))
        served = sum(a.served - b.served for a, b in zip(after, before, strict=True))
        mean = served / batches if batches else float("nan")
        reasons = {
            k: sum(
                a.fire_reasons.get(k, 0) - b.fire_reasons.get(k, 0)
                for a, b in zip(after, before, strict=True)
            )
            for k in after[0].fire_reasons
        }
        fired = ", ".join(f"{k} {v}" for k, v in reasons.items() if v)
        label = f"labserve on Ray Serve, {strategy}"
        return f"| {label} | {rps:,.0f} | {latency} | {status} | {mean:.1f} | {fired} |"
    finally:
        app.stop()


def plain_round(replicas: int = 1, response: bool = False) -> str:
    app = PlainBatch.options(num_replicas=replicas).bind(response)
    label = "plain, a Starlette Response" if response else "plain @serve.batch"
    return served_round(app, "plain", label)


def proxy(strategies: bool = False) -> None:
    """labserve's default against plain; with ``strategies``, labserve's ``fixed`` too.

    ``fixed`` holds a batch until it is full or its oldest request has waited the wait cap,
    as ``@serve.batch`` does; the default fires as soon as the model is free.
    """
    print(f"## Through Ray's proxy: wrk -t1 -c64 -d{SECONDS}s, one JSON row per POST\n")
    fixed = functools.partial(labserve_round, "fixed")
    rounds = [labserve_round, fixed, plain_round] if strategies else [labserve_round, plain_round]
    rounds += rounds[::-1] if strategies else rounds
    print(
        "| deployment (1 replica) | req/s | latency p50 / p99 | replies | mean batch | fired by |"
    )
    print("|---|---:|---:|---|---:|---|")
    for run in rounds:
        print(run(), flush=True)
    print()


def alternate(rounds: int, replicas: int, strategy: str = "adaptive") -> None:
    """labserve (its default strategy unless given) and plain @serve.batch, ``rounds`` each,
    alternating; the medians. ``strategy`` "response": plain answering with a Starlette
    Response in labserve's place (what the reply type alone costs through the proxy)."""
    print(
        f"## Through Ray's proxy: wrk -t1 -c64 -d{SECONDS}s, {replicas} replica(s) each, "
        f"{rounds} alternating rounds, labserve on {strategy}\n"
    )
    print("| deployment | req/s | latency p50 / p99 | replies | mean batch | fired by |")
    print("|---|---:|---:|---|---:|---|")
    mine = (
        functools.partial(plain_round, replicas, response=True)
        if strategy == "response"
        else functools.partial(labserve_round, strategy, replicas)
    )
    runs = in_turn({"labserve": mine, "plain": functools.partial(plain_round, replicas)}, rounds)
    rps = {k: rps_of(rows) for k, rows in runs.items()}
    p99 = {
        k: [float(r.split("|")[3].split("/")[1].split()[0]) for r in rows]
        for k, rows in runs.items()
    }
    med = {k: float(np.median(v)) for k, v in rps.items()}
    medp = {k: float(np.median(v)) for k, v in p99.items()}
    print(
        f"\nmedians: labserve {med['labserve']:.0f} req/s (p99 {medp['labserve']:.0f} ms), "
        f"plain {med['plain']:.0f} req/s (p99 {medp['plain']:.0f} ms): "
        f"labserve / plain = {med['labserve'] / med['plain']:.2f}\n"
    )


async def closed_loop(handle: Any, callers: int, seconds: float) -> int:
    x = np.ones((1, 4))
    done = 0
    stop = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await handle.predict.remote(x)
            done += 1

    await asyncio.gather(*(caller() for _ in range(callers)))
    return done


@ray.remote(num_cpus=0)
def caller_process(handle: Any, callers: int, seconds: float) -> int:
    """Closed-loop callers in a Ray worker process of their own (the driver alone is the
    bottleneck past ~350 req/s here: every handle call costs it routing work)."""
    return asyncio.run(closed_loop(handle, callers, seconds))


def handle() -> None:
    print(
        "## Through a DeploymentHandle: 64 closed-loop callers, sleep 20 ms + 1 ms x items, cap 8\n"
    )
    print("Callers in 2 processes (Ray tasks) of 32 each.\n")
    print("| replicas | req/s | mean batch |")
    print("|---:|---:|---:|")
    rates = {}
    for replicas in (1, 2):
        app = labserve.ray.deploy(
            functools.partial(SleepModel, 20.0, 1.0),
            name="h",
            num_replicas=replicas,
            max_batch_size=8,
            max_latency_ms=20,
            route_prefix=None,
        )
        try:
            ray.get([caller_process.remote(app.handle, 32, 3) for _ in range(2)])
            time.sleep(0.6)
            before = app.snapshots()[0]
            n = sum(ray.get([caller_process.remote(app.handle, 32, SECONDS) for _ in range(2)]))
            time.sleep(0.6)
            after = app.snapshots()[0]
            mean = (after.served - before.served) / max(1, after.batches - before.batches)
            rates[replicas] = n / SECONDS
            print(f"| {replicas} | {n / SECONDS:,.0f} | {mean:.1f} |", flush=True)
        finally:
            app.stop()
    print(f"\n2 replicas / 1 replica: {rates[2] / rates[1]:.2f}x (target >= 1.6x)\n")


def sweep_fan_out() -> None:
    grid = {
        "rates": [float(r) for r in range(100, 1001, 100)],
        "max_batch_size": [1, 2, 4, 8, 16, 24, 32, 48, 64, 128],
        "max_latency_ms": [1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 50.0, 75.0, 100.0],
        "duration_s": 10.0,
        "seed": 3,
    }
    points = len(grid["rates"]) * len(grid["max_batch_size"]) * len(grid["max_latency_ms"])
    print(f"## Sweep fan-out: {points} points, 10 s Poisson traces each\n")
    # serial, Ray, process pool, Ray, serial: each kind's mean, in one run.
    times: dict[str, list[float]] = {"serial": [], "ray": [], "pool": []}
    rows: dict[str, str] = {}
    for kind in ("serial", "ray", "pool", "ray", "serial"):
        executor: concurrent.futures.Executor | None = None
        if kind == "ray":
            executor = labserve.ray.RayExecutor(num_cpus=1)
        elif kind == "pool":
            executor = concurrent.futures.ProcessPoolExecutor(2)
        t = time.perf_counter()
        rows[kind] = repr(labserve.sweep(**grid, executor=executor))  # type: ignore[arg-type]
        times[kind].append(time.perf_counter() - t)
        if executor is not None:
            executor.shutdown()
    mean = {k: sum(v) / len(v) for k, v in times.items()}
    same = rows["serial"] == rows["ray"] == rows["pool"]
    print("| run | seconds (each) | speed-up |\n|---|---:|---:|")
    for kind, label in (
        ("serial", "serial"),
        ("ray", "Ray tasks (2 CPUs)"),
        ("pool", "ProcessPoolExecutor(2), for scale"),
    ):
        each = ", ".join(f"{s:.1f}" for s in times[kind])
        print(f"| {label} | {each} | {mean['serial'] / mean[kind]:.2f}x |")
    print(f"\nRay: {mean['serial'] / mean['ray']:.2f}x (target >= 1.7x); rows identical: {same}\n")


def main() -> None:
    parts = sys.argv[1:] or ["proxy", "handle", "sweep"]
    temp = tempfile.mkdtemp(prefix="lsbench", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    if {"proxy", "strategies", "handle", "alternate", "split"} & set(
        parts
    ):  # the sweep needs no Serve (its controller costs CPU)
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    try:
        if parts[0] in ("split", "alternate"):
            given = [int(p) for p in parts[1:3]]
            rounds, replicas = given + ([10, 2] if parts[0] == "split" else [5, 1])[len(given) :]
            if parts[0] == "split":
                split(rounds, replicas)
            else:
                alternate(rounds, replicas, *parts[3:4])
            return
        for part in parts:
            {
                "proxy": proxy,
                "strategies": functools.partial(proxy, strategies=True),
                "handle": handle,
                "sweep": sweep_fan_out,
            }[part]()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
