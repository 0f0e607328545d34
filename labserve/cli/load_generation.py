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
    _add_workload_arguments(load)


def _add_workload_arguments(load: argparse.ArgumentParser) -> None:
    group = load.add_argument_group(
        "shared prefixes and sessions (a generation URL)",
        "Prompts that share prefixes, as SGLang's generated-shared-prefix dataset: each "
        "request (a session with --turns) takes one of --num-prefixes prefixes of "
        "--prefix-len tokens, then its own --input-len message. With --turns T each session "
        "sends T turns, each resending the whole history with the server's replies, "
        "--think-time seconds after the last reply. Seeded by --seed.",
    )
    group.add_argument(
        "--prefix-len",
        type=int,
        metavar="N",
        help="tokens (bytes) of the shared prefix (default 0: none)",
    )
    group.add_argument(
        "--num-prefixes",
        type=int,
        metavar="K",
        help="distinct prefixes: tenants or system prompts (default 1; needs --prefix-len)",
    )
    group.add_argument(
        "--prefix-dist",
        metavar="uniform|zipf:S",
        help="how a request picks its prefix (default uniform; zipf:1.1 makes a hot tenant)",
    )
    group.add_argument(
        "--turns",
        type=int,
        metavar="T",
        help="turns per session, each resending the history (default 1)",
    )
    group.add_argument(
        "--think-time",
        type=float,
        metavar="S",
        help="seconds between a reply and the session's next turn (default 0; needs --turns)",
    )
    group.add_argument(
        "--seed", type=int, default=0, help="fixes arrivals, lengths and prompts (default 0)"
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
    workload = _workload(args)
    if workload is not None:
        mode += f", {workload.turns} turn(s) a session" if workload.turns > 1 else ""
        mode += f", {workload.num_prefixes} prefix(es) of {workload.prefix_len} tokens"
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
                seed=args.seed,
                workload=workload,
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


# The workload's settings, by the flag that gives them.
_WORKLOAD_FLAGS = {
    "prefix_len": "--prefix-len",
    "num_prefixes": "--num-prefixes",
    "prefix_dist": "--prefix-dist",
    "turns": "--turns",
    "think_time_s": "--think-time",
    "seed": "--seed",
}


def _workload(args: argparse.Namespace) -> Any:
    """The shared-prefix workload the flags ask for (None when they ask for none)."""
    from labserve.base.lengths import parse_length
    from labserve.generation.workload import SharedPrefixWorkload

    given = {
        "prefix_len": args.prefix_len,
        "num_prefixes": args.num_prefixes,
        "prefix_dist": args.prefix_dist,
        "turns": args.turns,
        "think_time_s": args.think_time,
    }
    if all(v is None for v in given.values()):
        return None
    if args.num_prefixes is not None and not args.prefix_len:
        raise UsageError("--num-prefixes needs --prefix-len (the prefixes' length in tokens)")
    if args.prefix_dist is not None and not args.prefix_len:
        raise UsageError("--prefix-dist needs --prefix-len (the prefixes' length in tokens)")
    if args.think_time is not None and (args.turns or 1) < 2:
        raise UsageError("--think-time needs --turns 2 or more (it is the wait between turns)")
    settings = {k: v for k, v in given.items() if v is not None}
    try:
        return SharedPrefixWorkload(
            **settings,
            input_len=args.input_len if args.input_len is not None else 32,
            output_len=parse_length(args.output_len, name="--output-len"),
            seed=args.seed,
        )
    except (ValueError, TypeError) as exc:
        said = str(exc)
        for name, flag in _WORKLOAD_FLAGS.items():
            if said.startswith(name):
                said = flag + said[len(name) :]
        raise UsageError(said) from None


def _goodput(fields: list[str] | None) -> dict[str, float]:
    from labserve.load.generation.goodput import parse_goodput

    try:
        return parse_goodput(fields)
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None
