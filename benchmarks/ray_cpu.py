"""CPU per request of a replica and of Ray's proxy, through the proxy: labserve against plain.

Run from the repository root (needs the ray extra and Debian's wrk):

    .venv/bin/python benchmarks/ray_cpu.py adaptive,plain,fixed,plain,adaptive
    .venv/bin/python benchmarks/ray_cpu.py adaptivespy,plainspy   # py-spy raw profiles too

Each round deploys one replica (labserve on the given strategy, or ray_bench's PlainBatch),
warms it, runs wrk -t1 -c64 for 10 s and reads the replica's and the proxy's CPU time from
/proc before and after. ``<round>spy`` also records the replica with py-spy for 8 s
(100 Hz, threads, raw format) into /tmp/ray_cpu_<round>.txt.
"""

import functools
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, "benchmarks")
import ray
import ray_bench as rb
from ray import serve

import labserve
import labserve.ray
from labserve.lab.demo import SleepModel


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def pids(pattern):
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def measure(path, replica_pattern, label, spy=None):
    rb.warm(path)
    rep = pids(replica_pattern)[0]
    proxy = pids("ProxyActor")[0]
    c0, p0 = cpu_s(rep), cpu_s(proxy)
    sp = None
    if spy:
        sp = subprocess.Popen(
            [
                ".venv/bin/py-spy",
                "record",
                "--pid",
                str(rep),
                "--duration",
                "8",
                "--rate",
                "100",
                "--threads",
                "--format",
                "raw",
                "-o",
                spy,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    result = rb.wrkrun.run(f"http://127.0.0.1:{rb.PORT}{path}", seconds=rb.SECONDS)
    c1, p1 = cpu_s(rep), cpu_s(proxy)
    if sp:
        sp.wait()
    n = result["rps"] * rb.SECONDS
    replica_ms, proxy_ms = 1000 * (c1 - c0) / n, 1000 * (p1 - p0) / n
    latency = f"{result['p50_ms']} / {result['p99_ms']}"
    print(
        f"| {label} | {result['rps']:.0f} | {replica_ms:.2f} | {proxy_ms:.2f} | {latency} |",
        flush=True,
    )


def labserve_run(strategy, spy=None):
    app = labserve.ray.deploy(
        functools.partial(SleepModel, 2.0, 0.1),
        name="m",
        max_batch_size=64,
        max_latency_ms=20,
        max_ongoing_requests=128,
        strategy=strategy,
    )
    try:
        measure("/runners/m/predict", "ServeReplica:m", f"labserve {strategy}", spy)
    finally:
        app.stop()


def plain_run(spy=None):
    serve.run(rb.PlainBatch.bind(), name="plain", route_prefix="/")
    try:
        measure("/", "ServeReplica:plain", "plain", spy)
    finally:
        serve.delete("plain")


temp = tempfile.mkdtemp(prefix="lsbench", dir="/tmp")
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
serve.start(http_options={"host": "127.0.0.1", "port": rb.PORT})
print("| deployment | req/s | replica CPU ms/req | proxy CPU ms/req | wrk p50 / p99 ms |")
print("|---|---:|---:|---:|---:|")
try:
    for round_ in sys.argv[1].split(","):
        if round_ == "plain":
            plain_run()
        elif round_ == "plainspy":
            plain_run("/tmp/ray_cpu_plain.txt")
        elif round_.endswith("spy"):
            labserve_run(round_[:-3], f"/tmp/ray_cpu_{round_[:-3]}.txt")
        else:
            labserve_run(round_)
finally:
    serve.shutdown()
    ray.shutdown()
