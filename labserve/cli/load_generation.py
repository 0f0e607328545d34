"""``labserve load`` on a generation URL: its flags, its run and what it prints.

:func:`~labserve.cli.load.run` hands a ``.../v1/completions`` or ``.../v1/chat/completions``
URL here, its common flags checked and ``--input-len`` parsed; the flags only a generation load
reads are added by :func:`add_arguments`. Streamed completions give TTFT, ITL, TPOT and goodput.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from labserve.cli._common import UsageError, schedule_line

__all__ = ["add_arguments", "run"]


def add_arguments(load: argparse.ArgumentParser) -> None:
    """Add the generation flags to the ``load`` command's parser."""
    group = load.add_argument_group("generation (a /v1/completions or /v1/chat/completions URL)")
    group.add_argument(
        "--output-len",
        default="128",
        help="max_tokens per request, fixed with ignore_eos: a length spec as --input-len"
        " (default 128); --input-len is then the prompt's length in bytes (default 32)",
    )
    group.add_argument("--model", help="the model to ask (default: the only one /v1/models lists)")
    group.add_argument(
        "--goodput",
        nargs="+",
        metavar="KEY:MS",
        help="goodput targets, as vllm bench serve: ttft:MS tpot:MS e2el:MS",
    )
    group.add_argument(
        "--burst",
        metavar="RPS:EVERY_S:LENGTH_S",
        help="open loop in bursts: RPS for LENGTH_S seconds every EVERY_S, --rate between",
    )
    group.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="leave ignore_eos out of the requests (for servers that refuse it)",
    )


def run(args: argparse.Namespace) -> Any:
    """Streamed completions to a generation URL; print TTFT, ITL, TPOT and goodput; return it.

    Raises:
        UsageError: a flag breaks its rule (the message names it).
    """
    from labserve.base.errors import LoadInterrupted, LoadWarning
    from labserve.base.lengths import parse_length
    from labserve.load.generation import generation_load_test
    from labserve.load.loop import load_loop

    if args.width is not None or args.binary:
        raise UsageError("--width and --binary are for request loads, not a generation URL")
    arrivals, mode = _arrivals(args)
    sys.stderr.write(f"loading {args.url} for {args.duration:g} s, {mode} ...\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LoadWarning)
        try:
            result = generation_load_test(
                args.url,
                duration_s=args.duration,
                arrivals=arrivals,
                concurrency=args.concurrency,
                input_len=args.input_len if args.input_len is not None else 32,
                output_len=parse_length(args.output_len, name="--output-len"),
                model=args.model,
                goodput=_goodput(args.goodput),
                ignore_eos=not args.no_ignore_eos,
                token=args.token,
                connections=args.connections,
                timeout_s=args.timeout,
                label=f"{args.url}, {mode}",
            )
        except LoadInterrupted as exc:
            print(exc.result.table())
            print(f"interrupted: the load stopped after {exc.sent} requests")
            raise
    print(result.table())
    if arrivals is not None and result.send_lag_s is not None and len(result.send_lag_s):
        print(schedule_line(result.send_lag_s, arrivals.mean_rate(args.duration)))
    for w in caught:
        if not str(w.message).startswith("the load generator could not keep"):
            print(f"  {w.message}")
    print(f"generator: its own event loop ({'uvloop' if load_loop().uvloop else 'asyncio'})")
    return result


def _arrivals(args: argparse.Namespace) -> tuple[Any, str]:
    """The arrival process (None in closed loop) and how the run is described."""
    from labserve.load.arrivals import BurstArrivals, ConstantArrivals, PoissonArrivals

    if args.concurrency:
        if args.burst:
            raise UsageError("--burst is an open loop: give it without --concurrency")
        return None, f"{args.concurrency} clients (closed loop)"
    if args.burst:
        try:
            burst_rps, every_s, length_s = (float(v) for v in args.burst.split(":"))
            process: Any = BurstArrivals(args.rate, burst_rps, every_s, length_s)
        except ValueError as exc:
            said = f"--burst takes RPS:EVERY_S:LENGTH_S, got {args.burst!r} ({exc})"
            raise UsageError(said) from None
        return process, f"{process} (open loop)"
    kind = PoissonArrivals if args.arrivals == "poisson" else ConstantArrivals
    return kind(args.rate), f"{args.arrivals} {args.rate:g} req/s (open loop)"


def _goodput(fields: list[str] | None) -> dict[str, float]:
    from labserve.load.generation.goodput import parse_goodput

    try:
        return parse_goodput(fields)
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None
