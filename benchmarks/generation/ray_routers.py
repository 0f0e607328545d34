"""Routers live on two TinyLM replicas on Ray Serve, beside the fleet simulator's prediction.

Issue 34's live target: on a shared-prefix workload scaled to what two replicas serve,
the routers rank on prefix hit rate and TTFT p50 as the simulator predicts. Each router in
turn gets a fresh application (``labserve.ray.deploy(TinyLM, num_replicas=2,
router=...)``, handles only), then the same sessions at the same Poisson times: each turn
is one streamed generation through the application's handle (``app.generate.astream``,
whose router sees the prompt). TTFT counts from the intended arrival to the first text
piece (no coordinated omission); the hit rate is the replicas' prefix-cache hits over
queries from ``/stats``'s counters, reset before the run. Each replica's KV pool is
bounded (``--kv-blocks``) so that it cannot cache every tenant's prefix: where the request
lands then decides the hit. The simulator runs the same sessions, arrivals and config
(``simulate_fleet`` with ``TINYLM_STEP_COST``) behind the same routers.

With ``--over http`` each router's application serves at ``/`` behind Ray's HTTP proxy and
the sessions go as streamed completions through the proxy (labserve's generation load
generator, the same workload and Poisson times): a prefix router's application then has
its ingress in front of ``/v1`` (``labserve.ray.generation.ingress``), the others the
proxy's single hop. TTFT is the load generator's (from the intended send time).

    .venv/bin/python benchmarks/generation/ray_routers.py --rate 4 --seconds 40 \
        --json benchmarks/generation/ray_routers.json
    .venv/bin/python benchmarks/generation/ray_routers.py --over http \
        --routers round_robin,power_of_two,prefix --json benchmarks/generation/ray_routers_http.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray
from ray import serve

import labserve
import labserve.ray
from labserve.config.generation import GenerationConfig
from labserve.lab.demo import TINYLM_STEP_COST, TinyLM
from labserve.sim.fleet import simulate_fleet

ROUTERS = ("round_robin", "power_of_two", "least_kv", "prefix")


def workload(args: argparse.Namespace) -> labserve.SharedPrefixWorkload:
    return labserve.SharedPrefixWorkload(
        prefix_len=args.prefix_len,
        num_prefixes=args.tenants,
        input_len=args.input_len,
        output_len=args.output_len,
        seed=args.seed,
    )


def arrivals(args: argparse.Namespace) -> np.ndarray:
    """The sessions' Poisson send times: the load generator's own for this rate and seed."""
    poisson = labserve.arrivals("poisson", rate_rps=args.rate)
    return np.asarray(poisson.times(args.seconds, seed=args.seed))


async def one_turn(app: Any, prompt: str, max_tokens: int, due: float) -> float:
    """One streamed generation sent at ``due`` (monotonic); its TTFT in ms from ``due``."""
    await asyncio.sleep(max(0.0, due - time.monotonic()))
    first = float("nan")
    stream = app.generate.astream(prompt, max_tokens=max_tokens, ignore_eos=True)
    async for _ in stream:
        if first != first:  # NaN: the first piece
            first = (time.monotonic() - due) * 1000.0
    return first


async def drive(
    app: Any, work: labserve.SharedPrefixWorkload, times: np.ndarray
) -> dict[str, float]:
    """The sessions through the application's handle; TTFT p50 and p99 (ms)."""
    start = time.monotonic() + 0.5
    turns = []
    for k, at in enumerate(times.tolist()):
        prompt = bytes(work.prompt_ids(k)).decode("ascii")
        turns.append(one_turn(app, prompt, work.lengths(k)[1], start + at))
    ttft = list(await asyncio.gather(*turns))
    return {
        "ttft_p50_ms": float(np.nanpercentile(ttft, 50)),
        "ttft_p99_ms": float(np.nanpercentile(ttft, 99)),
    }


