"""``labserve search``: the highest rate each scheduler setting serves within targets, simulated.

Prints one row per setting (best rate first), then the best setting; ``--export vllm`` adds
its engine flags. The step cost is TinyLM's shipped one unless ``--cost`` gives the terms.
``--replicas`` or ``--routers`` search fleets (sessions of ``--turns`` turns sharing
``--num-prefixes`` tenants' ``--prefix-len``-token prefixes; rates in sessions/s, the best
fleet the one serving the most per replica); ``--export sglang-router`` adds its router.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from labserve.cli._common import numbers

if TYPE_CHECKING:
    from labserve.cli._common import Subcommands

__all__ = ["add_command", "run"]


def add_command(sub: Subcommands) -> None:
    """The ``search`` subcommand (a simulated search over generation settings)."""
    search = sub.add_parser(
        "search", help="the highest rate each generation setting serves within targets"
    )
    search.add_argument("--input-len", default="32", help="prompt lengths (default 32)")
    search.add_argument("--output-len", default="128", help="output lengths (default 128)")
    search.add_argument(
        "--targets",
        default="ttft:300 tpot:30",
        help="KEY:MS targets among ttft, tpot, e2el (default 'ttft:300 tpot:30')",
    )
    search.add_argument(
        "--attainment", type=float, default=0.9, help="share of requests meeting them (0.9)"
    )
    search.add_argument(
        "--max-num-seqs", type=numbers(int, "max-num-seqs"), default=[32], help="e.g. 32,64,128"
    )
    search.add_argument(
        "--max-num-batched-tokens",
        type=numbers(int, "max-num-batched-tokens"),
        default=[2048],
        help="token budgets per step, e.g. 512,2048",
    )
    search.add_argument(
        "--chunked", type=_switches, default=[True], help="chunked prefill: on, off or on,off"
    )
    search.add_argument(
        "--strategies", type=_words, default=["continuous"], help="continuous and/or static"
    )
    search.add_argument("--policies", type=_words, default=["fcfs"], help="fcfs and/or priority")
    search.add_argument(
        "--replicas", type=numbers(int, "replicas"), help="fleet sizes, e.g. 1,2,4 (a fleet search)"
    )
    search.add_argument("--routers", type=_words, help="e.g. round_robin,prefix (a fleet search)")
    search.add_argument("--prefix-len", type=int, default=0, help="tokens each tenant shares (0)")
    search.add_argument("--num-prefixes", type=int, default=1, help="tenants (default 1)")
    search.add_argument("--turns", type=int, default=1, help="turns a session (default 1)")
    search.add_argument(
        "--prefix-caching", type=_switches, default=[False], help="on, off or on,off (off)"
    )
    search.add_argument(
        "--duration", type=float, default=120.0, help="simulated s a point (default 120)"
    )
    search.add_argument("--warmup", type=float, default=10.0, help="s not judged (default 10)")
    search.add_argument("--tolerance", type=float, default=0.02, help="bisection's (0.02)")
    search.add_argument("--seed", type=int, default=0, help="the requests' seed (default 0)")
    search.add_argument(
        "--exact",
        action="store_true",
        help="the reference search: every rate simulated in full, no shortcut (slower)",
    )
    search.add_argument(
        "--cost",
        type=_cost,
        help="fixed_ms,per_seq_ms,per_batched_token_ms,per_context_token_ms "
        "(default: TinyLM's shipped cost)",
    )
    search.add_argument("--export", help="also print the best setting for vllm, sglang, ...")
    search.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Search the grid ``args`` give; print the table and the best setting."""
    from labserve.generation.workload import SharedPrefixWorkload
    from labserve.lab.demo import TINYLM_STEP_COST
    from labserve.lab.generation.fleet_search import FLEET_KNOBS
    from labserve.lab.generation.search import SEARCH_KNOBS, PoissonWorkload, search_generation
    from labserve.sim.generation import StepCost

    cost = TINYLM_STEP_COST if args.cost is None else StepCost(*args.cost)
    grid: dict[str, list[Any]] = {
        "strategy": args.strategies,
        "scheduling_policy": args.policies,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enable_chunked_prefill": args.chunked,
        "enable_prefix_caching": args.prefix_caching,
    }
    fleet = args.replicas is not None or args.routers is not None
    shared = args.prefix_len > 0 or args.num_prefixes > 1 or args.turns > 1
    if args.replicas is not None:
        grid["replicas"] = args.replicas
    if args.routers is not None:
        grid["router"] = args.routers
    workload: PoissonWorkload | SharedPrefixWorkload = (
        SharedPrefixWorkload(
            prefix_len=args.prefix_len,
            num_prefixes=args.num_prefixes,
            input_len=args.input_len,
            output_len=args.output_len,
            turns=args.turns,
            seed=args.seed,
        )
        if fleet or shared
        else PoissonWorkload(args.input_len, args.output_len)
    )
    with tqdm(desc="searching", unit="setting", disable=None) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        found = search_generation(
            workload,
            args.targets,
            grid=grid,
            cost=cost,
            attainment=args.attainment,
            duration_s=args.duration,
            warmup_s=args.warmup,
            probe_s=min(20.0, args.duration),
            tolerance=args.tolerance,
            seed=args.seed,
            progress=progress,
            exact=args.exact,
        )
    print(found.table())
    best = found.best
    names = (*FLEET_KNOBS, *SEARCH_KNOBS[:5]) if found.fleet else SEARCH_KNOBS[:5]
    knobs = " ".join(f"{k}={best[k]}" for k in names)
    unit = "sessions/s" if found.fleet else "req/s"
    print(f"best: {best['max_rate']:.2f} {unit} with {knobs}")
    if args.export:
        print(found.export(args.export))


def _words(text: str) -> list[str]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return words


def _switches(text: str) -> list[bool]:
    table = {"on": True, "off": False}
    words = _words(text)
    bad = [w for w in words if w not in table]
    if bad:
        raise argparse.ArgumentTypeError(f"expected on and/or off, got {text!r}")
    return [table[w] for w in words]


def _cost(text: str) -> tuple[float, ...]:
    try:
        terms = tuple(float(v) for v in text.split(","))
    except ValueError:
        terms = ()
    if len(terms) != 4 or not all(t >= 0 for t in terms):
        raise argparse.ArgumentTypeError(f"cost takes 4 comma-separated terms >= 0, got {text!r}")
    return terms
