"""``labserve load URL``: open- or closed-loop load on an HTTP endpoint, and what it saw.

A request URL (``.../runners/{name}/{method}``, ``.../v2/models/{name}/infer``) gets rows of
float32 and a latency summary beside the server's batching; a generation URL
(``.../v1/completions`` or ``.../v1/chat/completions``) gets streamed completions and TTFT,
ITL, TPOT and goodput. The flags only a generation load reads are in their own group.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import sys
import urllib.parse
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from labserve.cli import load_generation
from labserve.cli._common import (
    FAILED_RUN,
    UsageError,
    check_run,
    loop_choice,
    schedule_line,
)
from labserve.runtime.loop import LOOP_KINDS, BackgroundLoop

if TYPE_CHECKING:
    from labserve.cli._common import Subcommands

__all__ = ["add_command", "run"]

_RATE = 100.0  # an open loop's req/s when neither --rate nor --concurrency is given


def add_command(sub: Subcommands) -> None:
    """The ``load`` subcommand (open- or closed-loop load on an HTTP endpoint)."""
    load = sub.add_parser(
        "load",
        help="open- or closed-loop load on an HTTP endpoint",
        description="Open- or closed-loop load on an HTTP endpoint, and what it saw.",
        epilog=FAILED_RUN,
    )
    load.add_argument(
        "url",
        help=".../runners/{name}/{method}, .../v2/models/{name}/infer, or .../v1/completions"
        " (or chat) of any OpenAI-compatible server",
    )
    load.add_argument(
        "--rate", type=float, help=f"open loop req/s (default {_RATE:g}; not with --concurrency)"
    )
    load.add_argument(
        "--arrivals",
        choices=("poisson", "constant"),
        help="open loop process (default poisson; not with --concurrency)",
    )
    load.add_argument(
        "--concurrency", type=int, help="closed loop with N clients instead of --rate"
    )
    load.add_argument("--duration", type=float, default=5.0, help="seconds (default 5)")
    load.add_argument(
        "--width", type=int, help="float32 values per row (default 4; v2: from the metadata)"
    )
    load.add_argument(
        "--binary", action="store_true", help="v2 binary tensors (.npy on the simple route)"
    )
    load.add_argument(
        "--input-len",
        help="a length mix for a method with a ragged axis: each row its own length, e.g."
        " 64, uniform:1:512, lognormal:16:128, list:8,16,32 (simple route)",
    )
    load.add_argument("--token", help="sent as Authorization: Bearer (servers off loopback)")
    load.add_argument(
        "--connections",
        type=int,
        help="most connections open at once (default: N clients; open loop: 64 opened "
        "ahead, more as needed up to half of ulimit -n, at most 512)",
    )
    load.add_argument("--timeout", type=float, default=10.0, help="per request, s (default 10)")
    load.add_argument("--json", help="also write the summary and the server's view to this file")
    load.add_argument(
        "--loop",
        choices=LOOP_KINDS,
        default="auto",
        help="the generator's event loop (auto: uvloop if installed)",
    )
    load_generation.add_arguments(load)
    load.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Check the flags, run the load the URL calls for and print what it saw."""
    from labserve.load.generation import is_generation_url

    if not args.url.startswith(("http://", "https://")):
        raise UsageError(f"URL must start with http:// or https://, got {args.url!r}")
    for name in ("rate", "timeout", "width", "connections", "concurrency"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name} must be > 0, got {value:g}")
    if args.input_len is not None:
        from labserve.base.lengths import parse_length

        try:
            args.input_len = parse_length(args.input_len, name="--input-len")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    _one_loop(args)
    if is_generation_url(args.url):  # streamed completions: TTFT, ITL, TPOT, goodput
        with loop_choice(args.loop):
            result = load_generation.run(args)
    else:
        _not_a_generation_typo(args.url)
        result = _run_requests(args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": result.summary(), "server": result.server}, f, indent=1)
    check_run(result.outcome, args.url)


def _one_loop(args: argparse.Namespace) -> None:
    """An open loop (--rate, --arrivals) or a closed one (--concurrency), not both."""
    if args.concurrency is not None:
        given = [f for f in ("rate", "arrivals") if getattr(args, f) is not None]
        if given:
            flags = " and ".join(f"--{f}" for f in given)
            raise UsageError(
                f"{flags} (an open loop: requests at a rate, whatever the replies) and "
                "--concurrency (a closed loop: N clients, each sending when answered) ask for "
                f"two different loads: give {flags} or --concurrency"
            )
    args.rate = _RATE if args.rate is None else args.rate
    args.arrivals = args.arrivals or "poisson"


def _not_a_generation_typo(url: str) -> None:
    """A path under /v1/ that is not a generation path is a typo, not a request load."""
    from labserve.load.generation.prompts import CHAT_PATH, COMPLETIONS_PATH

    path = urllib.parse.urlsplit(url).path.rstrip("/")
    known = (COMPLETIONS_PATH, CHAT_PATH)
    tail = path[path.find("/v1") :] if "/v1" in path else path
    near = difflib.get_close_matches(tail, known, n=1, cutoff=0.6)
    if not near and "complet" not in path and "/chat" not in path:
        return  # any other server's request path
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise UsageError(
        f"{path!r} is not a generation path{hint}: a generation load goes to "
        f"{' or '.join(known)}; a request load to .../runners/{{runner}}/{{method}} or "
        ".../v2/models/{model}/infer"
    )


def _run_requests(args: argparse.Namespace) -> Any:
    """Rows of float32 to a request URL; print the summary and whose batching; return it."""
    from labserve.base.errors import LoadInterrupted, LoadTargetError, LoadWarning
    from labserve.load.arrivals import ConstantArrivals, PoissonArrivals
    from labserve.load.generator import load_loop, load_test
    from labserve.load.http import NO_INPUTS

    rows = np.ones((1, args.width or 4), np.float32)
    # A v2 model's metadata gives its inputs; float32 rows stand in when it declares none.
    example = rows if (args.width or "/v2/models/" not in args.url) else None
    if args.concurrency:
        mode = f"{args.concurrency} clients (closed loop)"
    else:
        mode = f"{args.arrivals} {args.rate:g} req/s (open loop)"
    sys.stderr.write(f"loading {args.url} for {args.duration:g} s, {mode} ...\n")
    process = PoissonArrivals if args.arrivals == "poisson" else ConstantArrivals
    with warnings.catch_warnings(record=True) as caught, loop_choice(args.loop):
        warnings.simplefilter("always", LoadWarning)
        run = functools.partial(
            load_test,
            args.url,
            duration_s=args.duration,
            arrivals=None if args.concurrency else process(args.rate),
            concurrency=args.concurrency,
            label=f"{args.url}, {mode}",
            binary=args.binary,
            token=args.token,
            connections=args.connections,
            timeout_s=args.timeout,
            input_len=args.input_len,
        )
        try:
            try:
                result = run(example=example)
            except LoadTargetError as exc:
                if example is not None or not exc.problem.startswith(NO_INPUTS):
                    raise
                sys.stderr.write("the model's metadata declares no inputs: float32 rows of 4\n")
                result = run(example=rows)
        except LoadInterrupted as exc:
            print(exc.result.table())
            print(f"interrupted: the load stopped after {exc.sent} requests")
            raise
    print(result.table())
    print(_verdict(result, caught, load_loop(), None if args.concurrency else args.rate))
    return result


def _is_schedule(caught: warnings.WarningMessage) -> bool:
    """The warning that the schedule was not kept (said by the schedule line already)."""
    return str(caught.message).startswith("the load generator could not keep")


def _verdict(
    result: Any,
    caught: list[warnings.WarningMessage],
    bg: BackgroundLoop,
    asked_rps: float | None = None,
) -> str:
    """One honest line: did the generator keep the schedule, and whose batching is shown."""
    s = result.summary()
    lines = []
    if result.send_lag_s is not None and len(result.send_lag_s):
        lines.append(schedule_line(result.send_lag_s, asked_rps or s["offered_rps"]))
        lines += [f"  {w.message}" for w in caught if not _is_schedule(w)]
        if result.sent_until_s > result.duration_s * 1.01:
            lines.append(
                f"  the sends took {result.sent_until_s:.1f} s, not {result.duration_s:.1f} s: "
                f"served_rps ({s['served_rps']:,.0f}) is over the time they took"
            )
    lines.append(f"generator: its own event loop ({'uvloop' if bg.uvloop else 'asyncio'})")
    if result.server is not None:
        lines.append(
            "batching: the server's own /stats over the run "
            f"({result.server['runner']}.{result.server['method']})"
        )
    else:
        lines.append("batching: not seen (the target is not a labserve server)")
    return "\n".join(lines)
