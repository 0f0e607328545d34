"""Where a served HF step's time goes: the model, sampling, the hand-off, the loop (issue 32).

``--streams`` concurrent greedy generations (64-byte prompt, 64 tokens, ``--waves`` each)
through a ``labserve.Runner`` on ``hf_folder.FolderLM`` (GPT-2 by default), with the
driver's step, the model's ``generate``, the sampling and the worker-to-loop hand-off
(``LoopHost.call_soon_threadsafe``) each timed by the wall clock and by its thread's CPU
clock (wrapped from outside: nothing in labserve changes). The process's CPU less the
step's is the loop's share (planning, streaming).

    .venv/bin/python benchmarks/generation/hf_step_parts.py --streams 1 --waves 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PARTS = ("step", "generate", "sample", "hand-off")


def timed(owner: Any, name: str, part: str, acc: dict[str, list[float]]) -> None:
    """Wrap ``owner.name`` so that each call adds its wall and thread-CPU seconds to ``part``."""
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            acc[part][0] += time.perf_counter() - t0
            acc[part][1] += time.thread_time() - c0
            acc[part][2] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--waves", type=int, default=10)
    parser.add_argument("--folders", type=Path, default=Path(tempfile.gettempdir()) / "vs_tf")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from hf_folder import FolderLM, build

    import labserve
    from labserve.runtime.generation.driver import GenerationDriver
    from labserve.runtime.scheduling import LoopHost

    folder = args.folders / args.model
    if not (folder / "config.json").exists():
        build(args.model, folder)
    os.environ["LABSERVE_HF_FOLDER"] = str(folder)
    acc = {part: [0.0, 0.0, 0] for part in PARTS}
    timed(GenerationDriver, "_run_step", "step", acc)
    timed(GenerationDriver, "_sample", "sample", acc)
    timed(FolderLM, "generate", "generate", acc)
    timed(LoopHost, "call_soon_threadsafe", "hand-off", acc)
    runner = labserve.Runner(
        FolderLM(), name="lm", method_configs={"generate": {"max_num_seqs": 32}}
    )
    prompt = "".join(chr(97 + (7 * i) % 26) for i in range(64))

    async def stream() -> None:
        for _ in range(args.waves):
            await runner.generate.async_run(prompt, max_tokens=64, temperature=0)

    async def streams() -> None:
        await asyncio.gather(*(stream() for _ in range(args.streams)))

    t0, c0 = time.perf_counter(), time.process_time()
    try:
        runner.bg.run(streams())
    finally:
        runner.stop()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = int(acc["step"][2])
    tokens = args.streams * args.waves * 64
    print(f"{args.streams} streams, {steps} steps, load {os.getloadavg()[0]:.1f}:"
          f" {tokens / wall:.0f} tokens/s, process CPU {cpu * 1000 / steps:.3f} ms/step,"
          f" wall {wall * 1000 / steps:.3f} ms/step")  # fmt: skip
    for part in PARTS:
        w, c, _ = acc[part]
        print(
            f"  {part:>9}: wall {w * 1000 / steps:.3f} ms/step, CPU {c * 1000 / steps:.3f} ms/step"
        )
    loop_cpu = cpu - acc["step"][1]
    print(f"  {'loop':>9}: CPU {loop_cpu * 1000 / steps:.3f} ms/step (the process less the step)")


if __name__ == "__main__":
    main()
