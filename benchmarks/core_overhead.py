"""Per-request cost of labserve's sans-IO batching core, without any event loop or thread.

One cycle admits 64 single-row requests, polls (one batch of 64 fires), stacks, splits the
(no-op) output, completes and releases: everything labserve does per request except the
asyncio future and the thread hop. Run: `.venv/bin/python benchmarks/core_overhead.py`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from labserve.base.vocabulary import STRATEGIES
from labserve.batching.containers import Codec
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig


def cycles_per_request_us(strategy: str, cycles: int, batch: int = 64) -> float:
    q = BatchQueue(
        "m", Codec("m"), BatchingConfig(strategy=strategy, max_batch_size=batch, max_latency_ms=20)
    )
    x = np.ones((1, 16), np.float32)
    now = 0.0
    start = time.perf_counter()
    for _ in range(cycles):
        now += 0.01
        # The driver admits one loop iteration's arrivals together.
        q.admit_all([q.new_request((x,)) for _ in range(batch)], now)
        step = q.poll(now)
        while step.fire:
            for b in step.fire:
                output = b.stack(q.codec)[0]
                q.complete(b, q.codec.split(output, b.counts), now)
                q.release(b, now, ok=True)
            step = q.poll(now)
    elapsed = time.perf_counter() - start
    assert q.snapshot(now).served == cycles * batch
    return elapsed / (cycles * batch) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=2000)
    args = parser.parse_args()
    print("| strategy | core µs per request (batch 64) |")
    print("|---|---:|")
    for strategy in STRATEGIES:
        cycles_per_request_us(strategy, 50)  # warm-up
        print(f"| {strategy} | {cycles_per_request_us(strategy, args.cycles):.2f} |")


if __name__ == "__main__":
    main()
