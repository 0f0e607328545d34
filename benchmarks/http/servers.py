"""Servers for the HTTP benchmark, one per process: bare tornado, or labserve.serve.

`python benchmarks/http/servers.py bare PORT` answers every POST with the bytes labserve
would send for one row; `python benchmarks/http/servers.py labserve PORT noop|sleep` serves a
batchable model (no-op, or sleep 2 ms + 0.1 ms x items) on labserve's simple route.
"""

from __future__ import annotations

import asyncio
import sys
import threading

import numpy as np

import labserve
from labserve.lab.demo import SleepModel

REPLY = b"[[1.0, 1.0, 1.0, 1.0]]"


def bare(port: int) -> None:
    import tornado.web

    class Echo(tornado.web.RequestHandler):
        def post(self, *_: str) -> None:
            self.set_header("Content-Type", "application/json")
            self.finish(REPLY)

    async def main() -> None:
        app = tornado.web.Application(
            [(r"/runners/([^/]+)/([^/]+)", Echo)], log_function=lambda h: None
        )
        app.listen(port, address="127.0.0.1")
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


class Noop(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=64, max_latency_ms=20)
    def predict(self, x: np.ndarray) -> np.ndarray:
        return x


def serve(port: int, model: str) -> None:
    runnable = Noop() if model == "noop" else SleepModel(2.0, 0.1)
    runner = labserve.Runner(runnable, name="m", max_batch_size=64, max_latency_ms=20)
    labserve.serve(runner, port=port)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "bare":
        bare(port)
    else:
        serve(port, sys.argv[3])
