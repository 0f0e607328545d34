"""The scheduler's own cost of prefix caching when every lookup misses (issue 33), on virtual time.

2,000 requests of 256 distinct tokens and 32 outputs replayed through the scheduler
(``replay_generation`` with their token ids), caching on and off in alternating order,
five rounds: the process's CPU time, per output token. No model runs: this is what hashing
each full block (blake2b) and registering it adds to the sans-IO core.

    .venv/bin/python benchmarks/generation/prefix_cache_core.py
"""

from __future__ import annotations

import statistics
import time

from labserve.config.generation import GenerationConfig
from labserve.sim.generation import StepCost, replay_generation

N = 2000
PROMPTS = [[i * 1000 + j for j in range(256)] for i in range(N)]
OUTPUTS = [[7] * 32 for _ in range(N)]


def main() -> None:
    """Print CPU seconds per round and microseconds per output token, on and off."""
    kw = {
        "arrival_s": [0.001 * i for i in range(N)],
        "output_lens": [32] * N,
        "prompt_ids": PROMPTS,
        "output_ids": OUTPUTS,
    }
    t: dict[bool, list[float]] = {True: [], False: []}
    for r in range(5):
        for on in (True, False) if r % 2 else (False, True):
            cfg = GenerationConfig(num_kv_blocks=4096, enable_prefix_caching=on)
            c0 = time.process_time()
            res = replay_generation(cfg, StepCost(5.0), **kw)
            t[on].append(time.process_time() - c0)
            assert int(res.steps.num_cache_hits.sum()) == 0  # every lookup a miss
    tokens = N * 32
    for on in (True, False):
        med = statistics.median(t[on])
        print(
            f"caching {'on ' if on else 'off'}: {[round(x, 3) for x in t[on]]} s, "
            f"{med / tokens * 1e6:.2f} us per output token"
        )


if __name__ == "__main__":
    main()
