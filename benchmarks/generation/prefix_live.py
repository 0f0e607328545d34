"""Issue 33's "Done when", as a user tries it: a chat workload against ``labserve serve``.

``labserve serve labserve.lab.demo:TinyLM`` runs in a child process (a shell's server); a
chat workload with a long system prompt (256 tokens, 4 tenants, 4 turns of 32-token user
messages and 64-token replies, ``--think-time`` s) goes to ``/v1/chat/completions`` with
labserve's HTTP session load, first with caching off, then on (``PATCH /config``, as the
dashboard's box does). Each side's hit rate comes from the server's ``/stats`` counters
(queries and hits in tokens, the difference over the run) and its TTFT p50/p99 from the
load's rows. The same workload on the same arrival times runs through ``simulate_workload``
on ``TINYLM_STEP_COST``, with the server's config and KV pool size: its hit rate and TTFT
beside the live ones (target: hit rates within 5 percentage points). ``--write`` puts the
figures into benchmarks/RESULTS.md (a section and a headline row, replaced on a re-run).

    .venv/bin/python benchmarks/generation/prefix_live.py --rate 0.5 --seconds 30 --write
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np

import labserve
from labserve.lab.demo import TINYLM_STEP_COST
from labserve.load.arrivals import PoissonArrivals
from labserve.sim.generation import simulate_workload

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE.parent / "RESULTS.md"
TOKEN = "prefix-live"
SECTION = "## Prefix caching live against the simulator (issue 33)"


def workload(think_s: float) -> labserve.SharedPrefixWorkload:
    """The brief's chat workload: a 256-token system prompt per tenant, 4 tenants, 4 turns."""
    return labserve.SharedPrefixWorkload(prefix_len=256, num_prefixes=4, input_len=32,
                                         output_len=64, turns=4,
                                         think_time_s=think_s)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int) -> subprocess.Popen[bytes]:
    """``labserve serve`` in a child process, as a user's shell would run it."""
    labserve_cmd = str(pathlib.Path(sys.executable).parent / "labserve")  # the venv's command
    cmd = [labserve_cmd, "serve", "labserve.lab.demo:TinyLM",
           "--port", str(port), "--token", TOKEN]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            labserve.generation_sources(f"http://127.0.0.1:{port}", token=TOKEN)
            return proc
        except Exception:  # not up yet: the child is still importing
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("labserve serve did not answer in 60 s")


def counters(source: Any) -> tuple[int, int]:
    snap = source.view().snapshot
    return snap.prefix_cache_queries, snap.prefix_cache_hits


def live_side(source: Any, url: str, w: Any, rate: float, seconds: float) -> dict[str, Any]:
    """One run with the config in force: hit rate over the run, TTFT p50/p99 (ms)."""
    q0, h0 = counters(source)
    run = labserve.start_generation_load(
        f"{url}/v1/chat/completions", duration_s=seconds, arrivals=PoissonArrivals(rate),
        model=source.model, token=TOKEN, workload=w, seed=0,
    )  # fmt: skip
    result = run.result()
    q1, h1 = counters(source)
    ttft = result.percentiles_ms("ttft")
    return {
        "hit_rate_pct": 100.0 * (h1 - h0) / (q1 - q0) if q1 > q0 else float("nan"),
        "ttft_p50_ms": ttft["p50"],
        "ttft_p99_ms": ttft["p99"],
        "turns_served": int(np.sum(result.served)),
        "turns": len(result),
    }


def sim_side(config: Any, w: Any, rate: float, seconds: float) -> dict[str, Any]:
    """The same workload on the same arrival times, on virtual time, with ``config``."""
    times = PoissonArrivals(rate).times(seconds, seed=0)
    sim = simulate_workload(config, TINYLM_STEP_COST, w, arrival_s=times)
    g = sim.generation
    queries, hits = int(g.steps.num_cache_queries.sum()), int(g.steps.num_cache_hits.sum())
    ttft = g.percentiles_ms("ttft")
    return {
        "hit_rate_pct": 100.0 * hits / queries if queries else float("nan"),
        "ttft_p50_ms": ttft["p50"],
        "ttft_p99_ms": ttft["p99"],
        "turns_served": int(np.sum(g.served)),
        "turns": len(g.served),
    }


