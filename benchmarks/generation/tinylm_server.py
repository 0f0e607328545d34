"""``labserve serve labserve.lab.demo:TinyLM`` in another process, for the generation benchmarks.

with tinylm_server(token="t") as base:      # http://127.0.0.1:PORT
    ...
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def tinylm_server(token: str | None = None) -> Iterator[str]:
    """Serve TinyLM on a free loopback port until the block ends; yield its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "labserve.cli", "serve", "labserve.lab.demo:TinyLM"]
    argv += ["--port", str(port), *(["--token", token] if token else [])]
    server = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "serving tinylm at ...": it listens
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)
