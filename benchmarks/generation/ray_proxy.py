"""Output tokens/s of TinyLM through Ray Serve's proxy (one replica) against the kernel server.

Issue 34's target: through the proxy, one replica, at least 0.8x the kernel server's output
tokens/s at the same load: the proxy's per-chunk cost (each SSE event crosses the replica,
Serve's streaming protocol and the proxy). Five servers, all up for the whole run so each
round sees the same background: the kernel server (``labserve serve
labserve.lab.demo:TinyLM`` in its own process), and on one local Ray (this process is its
driver) four applications of one TinyLM replica each: ``direct`` (Serve's own router: the
proxy's single hop to the replica), ``ingress`` (``router="prefix"``: the OpenAI routes
through the ingress, a second hop per chunk), and both again with ``stream_interval_ms``
(``--interval-ms``: a stream's text leaves the replica at most once per interval). Rounds
alternate; each drives one server with labserve's generation load generator (closed loop,
streaming, prompts of 32 bytes, ``ignore_eos`` outputs). A figure is output tokens over the
run's span, as the load generator's summary counts it, and the server side's CPU ms per
output token (the kernel server's process; every process of the Ray session: replicas,
proxy, ingress, controller, raylet), which the machine's other load and nice do not move as
they move wall time.

    .venv/bin/python benchmarks/generation/ray_proxy.py --rounds 3 --seconds 15 --streams 16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import ray
from ray import serve

import labserve
import labserve.ray
from labserve.lab.demo import TinyLM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(*extra: str, attempts: int = 1) -> Iterator[tuple[str, int]]:
    """``labserve serve labserve.lab.demo:TinyLM [extra]`` until the block ends (Ctrl-C).

    Yields its URL and its process id.

    ``attempts``: starts tried. Ray's driver waits a fixed 30 s for its raylet, which waits
    for its metrics agent: at load 10-15 on these two cores most local starts failed so
    (2026-12-04, 16:00 UTC), and a later one got through.
    """
    for attempt in range(attempts):
        started = False
        try:
            with _served(*extra) as found:
                started = True
                yield found
                return
        except RuntimeError as exc:
            if started:  # the measure's own error, not the start's
                raise
            print(f"start {attempt + 1} of {attempts} failed: {exc}", flush=True)
    raise RuntimeError(f"labserve serve {' '.join(extra)} did not start in {attempts} tries")


@contextlib.contextmanager
def _served(*extra: str) -> Iterator[tuple[str, int]]:
    port = _free_port()
    argv = [sys.executable, "-m", "labserve.cli", "serve", "labserve.lab.demo:TinyLM"]
    argv += ["--port", str(port), *extra]
    server = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # "serving tinylm ...": it listens
        if "serving" not in line:
            raise RuntimeError(f"{' '.join(argv)} did not start: {line!r}")
        yield f"http://127.0.0.1:{port}", server.pid
    finally:
        server.send_signal(signal.SIGINT)  # as a user's Ctrl-C: Ray's processes go too
        server.wait(120)


def tokens_per_s(base: str, seconds: float, streams: int, output: int) -> dict[str, float]:
    result = labserve.load_test(
        f"{base}/v1/completions",
        duration_s=seconds,
        concurrency=streams,
        input_len=32,
        output_len=output,
    )
    s = result.summary()
    keys = ("output_tokens_per_s", "output_tokens", "ttft_p50_ms", "tpot_p50_ms")
    return {k: float(s[k]) for k in keys if k in s}


def cpu_s(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds of ``procs`` so far (those that exited count nothing)."""
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def ray_processes(kernel_pid: int) -> list[psutil.Process]:
    """This driver's local Ray: every process under this one but the kernel server's.

    Taken once the servers are warm (Serve starts its replicas', proxy's and ingress's
    workers by then): the raylet, GCS, controller, proxy, replicas and ingress.
    """
    return [p for p in psutil.Process().children(recursive=True) if p.pid != kernel_pid]


def role(proc: psutil.Process, app: str) -> str:
    """What ``proc`` is to application ``app``: its replica, its ingress, the proxy, other."""
    try:
        title = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "other"
    if title.startswith(f"ray::ServeReplica:{app}-ingress:"):
        return "ingress"
    if title.startswith(f"ray::ServeReplica:{app}:"):
        return "replica"
    if title.startswith("ray::ProxyActor"):
        return "proxy"
    return "other"  # the kernel server, or Ray's own (controller, raylet, other replicas)


