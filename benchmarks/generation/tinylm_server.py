"""``labserve serve labserve.lab.demo:TinyLM`` in another process, for the generation benchmarks.

with tinylm_server(token="t") as base:      # http://127.0.0.1:PORT
    ...
with tinylm_process(tree=Path("/work/bench-old")) as (base, pid):   # another tree's labserve
    before = process_cpu_s(pid)
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def tinylm_process(
    *, token: str | None = None, tree: Path | None = None
) -> Iterator[tuple[str, int]]:
    """Serve TinyLM on a free loopback port until the block ends; yield its URL and pid.

    ``tree``: run from that checkout, importing its labserve (default: this environment's).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "labserve.cli", "serve", "labserve.lab.demo:TinyLM"]
    argv += ["--port", str(port), *(["--token", token] if token else [])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    server = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tree
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "serving tinylm at ...": it listens
        yield f"http://127.0.0.1:{port}", server.pid
    finally:
        server.terminate()
        server.wait(10)


@contextlib.contextmanager
def tinylm_server(token: str | None = None) -> Iterator[str]:
    """Serve TinyLM on a free loopback port until the block ends; yield its base URL."""
    with tinylm_process(token=token) as (base, _):
        yield base
