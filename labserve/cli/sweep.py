"""``labserve sweep``: a simulated grid of caps, strategies and rates, as a table or a CSV."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import os
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from labserve.base.vocabulary import STRATEGIES
from labserve.cli._common import UsageError, numbers

if TYPE_CHECKING:
    from labserve.cli._common import Subcommands

__all__ = ["add_command", "run"]


def add_command(sub: Subcommands) -> None:
    """The ``sweep`` subcommand (a simulated grid of settings)."""
    sweep = sub.add_parser("sweep", help="a simulated grid of caps, strategies and rates")
    sweep.add_argument(
        "--rates",
        type=numbers(float, "rates"),
        required=True,
        help="offered req/s to try, comma-separated, e.g. 500,1000,2000",
    )
    sweep.add_argument(
        "--strategies",
        type=_strategies,
        default=["adaptive"],
        help=f"comma-separated, among {','.join(STRATEGIES)} (default adaptive)",
    )
    sweep.add_argument(
        "--max-batch-size",
        type=numbers(int, "max-batch-size"),
        default=[32],
        help="caps to try, items per batch, comma-separated (default 32)",
    )
    sweep.add_argument(
        "--max-latency-ms",
        type=numbers(float, "max-latency-ms"),
        default=[10.0],
        help="wait caps to try, ms, comma-separated (default 10)",
    )
    sweep.add_argument(
        "--duration", type=float, default=10.0, help="seconds of load per point (default 10)"
    )
    sweep.add_argument("--workers", type=int, default=1, help="run points in N processes")
    sweep.add_argument("--ray", action="store_true", help="run points as Ray tasks (labserve[ray])")
    sweep.add_argument("--ray-address", help="with --ray: join this cluster (default: start one)")
    sweep.add_argument(
        "--cost",
        type=_cost,
        default=(2.0, 0.1),
        help="the simulated model's cost: a_ms,b_ms for a_ms + b_ms x items per call "
        "(default 2,0.1)",
    )
    sweep.add_argument("--seed", type=int, default=0, help="the arrivals' random seed (default 0)")
    sweep.add_argument("--csv", help="write the table to this CSV file")
    sweep.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Simulate every point of the grid ``args`` give; print the table or write the CSV."""
    from labserve.lab.sweep import COLUMNS, format_table, sweep

    with contextlib.ExitStack() as stack:
        executor = _sweep_executor(args, stack)
        # A real progress bar on a terminal (tqdm); none when stderr is not one.
        bar = stack.enter_context(tqdm(desc="simulating", unit="point", disable=None))

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        rows = sweep(
            rates=args.rates,
            strategies=args.strategies,
            max_batch_size=[int(v) for v in args.max_batch_size],
            max_latency_ms=args.max_latency_ms,
            duration_s=args.duration,
            cost=args.cost,
            seed=args.seed,
            progress=progress,
            executor=executor,
        )
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        print(
            f"wrote {len(rows)} rows ({len(COLUMNS)} columns: {', '.join(COLUMNS)}) "
            f"to {os.path.abspath(args.csv)}"
        )
    else:
        print(format_table(rows))


def _sweep_executor(
    args: argparse.Namespace, stack: contextlib.ExitStack
) -> concurrent.futures.Executor | None:
    """Where the points run: here (None), in ``--workers`` processes, or as Ray tasks."""
    if args.ray:
        try:
            # Optional: the `ray` extra. Imported only when asked for (--ray).
            from labserve.ray import cluster
            from labserve.ray.executor import RayExecutor
        except ImportError as exc:
            raise UsageError(
                f"--ray needs the ray extra: pip install 'labserve[ray]' ({exc})"
            ) from exc
        owned = cluster.start(address=args.ray_address, proxy=False)
        stack.callback(cluster.stop, owned=owned)
        return stack.enter_context(RayExecutor())
    if args.workers > 1:
        return stack.enter_context(concurrent.futures.ProcessPoolExecutor(args.workers))
    return None


def _cost(text: str) -> tuple[float, float]:
    """``a_ms,b_ms``: the model's cost per call and per item, both >= 0, a_ms > 0."""
    parts = [v.strip() for v in text.split(",")]
    try:
        a_ms, b_ms = (float(v) for v in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cost must be two numbers a_ms,b_ms (ms per call, ms per item), e.g. 2,0.1; "
            f"got {text!r}"
        ) from None
    if not (a_ms > 0 and b_ms >= 0) or not all(map(np.isfinite, (a_ms, b_ms))):
        raise argparse.ArgumentTypeError(
            f"cost needs a_ms > 0 and b_ms >= 0 (finite), got {text!r}"
        )
    return a_ms, b_ms


def _strategies(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in STRATEGIES]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"strategies must be among {', '.join(STRATEGIES)}, got {text!r}"
        )
    return names
