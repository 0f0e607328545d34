"""Load-test fixtures: a deliberately bad HTTP/1.1 server on a real socket, for failure kinds.

Each request gets the next behaviour of a script, cycling: a reply with a status, a reply
framed another way (chunked, ``Connection: close``, no length), a dropped connection, a
reset (RST), or no reply at all. It counts what it did, so a test can compare the load
generator's outcomes with the server's own tally.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Sequence

import pytest


class FaultyServer:
    """Serves ``script`` (behaviour names, cycled) on 127.0.0.1 from its own thread."""

    def __init__(self, script: Sequence[str]) -> None:
        self.script = list(script)
        self.done: collections.Counter[str] = collections.Counter()
        self.requests = 0
        self.authorizations: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []

    def __enter__(self) -> FaultyServer:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        )
        self._server = fut.result(5)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def shut() -> None:
            assert self._server is not None
            self._server.close()
            for w in self._writers:  # every connection ends before the loop does
                w.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0)  # let the aborted transports close

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def url(self, path: str = "/runners/m/predict") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                    if name.lower() == b"authorization":
                        self.authorizations.append(value.strip().decode())
                await reader.readexactly(length)
                if head.startswith(b"GET "):  # /stats, metadata: not part of the script
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                kind = self.script[self.requests % len(self.script)]
                self.requests += 1
                self.done[kind] += 1
                if not await self._act(kind, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def _act(self, kind: str, writer: asyncio.StreamWriter) -> bool:
        """Do ``kind``; False when the connection is over."""
        body = b'{"ok": true}'
        if kind.isdigit():
            writer.write(
                b"HTTP/1.1 %s X\r\nContent-Length: %d\r\n\r\n%s" % (kind.encode(), len(body), body)
            )
        elif kind == "chunked":
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'5\r\n{"ok"\r\n7;ext=1\r\n: true}\r\n0\r\nX-Trailer: 1\r\n\r\n'
            )
        elif kind == "close":
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            writer.close()
            return False
        elif kind == "unframed":  # no length: the body runs to the close
            writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + body)
            await writer.drain()
            writer.close()
            return False
        elif kind == "garbage":
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            await writer.drain()
            return True
        elif kind == "drop":
            writer.close()
            return False
        elif kind == "rst":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        elif kind == "hang":
            await asyncio.Event().wait()
        await writer.drain()
        return True


def closed_port() -> int:
    """A port on 127.0.0.1 with nothing listening (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def faulty() -> Iterator[Callable[[Sequence[str]], FaultyServer]]:
    """Start FaultyServers with a script each; all are stopped at teardown."""
    started: list[FaultyServer] = []

    def make(script: Sequence[str]) -> FaultyServer:
        server = FaultyServer(script).__enter__()
        started.append(server)
        return server

    yield make
    for server in started:
        server.__exit__()


@pytest.fixture
def refused_url() -> str:
    """A URL on 127.0.0.1 where nothing listens."""
    return f"http://127.0.0.1:{closed_port()}/runners/m/predict"
