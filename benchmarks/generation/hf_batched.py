"""HFDecoder batched on paged K/V against main's per-sequence HFDecoder, in one run (issue 32).

The model: ``GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=256)``, random weights
from ``torch.manual_seed(0)``, no end token (lengths are exact). Two measures, old and new
alternating within each round:

1. **Step cost**: one decode step at context 128 (127 cached tokens + 1 new) with 32
   sequences and with 1, called directly (the new decoder on its own shuffled block tables,
   the old on its per-sequence caches, each repeat rolled back), median of ``--repeats``.
   The figure: the 32-sequence step over the 1-sequence step (about 30x before).
2. **Tokens/s in process**: 1, 2, 4, 8, 16 and 32 concurrent greedy generations through a
   ``labserve.Runner`` (64-token prompts, 64 output tokens, ``max_num_seqs=32``): output
   tokens over the wall time from the first call to the last answer, and over the process's
   CPU time (which the machine's other load moves much less).

"Old" is ``labserve/lab/hf.py`` at ``--old-ref`` (read with ``git show``, loaded as a module
of its own beside today's labserve), so only the decoder differs. Torch on one thread for
both (HFDecoder's default). The machine is shared: the load average is kept per round.

    .venv/bin/python benchmarks/generation/hf_batched.py --rounds 3 \
        --json benchmarks/generation/hf_batched.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

import labserve
from labserve.generation.batch import SeqBatch
from labserve.lab.hf import HFDecoder

ROOT = Path(__file__).resolve().parents[2]
CONCURRENCY = (1, 2, 4, 8, 16, 32)
PROMPT, OUTPUT, CONTEXT = 64, 64, 128


def old_decoder_class(ref: str) -> Any:
    """``HFDecoder`` as ``labserve/lab/hf.py`` was at ``ref``."""
    source = subprocess.run(
        ["git", "show", f"{ref}:labserve/lab/hf.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "hf_old.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("hf_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hf_old"] = module
    spec.loader.exec_module(module)
    return module.HFDecoder


def model() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=4, n_embd=256, n_head=4, vocab_size=256, bos_token_id=None, eos_token_id=None
    )
    return transformers.GPT2LMHeadModel(config).eval()


def step_ms(decoder: Any, n: int, repeats: int, paged: bool) -> tuple[float, float]:
    """Median wall and CPU ms of one decode step of ``n`` sequences at context ``CONTEXT``."""
    rng = np.random.default_rng(n)
    ids = tuple(range(n))
    ctx = [rng.integers(0, 256, CONTEXT, dtype=np.int64) for _ in ids]
    tables: tuple[tuple[int, ...], ...] = ()
    block = 0
    if paged:
        block = 16
        per = CONTEXT // block
        decoder.allocate_kv(n * per, block)
        order = rng.permutation(n * per)
        tables = tuple(tuple(int(b) for b in order[i * per : (i + 1) * per]) for i in ids)
    last = CONTEXT - 1
    prefill = SeqBatch(ids, tuple(c[:last] for c in ctx), (0,) * n, (False,) * n, tables, block)
    decoder.generate(prefill)
    step = SeqBatch(ids, tuple(c[last:] for c in ctx), (last,) * n, (True,) * n, tables, block)
    times, cpu = [], []
    for i in range(repeats + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        decoder.generate(step)
        elapsed, used = time.perf_counter() - t0, time.process_time() - c0
        if not paged:
            decoder.rollback_step(step)  # the paged step rewrites its slots: nothing to undo
        if i:
            times.append(elapsed * 1000)
            cpu.append(used * 1000)
    if not paged:
        decoder.free_sequences(ids)
    return statistics.median(times), statistics.median(cpu)


def tokens_per_s(decoder: Any, concurrency: int, name: str) -> tuple[float, float]:
    """Output tokens per wall second and per CPU second (the whole process) of
    ``concurrency`` greedy generations started together."""
    runner = labserve.Runner(decoder, name=name, method_configs={"generate": {"max_num_seqs": 32}})
    rng = np.random.default_rng(concurrency)
    prompts = [rng.integers(0, 256, PROMPT).tolist() for _ in range(concurrency)]
    try:

        async def together() -> list[Any]:
            calls = (
                runner.generate.async_run(p, max_tokens=OUTPUT, temperature=0) for p in prompts
            )
            return await asyncio.gather(*calls)

        t0, c0 = time.perf_counter(), time.process_time()
        got = runner.bg.run(together())
        elapsed, used = time.perf_counter() - t0, time.process_time() - c0
    finally:
        runner.stop()
    assert all(len(c.token_ids) == OUTPUT for c in got)
    tokens = sum(len(c.token_ids) for c in got)
    return tokens / elapsed, tokens / used


def one_round(lm: Any, old_cls: Any, repeats: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {"old": {}, "new": {}}
    for which, cls in (("old", old_cls), ("new", HFDecoder)):
        fig = out[which]
        for n in (1, 32):
            wall, cpu = step_ms(cls(lm), n, repeats, paged=which == "new")
            fig[f"step_ms_{n}"], fig[f"step_cpu_ms_{n}"] = wall, cpu
        fig["step_ratio_32_to_1"] = fig["step_ms_32"] / fig["step_ms_1"]
        fig["step_cpu_ratio_32_to_1"] = fig["step_cpu_ms_32"] / fig["step_cpu_ms_1"]
        for c in CONCURRENCY:
            wall, cpu = tokens_per_s(cls(lm), c, f"{which}{c}")
            fig[f"tokens_per_s_{c}"], fig[f"tokens_per_cpu_s_{c}"] = wall, cpu
        print(which, {k: round(v, 2) for k, v in fig.items()}, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--old-ref", default="3229be5", help="the commit of the old hf.py")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    old_cls = old_decoder_class(args.old_ref)
    lm = model()
    rounds = []
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        print(f"round {r + 1}, load average {load:.1f}", flush=True)
        rounds.append({"load_average": load, **one_round(lm, old_cls, args.repeats)})
    medians = {
        which: {k: statistics.median(rd[which][k] for rd in rounds) for k in rounds[0][which]}
        for which in ("old", "new")
    }
    print("| figure | old (per sequence) | new (batched) | new / old |\n|---|---:|---:|---:|")
    for k in medians["old"]:
        o, n = medians["old"][k], medians["new"][k]
        print(f"| {k} | {o:,.2f} | {n:,.2f} | {n / o:.2f}x |")
    if args.json:
        record = {
            "command": " ".join(sys.argv),
            "old_ref": args.old_ref,
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip(),
            "torch_threads": torch.get_num_threads(),
            "rounds": rounds,
            "medians": medians,
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
