"""``labserve serve module:Class --ray --replicas N`` from a shell, on the session's Ray."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys
import time
import urllib.request

import ray
from ray import serve


def test_serve_ray_replicas_from_the_command_line(ray_cluster):
    address = ray.get_runtime_context().gcs_address
    command = [
        sys.executable,
        "-m",
        "labserve.cli",
        "serve",
        "labserve.lab.demo:SleepModel",
        "--ray",
        "--replicas",
        "2",
        "--ray-address",
        address,
        "--port",
        str(ray_cluster.port),
        "--name",
        "shell",
        "--router",
        "round_robin",  # labserve's router, through Serve's RequestRouter, from the shell
        "--stream-interval-ms",
        "20",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # no hang if it never says
            line = pool.submit(proc.stdout.readline).result(timeout=120)
        assert "serving shell on Ray Serve (2 replicas)" in line, line
        assert "router round_robin" in line, line
        assert "streams batched every 20 ms" in line, line
        request = urllib.request.Request(
            ray_cluster.url("/runners/shell/predict"),
            data=json.dumps([[1, 2, 3]]).encode(),
            headers={"Content-Type": "application/json"},
        )
        for _ in range(4):  # in turns: each replica takes two
            with urllib.request.urlopen(request, timeout=30) as reply:
                assert json.loads(reply.read()) == [[6]]
        deadline = time.monotonic() + 20
        while True:  # the replicas report every 0.25 s
            with urllib.request.urlopen(ray_cluster.url("/stats"), timeout=30) as reply:
                views = json.loads(reply.read())["replicas"].values()
            served = sorted(v["shell"]["predict"]["served"] for v in views)
            if served == [2, 2] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert served == [2, 2]
        assert serve.status().applications["shell"].deployments["shell"].status == "HEALTHY"
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "stopping" in out
    deadline = time.monotonic() + 30
    while "shell" in serve.status().applications and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "shell" not in serve.status().applications  # Ctrl-C deleted the application


def test_sweep_on_ray_tasks_from_the_command_line(ray_cluster, tmp_path):
    address = ray.get_runtime_context().gcs_address
    base = [sys.executable, "-m", "labserve.cli", "sweep", "--rates", "500,3000"]
    base += ["--max-batch-size", "8,32", "--duration", "1"]
    serial = subprocess.run(
        [*base, "--csv", str(tmp_path / "serial.csv")], capture_output=True, text=True, check=True
    )
    fanned = subprocess.run(
        [*base, "--ray", "--ray-address", address, "--csv", str(tmp_path / "ray.csv")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "wrote 4 rows" in serial.stdout and "wrote 4 rows" in fanned.stdout
    assert (tmp_path / "serial.csv").read_text() == (tmp_path / "ray.csv").read_text()
