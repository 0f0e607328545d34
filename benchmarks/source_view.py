"""What one look at a method costs, per snapshot source: in-process, by URL, a Ray application.

    .venv/bin/python benchmarks/source_view.py [--views 200] [--no-ray]

The dashboard's pump calls ``source.view()`` ``hz`` times a second (5 by default). This
times ``view()`` (wall time, median and p99) for a runner in this process, the same runner
behind the kernel server by URL (``GET /stats`` + ``GET /config``), and a two-replica Ray
application (one call to its stats board, merged here), each while a light load runs, and
prints one JSON row per source. Ray starts locally with 2 CPUs and is shut down at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import socket
import statistics
import tempfile
import time

import numpy as np

import labserve
from labserve.lab.demo import SleepModel

X = np.ones((1, 4))


def measure(name: str, source: labserve.MethodSource, views: int) -> dict[str, object]:
    source.view()  # warm: connections, first report
    took = []
    cpu0 = time.process_time()
    for _ in range(views):
        t = time.perf_counter()
        view = source.view()
        took.append(1000 * (time.perf_counter() - t))
    cpu_ms = 1000 * (time.process_time() - cpu0) / views
    took.sort()
    return {
        "source": name,
        "views": views,
        "median_ms": round(statistics.median(took), 3),
        "p99_ms": round(took[int(0.99 * (views - 1))], 3),
        "process_cpu_ms_per_view": round(cpu_ms, 3),
        "replicas": len(view.replicas),
        "served": view.snapshot.served,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--views", type=int, default=200)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    runner = labserve.Runner(SleepModel(a_ms=1.0, b_ms=0.05), name="sleep")
    server = labserve.serve(runner)
    load = labserve.start_load(runner.predict, example=X, duration_s=600,
                               arrivals=labserve.arrivals("poisson", rate_rps=200))  # fmt: skip
    try:
        [here] = labserve.method_sources(runner)
        print(json.dumps(measure("in-process", here, args.views)))
        [url] = labserve.method_sources(server.url, token=server.token)
        print(json.dumps(measure("url (kernel server)", url, args.views)))
    finally:
        load.stop()
        server.stop()
        runner.stop()
    if not args.no_ray:
        ray_views(args.views)


def ray_views(views: int) -> None:
    import ray
    from ray import serve

    import labserve.ray

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    temp_dir = tempfile.mkdtemp(prefix="lsview", dir="/tmp")  # short: Ray's sockets live here
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = labserve.ray.deploy(functools.partial(SleepModel, a_ms=1.0, b_ms=0.05),
                                  name="sleep", num_replicas=2)  # fmt: skip
        proxy = f"http://127.0.0.1:{port}"
        load = labserve.start_load(f"{proxy}/runners/sleep/predict", example=X, duration_s=600,
                                   arrivals=labserve.arrivals("poisson", rate_rps=100))  # fmt: skip
        try:
            [src] = app.method_sources(proxy_url=proxy)
            time.sleep(1.0)
            print(json.dumps(measure("ray (stats board)", src, views)))
            [url] = labserve.method_sources(proxy, token=app.token)
            print(json.dumps(measure("url (Ray's proxy)", url, views)))
        finally:
            load.stop()
            app.stop()
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