def live(router: str, args: argparse.Namespace, times: np.ndarray) -> dict[str, Any]:
    work = workload(args)
    app = labserve.ray.deploy(
        TinyLM,
        # Its own name per router: a process's handles keep the router they were made
        # with for a deployment's name, so a second "lm" would be routed by the first's.
        name=f"lm_{router}",
        num_replicas=2,
        route_prefix="/" if args.over == "http" else None,
        router=router,
        max_num_seqs=args.max_num_seqs,
        num_kv_blocks=args.kv_blocks,
    )
    try:
        app.generate("warm", max_tokens=2)
        app.reset_stats()
        load = os.getloadavg()[0]
        ray_procs = psutil.Process().children(recursive=True)  # this driver's local Ray
        cpu_before = cpu_s(ray_procs)
        if args.over == "http":
            ttft = over_http(app.url(port=args.port), work, args)
        else:
            ttft = asyncio.run(drive(app, work, times))
        ray_cpu_s = cpu_s(ray_procs) - cpu_before
        time.sleep(1.0)  # the replicas report every 0.25 s
        views = {rid: s[0] for rid, s in app.replica_generation_snapshots().items()}
    finally:
        app.stop()
    queries = sum(s.prefix_cache_queries for s in views.values())
    hits = sum(s.prefix_cache_hits for s in views.values())
    served = [s.outcomes.get("served", 0) for s in views.values()]
    return {
        "hit_rate": hits / queries if queries else 0.0,
        "served_per_replica": sorted(served),
        "load_avg": load,
        "ingress": app.ingress is not None,
        # Every Ray process's CPU (replicas, proxy, ingress, controller, raylet) over the
        # run: what nice and the machine's other load do not move as they move wall time.
        "ray_cpu_s": ray_cpu_s,
        **ttft,
    }


def cpu_s(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds of ``procs`` so far (those that exited count nothing)."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system
    return total


def over_http(url: str, work: labserve.SharedPrefixWorkload, args: argparse.Namespace) -> Any:
    """The sessions as streamed completions through Ray's proxy; the client's TTFT figures."""
    result = labserve.load_test(
        f"{url}/v1/completions",
        duration_s=args.seconds,
        arrivals=labserve.arrivals("poisson", rate_rps=args.rate),
        workload=work,
        seed=args.seed,
    )
    s = result.summary()
    return {
        "ttft_p50_ms": float(s["ttft_p50_ms"]),
        "ttft_p99_ms": float(s["ttft_p99_ms"]),
        "sent": int(s["requests"]) if "requests" in s else None,
        "outcomes": s.get("outcomes"),
    }


def sim_config(args: argparse.Namespace, **changes: Any) -> GenerationConfig:
    """TinyLM's generation config as deployed (its decorator's, with the run's caps)."""
    spec = TinyLM.methods["generate"].generation
    assert spec is not None
    return spec.replace(
        max_num_seqs=args.max_num_seqs,
        num_kv_blocks=args.kv_blocks,
        enable_prefix_caching=True,
        **changes,
    )


def simulated(router: str, args: argparse.Namespace, times: np.ndarray) -> dict[str, float]:
    config = sim_config(args)
    result = simulate_fleet(
        config,
        TINYLM_STEP_COST,
        workload(args),
        arrival_s=times,
        replicas=2,
        router=router,
        max_model_len=TinyLM().max_model_len,
    )
    s = result.summary()
    return {k: float(s[k]) for k in ("hit_rate", "ttft_p50_ms", "ttft_p99_ms", "load_skew")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=4.0, help="sessions/s (Poisson)")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--prefix-len", type=int, default=512)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=160, help="per replica, of 16 tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--over", choices=("handle", "http"), default="handle")
    parser.add_argument("--port", type=int, default=8765, help="Ray's proxy (--over http)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    times = arrivals(args)
    routers = args.routers.split(",")
    rows: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}, "routers": {}}
    for router in routers:
        rows["routers"][router] = {"simulated": simulated(router, args, times)}
    temp = tempfile.mkdtemp(prefix="lsrr", dir="/tmp")
    labserve.ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, log_to_driver=False)
    if args.over == "http":
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        for router in routers:
            rows["routers"][router]["live"] = live(router, args, times)
            row = rows["routers"][router]
            sim, got = row["simulated"], row["live"]
            print(
                f"{router:>13}: live hit rate {got['hit_rate']:.3f}, TTFT p50 "
                f"{got['ttft_p50_ms']:.0f} ms, p99 {got['ttft_p99_ms']:.0f} ms, served "
                f"{got['served_per_replica']} (load {got['load_avg']:.1f}, ingress "
                f"{got['ingress']}, Ray CPU {got['ray_cpu_s']:.1f} s) | simulated hit "
                f"rate {sim['hit_rate']:.3f}, TTFT p50 {sim['ttft_p50_ms']:.0f} ms",
                flush=True,
            )
    finally:
        serve.shutdown()
        ray.shutdown()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
