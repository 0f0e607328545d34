"""Python calls a request in `batching_bench.py`'s overhead phase, every thread, counted.

A timed overhead of 10 µs a request moves 20-30% between rounds on this machine; the number
of Python calls a request does not move at all, so a before/after change of half a
microsecond can be placed by counting. Runs the harness's overhead phase twice (``--waves``
and twice that, waves of 64 no-op requests), each in a fresh process under a profile hook on
every thread, and prints the difference per request, by function, so set-up and warm-up
cancel. Each tree counts its own labserve (run from inside it, with PYTHONPATH):

    cd /work/old && PYTHONPATH=$PWD /work/main/.venv/bin/python \
        /work/main/benchmarks/calls_per_request.py --tree $PWD --system labserve-adaptive
"""

from __future__ import annotations

import argparse
import collections
import json
import runpy
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any


def count(tree: Path, system: str, waves: int) -> collections.Counter[str]:
    """Calls by ``module:function`` (labserve's) or ``other`` over one overhead phase."""
    counts: collections.Counter[str] = collections.Counter()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if "labserve/" in name:
                counts[f"{name.split('labserve/', 1)[1]}:{frame.f_code.co_name}"] += 1
            else:
                counts["other"] += 1

    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(tree / "benchmarks" / "batching_bench.py"), "--worker", system]
        argv += ["--out", f"{tmp}/w.json", "--rates", "none", "--loop", "asyncio"]
        argv += ["--overhead-waves", str(waves), "--duration", "1", "--warmup", "0"]
        saved, sys.argv = sys.argv, argv
        threading.setprofile(hook)
        sys.setprofile(hook)
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit:
            pass
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            sys.argv = saved
    return counts


def counted(tree: Path, system: str, waves: int) -> dict[str, int]:
    """:func:`count` in a fresh process (one run per process: a second run in the same
    process made fewer calls than the first, whatever its waves, so the difference was
    negative)."""
    out = subprocess.run(
        [sys.executable, __file__, "--tree", str(tree), "--system", system, "--child"],
        input=str(waves),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True, help="the tree whose harness runs")
    ap.add_argument("--system", default="labserve-adaptive")
    ap.add_argument("--waves", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one counted run, its waves on stdin, the counts on stdout
        print(json.dumps(count(args.tree, args.system, int(sys.stdin.read()))))
        return
    short = counted(args.tree, args.system, args.waves)
    long = counted(args.tree, args.system, 2 * args.waves)
    n = args.waves * 64
    per = {k: (long.get(k, 0) - short.get(k, 0)) / n for k in set(short) | set(long)}
    mine = sum(v for k, v in per.items() if k != "other")
    print(f"{args.system}: {sum(per.values()):.2f} Python calls a request, {mine:.2f} in labserve")
    for name, value in sorted(per.items(), key=lambda kv: -kv[1])[: args.top]:
        if value >= 0.01:
            print(f"{value:8.3f}  {name}")


if __name__ == "__main__":
    main()