def measure(rate: float, seconds: float, think_s: float) -> dict[str, Any]:
    port = free_port()
    proc = start_server(port)
    url = f"http://127.0.0.1:{port}"
    try:
        [source] = labserve.generation_sources(url, token=TOKEN)
        out: dict[str, Any] = {"rate": rate, "seconds": seconds, "think_time_s": think_s}
        for caching in (False, True):
            source.configure(enable_prefix_caching=caching)  # PATCH /config, as the box
            w = workload(think_s)
            side = "on" if caching else "off"
            # The live server's config and its pool's size: with no limit (the default
            # GenerationConfig) the pool takes a cached free block before minting a new one,
            # and overlapping sessions evicted each other's history (63% against 83%).
            blocks = source.view().snapshot.kv_blocks_total
            config = source.config.replace(enable_prefix_caching=caching, num_kv_blocks=blocks)
            out[side] = {"live": live_side(source, url, w, rate, seconds),
                         "sim": sim_side(config, w, rate, seconds),
                         "sim_num_kv_blocks": blocks}  # fmt: skip
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def _pct(x: float) -> str:
    return f"{x:.1f}%" if math.isfinite(x) else "-"  # caching off: no lookup


def section(r: dict[str, Any], command: str, commit: str, when: str, load: str) -> str:
    rows = []
    for side in ("off", "on"):
        lv, sm = r[side]["live"], r[side]["sim"]
        rows.append(
            f"| {side} | {_pct(lv['hit_rate_pct'])} | {_pct(sm['hit_rate_pct'])} | "
            f"{lv['ttft_p50_ms']:.1f} / {lv['ttft_p99_ms']:.1f} | "
            f"{sm['ttft_p50_ms']:.1f} / {sm['ttft_p99_ms']:.1f} | "
            f"{lv['turns_served']}/{lv['turns']} |"
        )
    on = r["on"]
    gap = on["live"]["hit_rate_pct"] - on["sim"]["hit_rate_pct"]
    return "\n".join([
        SECTION, "",
        "`labserve serve labserve.lab.demo:TinyLM` in a child process; a chat workload "
        "(256-token system prompt, 4 tenants, 4 turns of 32-token messages and 64-token "
        f"replies, {r['think_time_s']:g} s think time) at {r['rate']:g} sessions/s Poisson for "
        f"{r['seconds']:g} s to `/v1/chat/completions`, caching off then on by `PATCH /config`; "
        "the simulator on the same arrival times and `TINYLM_STEP_COST`. Hit rate: prompt "
        "tokens found cached over those looked up (the server's counters over the run).",
        "", f"Run {when}, `{commit}`, load {load}: `{command}`", "",
        "| caching | live hit rate | sim hit rate | live TTFT p50 / p99 ms | "
        "sim TTFT p50 / p99 ms | live turns served |",
        "|---|---|---|---|---|---|", *rows, "",
        f"Live hit rate {gap:+.1f} points from the simulator's (target: within 5).", "",
    ])  # fmt: skip


def write(r: dict[str, Any], command: str) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=HERE).stdout.strip()  # fmt: skip
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = pathlib.Path("/proc/loadavg").read_text().split()[0]
    text = RESULTS.read_text()
    body = section(r, command, commit, when, load)
    if SECTION in text:  # a re-run replaces its section (up to the next one)
        head, _, rest = text.partition(SECTION)
        nxt = rest.find("\n## ")
        text = head + body + (rest[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    on, off = r["on"], r["off"]
    gap = abs(on["live"]["hit_rate_pct"] - on["sim"]["hit_rate_pct"])
    row = (
        "| [Prefix caching live against the simulator](#prefix-caching-live-against-the-"
        "simulator-issue-33), chat workload against `labserve serve` TinyLM | hit rate "
        f"{on['live']['hit_rate_pct']:.1f}% live, TTFT p50 {off['live']['ttft_p50_ms']:.0f} -> "
        f"{on['live']['ttft_p50_ms']:.0f} ms (off -> on) | simulator "
        f"{on['sim']['hit_rate_pct']:.1f}%, TTFT p50 {off['sim']['ttft_p50_ms']:.0f} -> "
        f"{on['sim']['ttft_p50_ms']:.0f} ms | "
        f"hit rates within 5 points (issue 33) | **{'met' if gap <= 5 else 'missed'}** "
        f"({gap:.1f} points) | {when}, `{commit}`, load {load} |"
    )
    lines = [
        ln for ln in text.split("\n") if "#prefix-caching-live-against-the-simulator" not in ln
    ]
    at = lines.index("## Headline figures")
    at = next(i for i in range(at, len(lines)) if lines[i].startswith("|"))
    while lines[at].startswith("|"):  # the row goes at the table's end
        at += 1
    lines.insert(at, row)
    RESULTS.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=0.5, help="sessions per second")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--think-time", type=float, default=1.0)
    parser.add_argument("--write", action="store_true", help="into benchmarks/RESULTS.md")
    args = parser.parse_args()
    r = measure(args.rate, args.seconds, args.think_time)
    print(json.dumps(r, indent=2))
    (HERE / "prefix_live.json").write_text(json.dumps(r, indent=2) + "\n")
    if args.write:
        write(r, "python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
