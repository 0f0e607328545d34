"""What a cached prefix still costs the model: 80 new tokens after 688 cached against 80 alone.

Issue 33's target (a) asks the TTFT p50 of a request whose 688-token prefix is cached to be at
most 1.15x that of its 80-token tail sent alone. Whatever the scheduler does, the hit's new
tokens attend over 768 positions where the tail's attend over 80; this measures that floor,
the model's forward alone (CPU time, one torch thread, median of ``--repeats``), for GPT-2
shapes of growing width: the attention over the prefix is a fixed share per layer width, the
dense layers grow with its square, so the ratio falls as models grow.

    .venv/bin/python benchmarks/generation/prefix_bound.py \
        --json benchmarks/generation/prefix_bound.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

SHAPES = [(256, 4, 4), (512, 6, 8), (768, 12, 12), (1024, 12, 16), (2048, 8, 16)]
"""(width, layers, heads): issue 32's test folder, then GPT-2 small's width and past it."""


def forward_ms(model: GPT2LMHeadModel, new: int, cached: int, repeats: int) -> float:
    """Median CPU ms of one forward of ``new`` tokens after ``cached`` cached ones."""
    ids = torch.randint(0, model.config.vocab_size, (1, cached + new))
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 2):  # two warm-ups
            cache = DynamicCache()
            if cached:
                model(ids[:, :cached], past_key_values=cache, use_cache=True, logits_to_keep=1)
            start = time.process_time()
            # Logits of the last position only, as a server's prefill step computes them.
            model(ids[:, cached:], past_key_values=cache, use_cache=True, logits_to_keep=1)
            times.append((time.process_time() - start) * 1000.0)
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=80)
    parser.add_argument("--cached", type=int, default=688)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for width, layers, heads in SHAPES:
        config = GPT2Config(n_embd=width, n_layer=layers, n_head=heads, n_positions=1024)
        model = GPT2LMHeadModel(config).eval()
        hit = forward_ms(model, args.new, args.cached, args.repeats)
        tail = forward_ms(model, args.new, 0, args.repeats)
        rows.append(
            {"width": width, "layers": layers, "hit_ms": hit, "tail_ms": tail, "ratio": hit / tail}
        )
        print(
            f"width {width:>4} x {layers:>2} layers: {args.new} tokens after {args.cached} "
            f"cached {hit:7.2f} ms, alone {tail:7.2f} ms: {hit / tail:.2f}x",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"new": args.new, "cached": args.cached, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
