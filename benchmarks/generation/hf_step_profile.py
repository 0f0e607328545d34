"""``profile_steps`` on the Hugging Face models of the `transformers serve` comparison (issue 32).

The batched step's shape: its cost against sequences, new tokens and context, measured by
:func:`labserve.lab.steps.profile_steps` on ``hf_folder.FolderLM`` (the GPT-2 and the
Llama of ``vs_transformers.py``, from their folders, torch on one thread), over its default
shapes plus a decode at context 128 with 1 and with 32 sequences (issue 32's "32 sequences
x context 128 against 1": about 30x before the step was batched). Each shape twice: timed by
the wall clock and by the process's CPU time (one torch thread, so the CPU time is the step's
work; the machine's load moves it much less than the wall time).

    .venv/bin/python benchmarks/generation/hf_step_profile.py --repeats 7 \\
        --json benchmarks/generation/hf_step_profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DECODE_1, DECODE_32 = (1, 1, 127), (32, 1, 127)
"""Decodes at context 128: 127 cached tokens and the new one."""


def profile(kind: str, folder: Path, repeats: int) -> dict[str, Any]:
    from hf_folder import FolderLM, build

    from labserve.lab.steps import DEFAULT_SHAPES, profile_steps

    if not (folder / "config.json").exists():
        build(kind, folder)
    os.environ["LABSERVE_HF_FOLDER"] = str(folder)
    model = FolderLM()
    shapes = [*DEFAULT_SHAPES, DECODE_1, DECODE_32]
    out: dict[str, Any] = {"load_average_before": os.getloadavg()[0]}
    for clock, timer in (("wall", time.perf_counter), ("cpu", time.process_time)):
        prof = profile_steps(model, shapes=shapes, repeats=repeats, timer=timer)
        print(f"{kind}, {clock} time:\n{prof.table()}", flush=True)
        ms = {(p.num_seqs, p.new_tokens, p.start): p.median_s * 1000 for p in prof.points}
        out[clock] = {
            "points": [
                {
                    "seqs": p.num_seqs,
                    "new": p.new_tokens,
                    "cached": p.start,
                    "ms": p.median_s * 1000,
                    "spread_ms": p.spread_s * 1000,
                }
                for p in prof.points
            ],
            "fit_ms": {
                "fixed": prof.fit.fixed_ms,
                "per_seq": prof.fit.per_seq_ms,
                "per_new_token": prof.fit.per_batched_token_ms,
                "per_context_token": prof.fit.per_context_token_ms,
            },
            "decode_32_over_1_at_context_128": ms[DECODE_32] / ms[DECODE_1],
        }
        print(f"{kind}: decode 32 / 1 at context 128 ({clock}):"
              f" {out[clock]['decode_32_over_1_at_context_128']:.2f}x", flush=True)  # fmt: skip
    out["load_average_after"] = os.getloadavg()[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--folders", type=Path, default=Path(tempfile.gettempdir()) / "vs_tf")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
    ).stdout.strip()
    record: dict[str, Any] = {"command": " ".join(sys.argv), "commit": commit, "models": {}}
    for kind in args.models.split(","):
        record["models"][kind] = profile(kind, args.folders / kind, args.repeats)
        if args.json:
            args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
