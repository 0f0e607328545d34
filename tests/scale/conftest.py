"""One local Ray (real, from PyPI) for this folder's tests, and applications on it.

Ray starts once (about 10-20 s here) with 2 CPUs and Serve's proxy on a free loopback
port; after this folder's last test Serve and Ray shut down and no process of that Ray
(found by its own temp dir in their command lines) may remain.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
import ray
from ray import serve

import labserve.ray


@dataclass(frozen=True)
class Cluster:
    port: int
    temp_dir: str

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ray_processes(temp_dir: str) -> list[str]:
    """Live processes started by the Ray whose temp dir is ``temp_dir``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or ())
            if temp_dir in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.info['pid']}: {cmdline[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_gone(temp_dir: str, timeout_s: float = 20.0) -> list[str]:
    """Wait for that Ray's processes to exit; return those still there."""
    deadline = time.monotonic() + timeout_s
    while (left := ray_processes(temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Cluster]:
    # Package scope: started once (every test that needs Ray is in this folder) and shut
    # down right after its last test, so an idle Ray (its controller, proxy and GCS) does
    # not take CPU from the timing-sensitive tests that run later in the session.
    # A short path: Ray's unix sockets live under it (at most 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="lsray", dir="/tmp")
    labserve.ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield Cluster(port=port, temp_dir=temp_dir)
    finally:
        serve.shutdown()
        ray.shutdown()
    left = wait_gone(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)
    assert left == [], f"Ray processes left after shutdown: {left}"


@pytest.fixture
def deploy(ray_cluster: Cluster) -> Iterator[Callable[..., labserve.ray.RayApp]]:
    """``labserve.ray.deploy`` whose applications are deleted at teardown."""
    apps: list[labserve.ray.RayApp] = []

    def make(*args: Any, **kwargs: Any) -> labserve.ray.RayApp:
        app = labserve.ray.deploy(*args, **kwargs)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.stop()
