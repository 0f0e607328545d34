"""Streamed replies through the HTTP core, on both adapters, over real sockets.

A route whose reply is a stream of server-sent events (what the OpenAI-compatible routes
will send): each chunk reaches the client before the next is made, and a client that
leaves mid-stream has the stream closed (its ``finally`` runs), on tornado (the kernel
server) and on the Starlette adapter Ray's replicas use (run here under uvicorn).
"""

from __future__ import annotations

import asyncio
import http.client
import threading
import time

import pytest
import tornado.httpserver
import tornado.netutil

from labserve.runtime.loop import background_loop
from labserve.server.app import make_app
from labserve.server.core import TABLE, HttpCore
from labserve.server.exchange import Exchange, Reply
from labserve.server.routing import Route, Verb
from labserve.server.state import ServerState

STATE = ServerState(runners={}, token="t", token_everywhere=False, max_body_bytes=1024)


class Ticks:
    """``GET /ticks/{n}``: event 0, then (once the test says go) events 1.. n-1 or forever."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.closed = threading.Event()
        self.sent = 0

    async def handler(self, ex: Exchange) -> Reply:
        n = int(ex.params["n"]) if ex.params["n"].isdigit() else None
        return Reply(200, headers={"Content-Type": "text/event-stream"}, stream=self.events(n))

    async def events(self, n: int | None):
        try:
            i = 0
            while n is None or i < n:
                self.sent += 1
                yield f"data: {i}\n\n".encode()
                # The client must read event 0 first. A threading.Event (the test's thread
                # sets it), polled: an asyncio.Event cannot be set from another thread.
                while not self.go.is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.005)
                i += 1
        finally:
            self.closed.set()

    def core(self) -> HttpCore:
        route = Route("/ticks/{n}", {"GET": Verb(self.handler, "Server-sent ticks")})
        return HttpCore(STATE, table=(*TABLE, route))


@pytest.fixture
def ticks():
    return Ticks()


def tornado_port(core: HttpCore):
    bg = background_loop()

    def start():
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server = tornado.httpserver.HTTPServer(make_app(STATE, core))
        server.add_sockets(sockets)
        return server, sockets[0].getsockname()[1]

    server, port = bg.call(start)

    async def close():
        server.stop()
        await server.close_all_connections()

    return port, lambda: bg.run(close(), timeout=10)


def uvicorn_port(core: HttpCore):
    uvicorn = pytest.importorskip("uvicorn")
    from starlette.requests import Request

    from labserve.ray.http import Routes

    routes = Routes(core)

    async def app(scope, receive, send):
        response = await routes(Request(scope, receive))
        await response(scope, receive, send)

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]

    def stop():
        server.should_exit = True
        thread.join(10)

    return port, stop


SERVERS = {"tornado": tornado_port, "starlette": uvicorn_port}


@pytest.mark.parametrize("adapter", SERVERS)
def test_each_chunk_reaches_the_client_as_it_is_made(ticks, adapter):
    port, stop = SERVERS[adapter](ticks.core())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/ticks/3")
        reply = conn.getresponse()
        assert reply.status == 200 and reply.getheader("Content-Type") == "text/event-stream"
        assert reply.readline() == b"data: 0\n"  # before event 1 exists: not buffered
        assert ticks.sent == 1
        ticks.go.set()
        assert reply.read() == b"\ndata: 1\n\ndata: 2\n\n"
        assert ticks.closed.wait(10)
    finally:
        conn.close()
        stop()


@pytest.mark.parametrize("adapter", SERVERS)
def test_a_client_that_leaves_mid_stream_has_the_stream_closed(ticks, adapter):
    port, stop = SERVERS[adapter](ticks.core())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/ticks/forever")
        reply = conn.getresponse()
        assert reply.readline() == b"data: 0\n"
        ticks.go.set()
        assert reply.readline() == b"\n"
        conn.sock.close()  # the client leaves; the stream would go on forever
        reply.close()
        assert ticks.closed.wait(10), "the stream was not closed"
        sent = ticks.sent
        time.sleep(0.1)
        assert ticks.sent == sent  # nothing more is made for nobody
    finally:
        conn.close()
        stop()


@pytest.mark.parametrize("adapter", SERVERS)
def test_a_client_that_leaves_while_the_stream_waits_has_it_closed_at_once(ticks, adapter):
    # The stream waits (for a next token, say) and writes nothing: only the disconnect
    # itself can tell the server, and the stream's wait must be cut short.
    port, stop = SERVERS[adapter](ticks.core())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/ticks/forever")
        reply = conn.getresponse()
        assert reply.readline() == b"data: 0\n"
        conn.sock.close()
        reply.close()
        assert ticks.closed.wait(10), "the waiting stream was not closed"
        assert ticks.sent == 1
    finally:
        conn.close()
        stop()
