"""A fast stand-in generation server: labserve's real /v1 routes over tornado, no model.

Run from the repository root: `.venv/bin/python benchmarks/generation/standin_server.py
--port 18790 --itl-ms 10`. Each generation yields `max_tokens` one-byte tokens (the
prompt's bytes, cycled), one every --itl-ms (0: as fast as the loop goes), and reports
usage. It stands in for a generator so that what the client costs can be measured
without a model sharing the machine; the HTTP path (routes, SSE framing, tornado) is
the real one.
"""

from __future__ import annotations

import argparse
import asyncio
import threading

import tornado.httpserver
import tornado.netutil

from labserve.generation.api import Finish
from labserve.runtime.loop import BackgroundLoop
from labserve.server.app import make_app
from labserve.server.core import HttpCore
from labserve.server.exchange import Backend
from labserve.server.state import ServerState


class StandIn:
    """Yields ``max_tokens`` tokens (default 16), one every ``itl_s``."""

    def __init__(self, itl_s: float) -> None:
        self.itl_s = itl_s

    def start(self, request):
        return _Stream(request, self.itl_s)


class _Stream:
    def __init__(self, request, itl_s: float) -> None:
        self.request = request
        self.itl_s = itl_s
        self.finish = None

    def __aiter__(self):
        return self._pieces()

    async def _pieces(self):
        prompt = self.request.prompt or "x"
        n = self.request.max_tokens or 16
        for i in range(n):
            await asyncio.sleep(self.itl_s)
            yield prompt[i % len(prompt)]
        self.finish = Finish("length", len(prompt), n)

    async def aclose(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=18790)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--model", default="standin")
    args = parser.parse_args()
    state = ServerState(runners={}, token="unused", token_everywhere=False, max_body_bytes=1 << 20)
    core = HttpCore(state, Backend(state, {args.model: StandIn(args.itl_ms / 1000.0)}))
    bg = BackgroundLoop("standin-server")
    bg.start()

    def listen() -> None:
        sockets = tornado.netutil.bind_sockets(args.port, "127.0.0.1")
        tornado.httpserver.HTTPServer(make_app(state, core)).add_sockets(sockets)

    bg.call(listen)
    print(f"standin serving at http://127.0.0.1:{args.port}/v1", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        bg.stop()


if __name__ == "__main__":
    main()
