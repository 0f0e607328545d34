"""One TinyLM step on paged KV, called directly: CPU time and page faults per step.

Shapes (``--shapes``, any of):
- ``inter``: a decode step of 32 sequences at context 160, their blocks interleaved (block b
  of sequence i is pool block b * 32 + i: what 32 sequences growing side by side get);
- ``run``: the same with each table one run of consecutive blocks;
- ``spread``: 32 sequences at contexts spread evenly over 32-288, interleaved (what 64
  streams of 256 tokens keep running);
- ``prefill``: two 256-token prompts in one step (issue 33 (c)'s prefill steps).

Each shape in a fresh process of the tree given (``PYTHONPATH``; a tree from before issue
32 keeps a cache per sequence and gets no tables), so that the trees alternate and each
one's allocator starts cold; the median and the minimum of ``--steps``
steps after 5 uncounted, and the minor page faults per step. A digest of each tree's logits
is printed: trees with the same weights must agree (``3229be5`` has seeded weights, the
trained ones came later).

    .venv/bin/python benchmarks/generation/kv_step.py --trees /tmp/main . --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

SHAPES = ("inter", "run", "spread", "prefill")


def one(shape: str, steps: int) -> dict[str, Any]:
    """Run ``shape`` in this process; its figures and a digest of its logits."""
    import hashlib
    import resource
    import time

    import numpy as np

    from labserve.generation.batch import SeqBatch
    from labserve.lab.tinylm import TinyLM

    size, rng = 16, np.random.default_rng(0)
    lm = TinyLM()
    paged = hasattr(lm, "allocate_kv")  # a tree before issue 32 keeps a cache per sequence
    if paged:
        lm.allocate_kv(2048, size)
    if shape == "prefill":
        ctxs, tables = [256, 256], [tuple(range(16)), tuple(range(16, 32))]
    else:
        ctxs = [int(c) for c in np.linspace(32, 288, 32)] if shape == "spread" else [160] * 32
        tables = [
            tuple(i * 64 + b if shape == "run" else b * 32 + i for b in range(-(-c // size)))
            for i, c in enumerate(ctxs)
        ]
    ids = tuple(range(len(ctxs)))
    first = 0 if shape == "prefill" else 1
    prompts = tuple(rng.integers(32, 120, c - first).astype(np.int64) for c in ctxs)
    where = (tuple(tables), size) if paged else ()
    fill = SeqBatch(ids, prompts, (0,) * len(ids), (True,) * len(ids), *where)
    step = fill
    if shape != "prefill":
        lm.generate(fill)
        new = tuple(np.array([65], np.int64) for _ in ids)
        starts = tuple(c - 1 for c in ctxs)
        step = SeqBatch(ids, new, starts, (True,) * len(ids), *where)
    for _ in range(5):
        logits = lm.generate(step)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    took = []
    for _ in range(steps):
        t = time.process_time()
        lm.generate(step)
        took.append(time.process_time() - t)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {
        "median_ms": statistics.median(took) * 1e3,
        "min_ms": min(took) * 1e3,
        "faults_per_step": faults / steps,
        "logits": hashlib.sha256(np.ascontiguousarray(logits).tobytes()).hexdigest()[:16],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path(".")])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child, args.steps)))
        return
    rows = []
    for r in range(args.rounds):
        for shape in args.shapes.split(","):
            for tree in args.trees if r % 2 == 0 else args.trees[::-1]:
                env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
                argv = [sys.executable, __file__, "--child", shape, "--steps", str(args.steps)]
                done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
                row = {"round": r, "shape": shape, "tree": str(tree), "load": os.getloadavg()[0]}
                row |= json.loads(done.stdout.splitlines()[-1])
                print(json.dumps(row), flush=True)
                rows.append(row)
    for shape in args.shapes.split(","):
        print(f"{shape}:")
        for tree in args.trees:
            mine = [row for row in rows if row["shape"] == shape and row["tree"] == str(tree)]
            med = statistics.median(row["median_ms"] for row in mine)
            faults = statistics.median(row["faults_per_step"] for row in mine)
            digests = ",".join(sorted({row["logits"] for row in mine}))
            print(f"  {tree}: {med:.2f} ms CPU a step (median of rounds), {faults:.0f} faults,")
            print(f"    logits {digests}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
