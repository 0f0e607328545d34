"""The decode step of 32 sequences at context 128: labserve's HFDecoder against transformers' own
continuous batching, side by side in one process (issue 32's step target).

Both engines get the same work: 32 prompts of 127 tokens, greedy, run once with 1 new token
and once with 65; the difference is 64 decode steps of 32 sequences at contexts 128 to 191
(the prefill and each engine's start-up cancel out). labserve: 32 concurrent generations
through a ``labserve.Runner`` on ``hf_folder.FolderLM`` (``max_num_seqs`` 32, so one step
carries all 32). transformers: ``model.generate_batch`` (its ``ContinuousBatchingManager``,
``ContinuousBatchingConfig(num_blocks=128)``, as in the served comparison), on the same
weights. Figures: the process's CPU time per decode step (one torch thread for both: the CPU
time is the engine's work, driver and all; the machine's load moves it much less than the
wall time) and the wall time per step.
Alternating, ``--rounds`` each, medians.

    .venv/bin/python benchmarks/generation/decode_step_vs_transformers.py --rounds 3 \\
        --json benchmarks/generation/decode_step_vs_transformers.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
N, PROMPT, STEPS = 32, 127, 64


def _timed(run: Callable[[int], None]) -> tuple[float, float]:
    """Wall and CPU ms per decode step: ``run(1 + STEPS)`` less ``run(1)``, over STEPS."""
    costs = []
    for new in (1, 1 + STEPS):
        t0, c0 = time.perf_counter(), time.process_time()
        run(new)
        costs.append((time.perf_counter() - t0, time.process_time() - c0))
    (w1, c1), (w65, c65) = costs
    return (w65 - w1) * 1000 / STEPS, (c65 - c1) * 1000 / STEPS


def labserve_run(model: Any, prompts: list[list[int]]) -> Callable[[int], None]:
    import labserve

    def run(new: int) -> None:
        config = {"generate": {"max_num_seqs": N, "max_num_batched_tokens": N * PROMPT}}
        runner = labserve.Runner(model, name=f"lm{new}", method_configs=config)
        try:

            async def together() -> list[Any]:
                calls = [
                    runner.generate.async_run(p, max_tokens=new, temperature=0) for p in prompts
                ]
                return await asyncio.gather(*calls)

            got = runner.bg.run(together())
        finally:
            runner.stop()
        if any(len(c.token_ids) != new for c in got):
            raise RuntimeError("labserve: a generation of the wrong length")

    return run


def transformers_run(model: Any, prompts: list[list[int]]) -> Callable[[int], None]:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    def run(new: int) -> None:
        config = GenerationConfig(do_sample=False, max_new_tokens=new, eos_token_id=None)
        # 128 blocks of 256 tokens: its default sizes the cache from 80-90% of free RAM on CPU.
        cb = ContinuousBatchingConfig(num_blocks=128)
        got = model.generate_batch(
            prompts, generation_config=config, continuous_batching_config=cb, max_new_tokens=new
        )
        if len(got) != N or any(len(o.generated_tokens) != new for o in got.values()):
            raise RuntimeError("transformers: a generation of the wrong length")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--folders", type=Path, default=Path(tempfile.gettempdir()) / "vs_tf")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from hf_folder import FolderLM, build

    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, PROMPT).tolist() for _ in range(N)]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
    ).stdout.strip()
    record: dict[str, Any] = {"command": " ".join(sys.argv), "commit": commit, "models": {}}
    for kind in args.models.split(","):
        folder = args.folders / kind
        if not (folder / "config.json").exists():
            build(kind, folder)
        os.environ["LABSERVE_HF_FOLDER"] = str(folder)
        ours = FolderLM()  # sets torch to one thread, for the whole process: both engines
        runs = {
            "labserve": labserve_run(ours, prompts),
            "transformers": transformers_run(ours.model, prompts),
        }
        rounds = []
        for r in range(args.rounds):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            this: dict[str, Any] = {"load_average": os.getloadavg()[0]}
            for which in order:
                wall, cpu = _timed(runs[which])
                this[which] = {"wall_ms": wall, "cpu_ms": cpu}
                print(
                    kind, r + 1, which, f"wall {wall:.2f} ms, CPU {cpu:.2f} ms per step", flush=True
                )
            rounds.append(this)
        med = {
            w: {k: statistics.median(rd[w][k] for rd in rounds) for k in ("wall_ms", "cpu_ms")}
            for w in runs
        }
        med["ratio"] = {
            k: med["labserve"][k] / med["transformers"][k] for k in ("wall_ms", "cpu_ms")
        }
        print(kind, "medians", med, flush=True)
        record["models"][kind] = {"rounds": rounds, "medians": med}
        if args.json:
            args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