ROLES = ("replica", "ingress", "proxy", "other")


def measured(
    name: str, base: str, procs: list[psutil.Process], args: argparse.Namespace
) -> dict[str, float]:
    """One round against ``base``: its figures and the server side's CPU ms per output token.

    For a Ray application also each part's CPU ms per output token (its replica, its
    ingress, the proxy, the rest of Ray).
    """
    parts = {r: [p for p in procs if role(p, name) == r] for r in ROLES}
    before = {r: cpu_s(ps) for r, ps in parts.items()}
    got = tokens_per_s(base, args.seconds, args.streams, args.output)
    tokens = max(1.0, got["output_tokens"])
    spent = {r: cpu_s(ps) - before[r] for r, ps in parts.items()}
    got["server_cpu_s"] = sum(spent.values())
    got["cpu_ms_per_token"] = 1000.0 * got["server_cpu_s"] / tokens
    if name != "kernel":
        got |= {f"{r}_cpu_ms_per_token": 1000.0 * spent[r] / tokens for r in ROLES}
    return got


@contextlib.contextmanager
def ray_apps(port: int, interval_ms: float) -> Iterator[dict[str, str]]:
    """One local Ray serving TinyLM, one replica per application: straight, through the
    ingress, and both again with ``stream_interval_ms=interval_ms``."""
    temp = tempfile.mkdtemp(prefix="lsrp", dir="/tmp")  # short: Ray's sockets live under it
    labserve.ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    apps = {
        "direct": (None, 0.0),
        "ingress": ("prefix", 0.0),
        "direct_interval": (None, interval_ms),
        "ingress_interval": ("prefix", interval_ms),
    }
    try:
        for name, (router, interval) in apps.items():
            labserve.ray.deploy(
                TinyLM,
                name=name,
                num_replicas=1,
                route_prefix=f"/{name}",
                router=router,
                stream_interval_ms=interval,
                num_cpus=0.25,  # four applications' replicas on two CPUs
            )
        yield {n: f"http://127.0.0.1:{port}/{n}" for n in apps}
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--interval-ms", type=float, default=20.0, help="stream_interval_ms")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with served() as (kernel, pid), ray_apps(_free_port(), args.interval_ms) as apps:
        bases = {"kernel": kernel, **apps}
        for base in bases.values():  # warm every server outside the measure
            tokens_per_s(base, 3, args.streams, args.output)
        ray_procs = ray_processes(pid)
        procs = {"kernel": [psutil.Process(pid)]} | {n: ray_procs for n in apps}
        for r in range(args.rounds):
            row: dict[str, Any] = {"round": r, "load": os.getloadavg()[0]}
            for name, base in bases.items():
                row[name] = measured(name, base, procs[name], args)
                time.sleep(1)
            for name in apps:
                row[f"{name}_ratio"] = (
                    row[name]["output_tokens_per_s"] / row["kernel"]["output_tokens_per_s"]
                )
            rows.append(row)
            print(
                f"round {r} (load {row['load']:.1f}): "
                + ", ".join(
                    f"{n} {row[n]['output_tokens_per_s']:,.0f} tokens/s "
                    f"({row[n]['cpu_ms_per_token']:.2f} CPU ms/token)"
                    for n in bases
                )
                + "; ratios "
                + ", ".join(f"{n} {row[n + '_ratio']:.2f}" for n in apps),
                flush=True,
            )
    for name in [k for k in rows[0] if k.endswith("_ratio")]:
        ratios = sorted(row[name] for row in rows)
        app = name[: -len("_ratio")]
        cpu = {
            r: sorted(row[app][f"{r}cpu_ms_per_token"] for row in rows)[len(rows) // 2]
            for r in ("", *(f"{r}_" for r in ROLES))
        }
        print(
            f"median {name} {ratios[len(ratios) // 2]:.2f}, CPU ms per token "
            f"{cpu['']:.2f} (replica {cpu['replica_']:.2f}, ingress {cpu['ingress_']:.2f}, "
            f"proxy {cpu['proxy_']:.2f}, rest of Ray {cpu['other_']:.2f})"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
