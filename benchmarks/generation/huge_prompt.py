"""How long a neighbour stream goes silent while a 16 MiB prompt is refused (issue 30, item 6).

The kernel's server (``labserve.serve(labserve.Runner(TinyLM, name="tinylm"), port=0,
max_body_bytes=64 << 20)``) runs in a process of its own, importing the labserve of the tree
it runs from. This process is the client, on the standard library alone: one neighbour stream
is kept running (``/v1/completions``, ``stream`` true, ``max_tokens`` 1000, temperature 0; a
new one starts when it ends, TinyLM's context being 1024 tokens), and after --baseline-s of
it a body of one prompt of --mib MiB of ASCII goes to ``/v1/completions``. Recorded: the time
from the start of the send to the refusal (a 400 naming ``max_model_len``), the neighbour's
median gap between events before the send, its longest silence (between two events, across a
restart too) that overlaps the time from send to refusal, and its longest silence before the
send for comparison. A fresh server per trial.

    .venv/bin/python benchmarks/generation/huge_prompt.py                       # this tree
    .venv/bin/python benchmarks/generation/huge_prompt.py --old 5022212 --new HEAD --rounds 3

With ``--old``/``--new`` (directories or commits, as in ``before_after.py``) the trials
alternate old, new; prints a table and writes --json.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from before_after import checkouts, describe, run_in  # this folder's

HERE = Path(__file__).resolve().parent
# ignore_eos: the trained TinyLM ends its texts; the neighbour must stream throughout.
NEIGHBOUR = {
    "model": "tinylm",
    "prompt": "keep going",
    "max_tokens": 1000,
    "temperature": 0,
    "ignore_eos": True,
}


def serve() -> None:
    """The server side: TinyLM served from this process until stdin closes."""
    import labserve
    from labserve.lab.demo import TinyLM

    runner = labserve.Runner(TinyLM, name="tinylm")
    server = labserve.serve(runner, port=0, max_body_bytes=64 << 20)
    print(json.dumps({"url": server.url, "labserve": labserve.__file__}), flush=True)
    sys.stdin.read()
    server.stop()
    runner.stop()


def trial(url: str, body: bytes, baseline_s: float, after_s: float) -> dict[str, Any]:
    """One huge prompt beside one neighbour stream; the figures of this run."""
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    events: list[float] = []  # monotonic arrival of each of the neighbour's events
    firsts: set[int] = set()  # indices of events that opened a stream
    stop = threading.Event()
    failed: list[BaseException] = []

    def neighbour() -> None:
        try:
            while not stop.is_set():
                conn = http.client.HTTPConnection(host, port, timeout=300)
                conn.request(
                    "POST",
                    "/v1/completions",
                    json.dumps({**NEIGHBOUR, "stream": True}),
                    {"Content-Type": "application/json"},
                )
                resp = conn.getresponse()
                if resp.status != 200:
                    raise RuntimeError(f"neighbour got {resp.status}: {resp.read()[:200]!r}")
                firsts.add(len(events))
                while line := resp.readline():
                    if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                        events.append(time.monotonic())
                conn.close()
        except BaseException as exc:  # raised again in the measuring thread
            failed.append(exc)

    _post(host, port, json.dumps({**NEIGHBOUR, "max_tokens": 8}).encode())  # start-up
    thread = threading.Thread(target=neighbour, name="neighbour")
    thread.start()
    time.sleep(baseline_s)
    t0 = time.monotonic()
    status, reply = _post(host, port, body)
    t1 = time.monotonic()
    time.sleep(after_s)
    stop.set()
    thread.join(300)
    if failed:
        raise failed[0]
    message = json.loads(reply).get("error", {}).get("message", reply.decode()[:300])
    pairs = list(itertools.pairwise(events))
    before = [(a, b) for a, b in pairs if b <= t0]
    within = [b - a for i, (a, b) in enumerate(before) if i + 1 not in firsts]
    around = [b - a for a, b in pairs if b > t0 and a < t1]
    return {
        "status": status,
        "names_max_model_len": "max_model_len" in message,
        "message": message[:300],
        "refusal_s": t1 - t0,
        "neighbour_events": len(events),
        "neighbour_streams": len(firsts),
        "median_gap_ms": 1e3 * statistics.median(within),
        "longest_silence_around_ms": 1e3 * max(around, default=t1 - t0),
        "longest_silence_before_ms": 1e3 * max(b - a for a, b in before),
    }


def measure(tree: Path | None, args: argparse.Namespace, body: bytes) -> dict[str, Any]:
    """A fresh server (``tree``'s labserve, or this interpreter's) and one trial against it."""
    kw = run_in(tree) if tree is not None else {}
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **kw,
    )
    try:
        assert server.stdout is not None and server.stdin is not None
        while not (line := server.stdout.readline()).startswith("{"):
            if not line:
                sys.exit("the server ended before it listened")
        started = json.loads(line)
        if tree is not None and not Path(started["labserve"]).resolve().is_relative_to(tree):
            sys.exit(f"the server imported {started['labserve']}, not {tree}'s labserve")
        return {
            "load_before": os.getloadavg()[0],
            **trial(started["url"], body, args.baseline_s, args.after_s),
        }
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


FIGURES = ("refusal_s", "median_gap_ms", "longest_silence_around_ms", "longest_silence_before_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="a directory or a commit (with --new: alternate)")
    parser.add_argument("--new", help="a directory or a commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=float, default=16.0, help="the prompt's size in MiB")
    parser.add_argument("--baseline-s", type=float, default=2.0)
    parser.add_argument("--after-s", type=float, default=1.0)
    parser.add_argument("--json", type=Path, default=HERE / "huge_prompt_issue30.json")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    prompt = "x" * int(args.mib * (1 << 20))
    body = json.dumps({"model": "tinylm", "prompt": prompt, "max_tokens": 4}).encode()
    load_start = os.getloadavg()
    runs = []
    if args.old or args.new:
        with checkouts(args.old or "HEAD", args.new or "HEAD") as (old, new):
            sides: dict[str, Path | None] = {"old": old, "new": new}
            described = {side: describe(tree) for side, tree in (("old", old), ("new", new))}
            for r in range(args.rounds):
                for side, tree in sides.items():
                    runs.append({"round": r, "side": side, **measure(tree, args, body)})
                    _show(runs[-1])
    else:
        sides = {"this": None}
        described = {}
        for r in range(args.rounds):
            runs.append({"round": r, "side": "this", **measure(None, args, body)})
            _show(runs[-1])
    load_end = os.getloadavg()
    medians = {
        side: {k: statistics.median(run[k] for run in runs if run["side"] == side) for k in FIGURES}
        for side in sides
    }
    print(
        f"\nprompt {args.mib:g} MiB, load average {load_start[0]:.1f} at start, "
        f"{load_end[0]:.1f} at end; medians:\n"
    )
    print(
        "| side | refusal s | neighbour median gap ms | longest silence around ms | "
        "longest silence before ms |"
    )
    print("|---|---:|---:|---:|---:|")
    for side, m in medians.items():
        around, before = m["longest_silence_around_ms"], m["longest_silence_before_ms"]
        print(
            f"| {side} | {m['refusal_s']:.2f} | {m['median_gap_ms']:.2f} | {around:,.0f} | "
            f"{before:,.0f} |"
        )
    report = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "body_bytes": len(body),
        "sides": described,
        "loadavg_1_5_15_start": load_start,
        "loadavg_1_5_15_end": load_end,
        "medians": medians,
        "runs": runs,
    }
    args.json.write_text(json.dumps(report, indent=1) + "\n")


def _post(host: str | None, port: int | None, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _show(run: dict[str, Any]) -> None:
    print(
        f"round {run['round']} {run['side']} (load {run['load_before']:.1f}): {run['status']} "
        f"in {run['refusal_s']:.2f} s (names max_model_len: {run['names_max_model_len']}); "
        f"neighbour median gap {run['median_gap_ms']:.2f} ms, longest silence around "
        f"{run['longest_silence_around_ms']:.0f} ms, before {run['longest_silence_before_ms']:.0f}"
        f" ms ({run['neighbour_streams']} streams)",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    main()
