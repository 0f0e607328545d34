"""The generation figures of RESULTS.md in two commits, alternating rounds: issue 30's check.

Issue 30's target: HTTP streaming against in process (``http_vs_inprocess.py``) and the load
generator's CPU per streamed token (``load_cpu.py``, closed loop of 64 streams and open loop
at 20 req/s, each on asyncio and uvloop) within 5% before and after, as the ratio new / old
of the medians over alternating rounds. With them, ``server_cpu.py``: the server's own CPU per
streamed token over a fixed amount of work, which the machine's other load moves much less
than tokens/s, and ``inprocess_cpu.py``, the same for the in-process runner (measure
``inprocess_cpu``, not run by default). Each round runs, for the old tree then the new, every
measure once, each in processes of its own that import that tree's labserve (``PYTHONPATH``,
run from inside the tree; checked before the first round). The harness is this folder's
scripts for both trees, so only labserve differs. ``--old`` and ``--new`` take a directory
(a checkout) or a commit (a detached worktree is made in a temporary folder and removed at
the end). The machine is shared: the load average is kept per run, and at start and end.

    .venv/bin/python benchmarks/generation/before_after.py --old 5022212 --new HEAD
    .venv/bin/python benchmarks/generation/before_after.py --old /work/wt-a --new . --rounds 3

Prints one line per run, then a Markdown table (median old, median new, new / old per figure)
and writes everything to --json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

Figures = dict[str, float]


@contextlib.contextmanager
def checkouts(*revs: str) -> Iterator[list[Path]]:
    """A tree per ``rev``: a directory as it is, or a commit as a detached worktree."""
    with contextlib.ExitStack() as stack:
        trees = []
        for rev in revs:
            path = Path(rev)
            if path.is_dir():
                trees.append(path.resolve())
                continue
            commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory())) / commit[:7]
            _git("worktree", "add", "--detach", str(tmp), commit)
            stack.callback(_git, "worktree", "remove", "--force", str(tmp))
            trees.append(tmp)
        yield trees


def describe(tree: Path) -> dict[str, Any]:
    """The tree's commit, whether it has local changes, and the labserve it imports."""
    commit = _git("-C", str(tree), "rev-parse", "HEAD")
    dirty = bool(_git("-C", str(tree), "status", "--porcelain", "--untracked-files=no"))
    # As `python -m` and `python -c` (cwd first) and as a script of this folder would see it.
    for first in ("''", repr(str(HERE))):
        code = f"import sys; sys.path[0] = {first}; import labserve; print(labserve.__file__)"
        got = subprocess.run(
            [sys.executable, "-c", code], **run_in(tree), capture_output=True, text=True
        )
        imported = Path(got.stdout.strip()).resolve()
        if not imported.is_relative_to(tree):
            sys.exit(f"{tree}: its runs would import {imported or got.stderr}, not its labserve")
    return {"tree": str(tree), "commit": commit, "local_changes": dirty}


def run_in(tree: Path) -> dict[str, Any]:
    """subprocess arguments that make a process import ``tree``'s labserve."""
    return {"cwd": tree, "env": {**os.environ, "PYTHONPATH": str(tree)}}


def http_vs_inprocess(tree: Path, args: argparse.Namespace) -> Figures:
    """One round of http_vs_inprocess.py: tokens/s in process, over HTTP, their ratio."""
    rows = _script(tree, "http_vs_inprocess.py", "--rounds", "1", "--seconds", args.http_seconds)
    row = rows[0]
    return {
        "in_process_tokens_per_s": row["in_process"],
        "http_tokens_per_s": row["http"],
        "http_over_in_process": row["ratio"],
    }


def load_cpu(tree: Path, args: argparse.Namespace, *mode: str, name: str) -> Figures:
    """One run of load_cpu.py per loop: the client's CPU µs per token (and its tokens/s)."""
    report = _script(tree, "load_cpu.py", "--repeats", "1", "--seconds", args.cpu_seconds, *mode)
    figures = {}
    for loop, runs in report["runs"].items():
        figures[f"{name}_{loop}_us_per_token"] = runs[0]["us_per_token"]
        figures[f"{name}_{loop}_tokens_per_s"] = runs[0]["tokens_per_s"]
    return figures


def server_cpu(tree: Path, args: argparse.Namespace) -> Figures:
    """One run of server_cpu.py: the server's CPU µs per token over fixed work, tokens/s."""
    run = _script(tree, "server_cpu.py", "--rounds", "1")[0]
    return {
        "server_us_per_token": run["server_us_per_token"],
        "server_fixed_work_tokens_per_s": run["tokens_per_s"],
    }


def inprocess_cpu(tree: Path, args: argparse.Namespace) -> Figures:
    """One run of inprocess_cpu.py: the process's CPU µs per token in process, fixed work."""
    run = _script(tree, "inprocess_cpu.py", "--rounds", "1")[0]
    return {
        "in_process_us_per_token": run["in_process_us_per_token"],
        "in_process_fixed_work_tokens_per_s": run["tokens_per_s"],
    }


