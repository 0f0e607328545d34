"""``labserve demo``: a rising load through an embedded model, a table row per rate."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import TYPE_CHECKING

import numpy as np

from labserve.cli._common import numbers

if TYPE_CHECKING:
    from labserve.cli._common import Subcommands

__all__ = ["add_command", "run"]


def add_command(sub: Subcommands) -> None:
    """The ``demo`` subcommand (the embedded model under a rising load)."""
    demo = sub.add_parser("demo", help="ramp a load through an embedded model, live table")
    demo.add_argument(
        "--rates",
        type=numbers(float, "rates"),
        default=[250, 1000, 2000, 4000],
        help="offered req/s, one step each, comma-separated (default 250,1000,2000,4000)",
    )
    demo.add_argument("--step-s", type=float, default=4.0, help="seconds per rate (default 4)")
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Load the embedded sleep model at each of ``args.rates``; print a row per rate."""
    from labserve.base.errors import LoadWarning
    from labserve.lab.demo import SleepModel
    from labserve.load.arrivals import PoissonArrivals
    from labserve.load.generator import load_test
    from labserve.runtime.runner import Runner

    runner = Runner(
        SleepModel(a_ms=2.0, b_ms=0.1), name="demo", max_batch_size=64, max_latency_ms=20
    )
    x = np.ones((1, 16), np.float32)
    # A progress line only on a terminal: piped or redirected output gets the table alone.
    progress = sys.stderr.isatty() and sys.stdout.isatty()
    print("embedded sleep model: 2 ms + 0.1 ms x items per call; adaptive, cap 64, wait cap 20 ms")
    print(f"{'offered':>10} {'served':>10} {'mean batch':>11} {'p50 ms':>8} {'p99 ms':>8} note")
    try:
        for step, rate in enumerate(args.rates, start=1):
            if progress:
                sys.stderr.write(f"\rstep {step}/{len(args.rates)}: {rate:g} req/s ...")
                sys.stderr.flush()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", LoadWarning)
                result = load_test(
                    runner.predict,
                    example=x,
                    duration_s=args.step_s,
                    arrivals=PoissonArrivals(rate),
                    seed=step,
                )
            s = result.summary()
            note = "generator fell behind" if caught else ""
            if progress:
                sys.stderr.write("\r" + " " * 40 + "\r")
            print(
                f"{s['offered_rps']:>10,.0f} {s['served_rps']:>10,.0f} {s['mean_batch']:>11.1f} "
                f"{s['latency_p50_ms']:>8.2f} {s['latency_p99_ms']:>8.2f} {note}",
                flush=True,
            )
    finally:
        runner.stop()
