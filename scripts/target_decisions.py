#!/usr/bin/env python3
"""Log every decision of the 15 ms latency target on virtual time, for one tree's labserve.

The real ``MethodDriver`` and ``BatchQueue`` of whichever labserve is imported (put a tree
first on PYTHONPATH to run another commit's), on a ``VirtualHost``: a seeded Poisson trace
(batching_bench's target15 shape: cap 64, 20 ms wait, a 15 ms target, a model costing
2 ms + 0.1 ms an item, one batch at a time) is submitted at its arrival times, and each
model call returns after its cost in virtual time. Written as JSON lines: every strategy
decision (the view, the fit, the rates, the budget, the answer), every cost observation
and every answered batch's budget feedback, so two trees' logs compare line by line
(``--compare a.jsonl b.jsonl`` prints the first difference). Uses only what both
``f698ec4`` and later commits have.

    PYTHONPATH=/work/bench-f698 .venv/bin/python scripts/target_decisions.py --out old.jsonl
    .venv/bin/python scripts/target_decisions.py --out new.jsonl
    .venv/bin/python scripts/target_decisions.py --compare old.jsonl new.jsonl

``--tick-ms 1`` launches arrivals in bursts on whole milliseconds, as asyncio sleeps wake, and
``--jitter 0.1`` varies each model call's cost (seeded), to cover more of the driver's paths.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import sys
from typing import Any

import numpy as np

COST_BASE_S = 0.002
COST_PER_ITEM_S = 0.0001


def instrument(log: list[list[Any]]) -> None:
    """Wrap the queue's strategy call, the cost model's input and the budget's feedback."""
    from labserve.batching import queue as queue_module
    from labserve.batching.budget import LatencyBudget
    from labserve.batching.estimators import CostModel

    decide = queue_module.decide

    def logged_decide(view: Any, now: float, config: Any, fit: Any, rates: Any, budget_s: float):
        decision = decide(view, now, config, fit, rates, budget_s)
        log.append(
            [
                "decide",
                now,
                view.items,
                view.oldest_arrival_s,
                view.hold_start_s,
                view.hold_until_s,
                fit.a_s,
                fit.b_s,
                fit.samples,
                rates[1],
                budget_s,
                repr(decision),
            ]
        )
        return decision

    queue_module.decide = logged_decide  # type: ignore[assignment]
    observe = CostModel.observe

    def logged_observe(self: Any, items: int, duration_s: float, tokens: int = 0) -> None:
        log.append(["observe", items, duration_s])
        observe(self, items, duration_s, tokens)

    CostModel.observe = logged_observe  # type: ignore[method-assign]
    answered = LatencyBudget.answered

    def logged_answered(self: Any, oldest_arrival_s: float, now: float) -> None:
        answered(self, oldest_arrival_s, now)
        log.append(["answered", oldest_arrival_s, now, self.budget_s])

    LatencyBudget.answered = logged_answered  # type: ignore[method-assign]


def run(
    rate: float, seconds: float, seed: int, timers: str, tick_s: float = 0.0, jitter: float = 0.0
) -> list[list[Any]]:
    """Drive one trace through the imported labserve's driver on virtual time; the log.

    ``tick_s``: arrivals are launched at the next multiple of it, all of a tick in one loop
    iteration (asyncio's sleeps wake on whole milliseconds); 0: each at its own time.
    ``jitter``: each model call's cost is scaled by a seeded lognormal of this sigma.
    """
    from labserve.batching.containers import Codec
    from labserve.batching.queue import BatchQueue
    from labserve.config.batching import BatchingConfig
    from labserve.runtime.driver import MethodDriver
    from labserve.runtime.virtual import VirtualHost

    log: list[list[Any]] = []
    instrument(log)
    host = VirtualHost(timers=timers)  # type: ignore[arg-type]
    config = BatchingConfig(
        strategy="adaptive", max_batch_size=64, max_latency_ms=20, latency_slo_ms=15
    )
    queue = BatchQueue("predict", Codec("predict"), config, runner="bench")
    driver = MethodDriver(queue, host.park, is_async=False, scheduler=host)
    rng = np.random.default_rng([seed, int(rate)])
    times = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.2)))
    times = times[times < seconds]
    if tick_s:
        times = np.ceil(times / tick_s) * tick_s
    noise = np.random.default_rng([seed, 7])
    row = np.zeros((1, 16), dtype=np.float32)
    ends: dict[int, tuple[float, Any]] = {}  # parked model call -> (its end, the call)
    futures = []
    i = 0
    while True:
        for call in host.parked:
            if id(call) not in ends:
                cost = COST_BASE_S + COST_PER_ITEM_S * len(call.args[0])
                if jitter:
                    cost *= float(noise.lognormal(0.0, jitter))
                ends[id(call)] = (host.now() + cost, call)
        next_arrival = float(times[i]) if i < len(times) else math.inf
        next_end = min((end for end, _ in ends.values()), default=math.inf)
        live_timers = [when for when, _, h in host._timers if not h.cancelled]
        next_timer = min(live_timers, default=math.inf)
        t = min(next_arrival, next_end, next_timer)
        if t == math.inf:
            break
        host.advance(max(t - host.now(), 0.0))
        if t == next_end and t <= next_arrival:
            key = min(ends, key=lambda k: ends[k][0])
            _, call = ends.pop(key)
            host.release(call, value=call.args[0] * 2)
        elif t == next_arrival:
            while i < len(times) and times[i] == t:  # one loop iteration's arrivals
                future: concurrent.futures.Future[Any] = concurrent.futures.Future()
                futures.append(future)
                driver.submit(queue.new_request((row,), future))
                i += 1
            host.settle()
    answered = sum(f.done() and f.exception() is None for f in futures)
    log.append(["end", len(futures), answered])
    return log


def compare(a_path: str, b_path: str) -> int:
    """Print the first line where two logs differ (and how many of each kind); 1 if any."""
    with open(a_path) as a_file, open(b_path) as b_file:
        a, b = a_file.readlines(), b_file.readlines()
    for n, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            print(f"first difference at line {n + 1} of {len(a)} / {len(b)}:")
            print("  " + "  ".join(a[max(0, n - 3) : n + 1]))
            print("  " + "  ".join(b[max(0, n - 3) : n + 1]))
            return 1
    if len(a) != len(b):
        print(f"same for {min(len(a), len(b))} lines, then one log ends: {len(a)} / {len(b)}")
        return 1
    print(f"identical: {len(a)} lines")
    return 0


def main() -> int:
    """Write one tree's log, or compare two logs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=4000.0)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timers", default="exact", choices=["exact", "late", "early"])
    parser.add_argument("--tick-ms", type=float, default=0.0, help="launch on this tick")
    parser.add_argument("--jitter", type=float, default=0.0, help="lognormal sigma of cost")
    parser.add_argument("--out", help="where to write the log (JSON lines)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    import labserve

    log = run(args.rate, args.seconds, args.seed, args.timers, args.tick_ms / 1000, args.jitter)
    print(f"{labserve.__file__}: {len(log)} lines, {log[-1]}", file=sys.stderr)
    with open(args.out, "w") as out:
        for entry in log:
            out.write(json.dumps(entry) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