MEASURES: dict[str, Callable[[Path, argparse.Namespace], Figures]] = {
    "http": http_vs_inprocess,
    "cpu_closed": lambda tree, args: load_cpu(tree, args, name="closed64"),
    "cpu_open": lambda tree, args: load_cpu(
        tree, args, "--rate", "20", "--concurrency", "256", name="open20"
    ),
    "server_cpu": server_cpu,
    "inprocess_cpu": inprocess_cpu,
}
# What the target judges; the others are kept as context: the CPU runs' tokens/s, and the
# server's and the in-process runner's CPU per token over fixed work, which tell slower code
# from a busier machine (issue 30's third run: tokens/s spread 2x over rounds at load 7-20,
# the server's CPU per token 1.4x).
JUDGED = (
    "in_process_tokens_per_s",
    "http_tokens_per_s",
    "http_over_in_process",
    "closed64_asyncio_us_per_token",
    "closed64_uvloop_us_per_token",
    "open20_asyncio_us_per_token",
    "open20_uvloop_us_per_token",
)


def alternate(
    sides: dict[str, Path], rounds: int, measure: Callable[[str, Path], Figures]
) -> list[dict[str, Any]]:
    """``measure`` each side in turn, ``rounds`` times, with the load average before each."""
    runs = []
    for r in range(rounds):
        for side, tree in sides.items():
            load = os.getloadavg()[0]
            started = time.time()
            figures = measure(side, tree)
            runs.append(
                {"round": r, "side": side, "load_before": load, "started_unix": started, **figures}
            )
            shown = ", ".join(f"{k} {v:.4g}" for k, v in figures.items() if _number(v))
            print(f"round {r} {side} (load {load:.1f}): {shown}", file=sys.stderr, flush=True)
    return runs


def summarize(runs: list[dict[str, Any]], keys: list[str]) -> dict[str, dict[str, Any]]:
    """Per figure: each side's values, their medians, and new / old of the medians."""
    summary = {}
    for key in keys:
        values = {
            side: [run[key] for run in runs if run["side"] == side and _number(run.get(key))]
            for side in ("old", "new")
        }
        if not values["old"] or not values["new"]:
            continue
        old, new = statistics.median(values["old"]), statistics.median(values["new"])
        summary[key] = {
            "old": values["old"],
            "new": values["new"],
            "old_median": old,
            "new_median": new,
            "new_over_old": new / old,
        }
    return summary


def print_table(summary: dict[str, dict[str, Any]], judged: tuple[str, ...]) -> None:
    print("| figure | old median | new median | new / old | within 5% |")
    print("|---|---:|---:|---:|---|")
    for key, s in summary.items():
        verdict = ("yes" if abs(s["new_over_old"] - 1) <= 0.05 else "NO") if key in judged else "-"
        print(
            f"| {key} | {s['old_median']:,.4g} | {s['new_median']:,.4g} | "
            f"{s['new_over_old']:.3f} | {verdict} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="5022212", help="a directory or a commit")
    parser.add_argument("--new", default="HEAD", help="a directory or a commit")
    parser.add_argument("--rounds", type=int, default=5)
    default = ",".join(m for m in MEASURES if m != "inprocess_cpu")  # the measures of issue 30
    parser.add_argument("--measures", default=default, help="of " + ",".join(MEASURES))
    parser.add_argument("--http-seconds", default="15", help="http_vs_inprocess.py's --seconds")
    parser.add_argument("--cpu-seconds", default="10", help="load_cpu.py's --seconds")
    parser.add_argument("--json", type=Path, default=HERE / "before_after_issue30.json")
    args = parser.parse_args()
    measures = [MEASURES[m] for m in args.measures.split(",")]
    with checkouts(args.old, args.new) as (old, new):
        sides = {"old": old, "new": new}
        described = {side: describe(tree) for side, tree in sides.items()}
        load_start = os.getloadavg()

        def measure(side: str, tree: Path) -> Figures:
            figures: Figures = {}
            for m in measures:
                figures.update(m(tree, args))
            return figures

        runs = alternate(sides, args.rounds, measure)
        load_end = os.getloadavg()
    keys = list(dict.fromkeys(k for run in runs for k in run if k not in _RUN_FIELDS))
    summary = summarize(runs, keys)
    print(
        f"old {described['old']['commit'][:7]}, new {described['new']['commit'][:7]}, "
        f"{args.rounds} alternating rounds, load average {load_start[0]:.1f} at start, "
        f"{load_end[0]:.1f} at end\n"
    )
    print_table(summary, JUDGED)
    report = {
        "argv": sys.argv[1:],
        "args": {k: str(v) for k, v in vars(args).items()},
        "sides": described,
        "loadavg_1_5_15_start": load_start,
        "loadavg_1_5_15_end": load_end,
        "judged": [k for k in JUDGED if k in summary],
        "summary": summary,
        "runs": runs,
    }
    args.json.write_text(json.dumps(report, indent=1) + "\n")


_RUN_FIELDS = {"round", "side", "load_before", "started_unix"}


def _script(tree: Path, name: str, *argv: str) -> Any:
    """Run this folder's ``name`` importing ``tree``'s labserve; return the JSON it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        done = subprocess.run(
            [sys.executable, str(HERE / name), *argv, "--json", str(out)],
            **run_in(tree),
            capture_output=True,
            text=True,
        )
        if done.returncode:
            sys.exit(f"{name} {' '.join(argv)} in {tree} failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def _git(*argv: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=True
    ).stdout.strip()


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


if __name__ == "__main__":
    main()
