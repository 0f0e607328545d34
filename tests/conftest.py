"""Fixtures shared across test folders."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable
from typing import Any

import pytest

RawReply = tuple[int, dict[str, str], bytes]


def raw_request(port: int, request: bytes, timeout_s: float = 60.0) -> RawReply:
    """Send ``request`` (exact bytes, headers and all) to 127.0.0.1:port; read one reply.

    Raises OSError (a reset, a timeout) when no reply comes. The wait is what a reply may
    take on a machine whose cores are busy with other work: through Ray's proxy at load
    14-20, 10 s ran out for a live config change and for 300 requests 32 at a time.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()


def build_request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    port: int = 0,
) -> bytes:
    """The bytes of an HTTP/1.1 request, ``Connection: close``, Host 127.0.0.1 unless given."""
    head = {"Host": f"127.0.0.1:{port}", "Content-Length": str(len(body)), "Connection": "close"}
    head.update(headers or {})
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items() if v is not None)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@pytest.fixture
def raw_http() -> Callable[..., RawReply]:
    """``raw_http(port, method, path, body=b"", headers=None)``: one request on a new socket."""

    def send(
        port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> RawReply:
        return raw_request(port, build_request(method, path, body, headers, port=port))

    return send


# `make test` runs the suite on two workers (pytest-xdist). Each file is one unit of work, so
# its tests stay on one worker, in order (a lesson's cells share one kernel; a module's
# fixtures start once); and these folders are each one unit, one test after another: Ray
# (one cluster at a time on a 2-core machine, ~1 GB each, its start-up waits on the raylet:
# the Ray tests and the two lessons with Ray share a worker), and the browser
# tests (a JupyterLab server and Chromium each). A scheduler, not xdist_group marks: under
# pytest 9.2 and xdist 3.8 `--dist loadgroup` ignores the marks (each test went alone).
_SHARED = {
    "tests/scale/": "ray",
    "notebooks/07-": "ray",
    "notebooks/12-": "ray",
    "tests/browser/": "browser",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            shared = [unit for prefix, unit in _SHARED.items() if path.startswith(prefix)]
            return shared[0] if shared else path

    return FileScheduling(config, log)
