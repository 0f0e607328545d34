"""CPU per request of a replica and of Ray's proxy, through the proxy: labserve against plain.

Run from the repository root (needs the ray extra and Debian's wrk):

    .venv/bin/python benchmarks/ray_cpu.py adaptive,plain,fixed,plain,adaptive
    .venv/bin/python benchmarks/ray_cpu.py adaptivespy,plainspy   # py-spy raw profiles too
    REPLICAS=2 .venv/bin/python benchmarks/ray_cpu.py adaptive,plain,plain,adaptive

Each round deploys REPLICAS replicas (default 1; labserve on the given strategy, or
ray_bench's PlainBatch), warms them, runs wrk -t1 -c64 for 10 s and reads from /proc, before
and after, the CPU time of the replicas (summed), of the proxy, of labserve's stats board
actor, and of the whole machine (every process: Ray's own, wrk, anything else running).
``<round>spy`` also records the replica with py-spy for 8 s
(100 Hz, threads, raw format) into /tmp/ray_cpu_<round>.txt; with SPY=proxy, Ray's proxy instead.
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


def thread_cpu_s(pid):
    """CPU seconds so far of each thread of ``pid``, by thread name (names repeat: summed)."""
    found: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                name = f.read().strip()
            found[name] = found.get(name, 0.0) + cpu_s(f"{pid}/task/{task}")
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return found


def pids(pattern):
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


REPLICAS = int(os.environ.get("REPLICAS", "1"))


def machine_s():
    """Busy CPU seconds of the whole machine so far (every core, every process)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def measure(path, replica_pattern, label, spy=None):
    rb.warm(path)
    reps = pids(replica_pattern)
    rep = reps[0]
    proxy = pids("ProxyActor")[0]
    boards = pids("StatsBoard")
    c0, p0 = sum(cpu_s(r) for r in reps), cpu_s(proxy)
    b0, m0 = sum(cpu_s(b) for b in boards), machine_s()
    t0 = thread_cpu_s(rep)
    sp = None
    if spy:
        sp = subprocess.Popen(
            [
                ".venv/bin/py-spy",
                "record",
                "--pid",
                str(proxy if os.environ.get("SPY") == "proxy" else rep),
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
    c1, p1 = sum(cpu_s(r) for r in reps), cpu_s(proxy)
    b1, m1 = sum(cpu_s(b) for b in boards), machine_s()
    t1 = thread_cpu_s(rep)
    if sp:
        sp.wait()
    n = result["rps"] * rb.SECONDS
    per = [1000 * d / n for d in (c1 - c0, p1 - p0, b1 - b0, m1 - m0)]
    latency = f"{result['p50_ms']} / {result['p99_ms']}"
    cells = " | ".join(f"{x:.2f}" for x in per)
    print(f"| {label} | {result['rps']:.0f} | {cells} | {latency} |", flush=True)
    if os.environ.get("THREADS"):  # the first replica's threads, ms of CPU per its request
        mine = n / len(reps)
        spent = {k: 1000 * (t1[k] - t0.get(k, 0.0)) / mine for k in t1}
        top = sorted(spent.items(), key=lambda kv: -kv[1])[:8]
        print("    threads: " + ", ".join(f"{k} {v:.2f}" for k, v in top), flush=True)


def labserve_run(strategy, spy=None):
    app = labserve.ray.deploy(
        functools.partial(SleepModel, 2.0, 0.1),
        name="m",
        max_batch_size=64,
        max_latency_ms=20,
        max_ongoing_requests=128,
        strategy=strategy,
        num_replicas=REPLICAS,
    )
    try:
        measure("/runners/m/predict", "ServeReplica:m", f"labserve {strategy}", spy)
    finally:
        app.stop()


def plain_run(spy=None):
    serve.run(rb.PlainBatch.options(num_replicas=REPLICAS).bind(), name="plain", route_prefix="/")
    try:
        measure("/", "ServeReplica:plain", "plain", spy)
    finally:
        serve.delete("plain")


temp = tempfile.mkdtemp(prefix="lsbench", dir="/tmp")
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
serve.start(http_options={"host": "127.0.0.1", "port": rb.PORT})
print(f"{REPLICAS} replica(s); CPU ms per request:")
print("| deployment | req/s | replicas | proxy | stats board | whole machine | wrk p50 / p99 ms |")
print("|---|---:|---:|---:|---:|---:|---:|")
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
