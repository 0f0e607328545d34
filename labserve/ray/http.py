"""labserve's HTTP routes behind Ray Serve's proxy: a thin Starlette adapter over the core.

The routes, guards, bodies and errors are the tornado server's own
(:mod:`labserve.server.core`); only the request and response objects are Starlette's, and
``/stats``, ``/metrics`` and ``PATCH /config`` go through the application's stats board
(a :class:`~labserve.server.exchange.Backend`), so they cover every replica. Runs on the
replica's event loop; every function here is loop-only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from labserve.metrics.snapshot import Snapshot
from labserve.runtime.served import ServedMethod
from labserve.server.core import HttpCore
from labserve.server.exchange import Backend, Head, Reply
from labserve.server.state import ServerState

__all__ = ["BoardBackend", "Routes", "ready_together"]

T = TypeVar("T")


class BoardBackend(Backend):
    """``/stats``, ``/metrics`` and live config through the application's stats board.

    ``stats`` gives ``/stats``'s JSON and ``merged`` the snapshots ``/metrics`` shows;
    ``configure`` applies a live change to every replica (through Ray Serve's
    ``user_config``) and returns the configs.
    """

    def __init__(
        self,
        state: ServerState,
        *,
        stats: Callable[[], Awaitable[dict[str, Any]]],
        merged: Callable[[], Awaitable[list[Snapshot]]],
        configure: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]],
        merged_generation: Callable[[], Awaitable[list[Any]]] | None = None,
    ) -> None:
        super().__init__(state)
        self._stats = stats
        self._merged = merged
        self._configure = configure
        self._merged_generation = merged_generation

    async def stats(self) -> dict[str, Any]:
        """Merged per method, and each replica's view."""
        return await self._stats()

    async def snapshots(self) -> list[Any]:
        """One merged snapshot per batchable method."""
        return await self._merged()

    async def generation_snapshots(self) -> list[Any]:
        """One merged snapshot per generative method (every replica's)."""
        if self._merged_generation is None:
            return await super().generation_snapshots()
        return await self._merged_generation()

    async def configure(self, changes: list[tuple[ServedMethod, dict[str, Any]]]) -> dict[str, Any]:
        """Every replica's config changed (validated already); the configs deployed."""
        configs: dict[str, Any] = {}
        for method, settings in changes:
            configs = await self._configure(method.name, settings)
        return configs


class Routes:
    """The HTTP routes of one replica: Starlette's request in, Starlette's response out.

    The path routed is what follows Serve's ``root_path`` (the application's route prefix:
    Serve's proxy passes the whole path), after ``mount``, the routes' own prefix when the
    application serves only them (the ingress, at ``<route prefix>/v1``).
    """

    def __init__(self, core: HttpCore, *, mount: str = "", interval_s: float = 0.0) -> None:
        self.core = core
        self.mount = mount
        self.interval_s = interval_s
        """A stream's chunks go at most once per this many seconds (see ready_together)."""

    async def __call__(self, request: Request) -> Response:
        """Answer one HTTP request; every refusal is a typed JSON error."""
        # The path and query straight from the ASGI scope: Starlette's ``request.url`` builds
        # and re-parses a whole URL, a visible share of this adapter's time per request.
        scope = request.scope
        query = scope.get("query_string", b"").decode("latin-1")
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = self.mount + path[len(root) :] or "/"
        head = Head(request.method, path, request.headers, query)
        exchange = self.core.begin(head)
        if exchange.reads_body and not exchange.answer_now:
            async for chunk in request.stream():
                if not exchange.feed(chunk):
                    break
        reply = await exchange.respond()
        if reply is None:  # the client went away
            return Response(status_code=499)
        return _response(reply, self.interval_s)


def _response(reply: Reply, interval_s: float = 0.0) -> Response:
    if reply.stream is None:
        return Response(reply.body, reply.status, dict(reply.headers))
    return StreamingResponse(_chunks(reply, interval_s), reply.status, dict(reply.headers))


async def _chunks(reply: Reply, interval_s: float) -> AsyncIterator[bytes]:
    """The reply's chunks, those ready together sent as one (see :func:`ready_together`)."""
    stream = reply.stream
    assert stream is not None
    if reply.body:
        yield reply.body
    async with contextlib.aclosing(ready_together(stream, interval_s)) as batches:
        async for parts in batches:
            yield b"".join(parts)


async def ready_together(
    stream: AsyncIterator[T], interval_s: float = 0.0
) -> AsyncGenerator[list[T], None]:
    """``stream``'s items, those ready together as one list; closes ``stream`` at the end.

    Each item Serve streams between two processes costs the sender an object and a
    message, on the loop the generations run on: at 16 streams of TinyLM that cost kept a
    replica at 81% CPU for 0.32x the kernel server's tokens/s (benchmarks/RESULTS.md). A
    stream that falls behind has several items ready; they go as one. A stream that keeps
    up sends each item at once, or with ``interval_s`` at most one list per interval (the
    first at once: the time to the first item is not delayed), as Ray Serve LLM's
    ``stream_batching_interval_ms`` does (50 ms by default, its first batch included).
    The stream's own error is raised here.
    """
    queue: asyncio.Queue[tuple[T] | None] = asyncio.Queue()  # None: the stream ended

    async def pump() -> None:
        try:
            async for item in stream:
                queue.put_nowait((item,))
        finally:
            queue.put_nowait(None)

    task = asyncio.ensure_future(pump())
    loop = asyncio.get_running_loop()
    try:
        ended = False
        due = 0.0  # when the next list may go (the loop's time)
        while not ended:
            parts = [await queue.get()]
            wait = due - loop.time()
            if wait > 0 and parts[0] is not None:
                await asyncio.sleep(wait)  # what comes meanwhile joins this list
            while not queue.empty():
                parts.append(queue.get_nowait())
            ended = parts[-1] is None
            items = [p[0] for p in parts if p is not None]
            if items:
                yield items
                due = loop.time() + interval_s
        task.result()  # the stream's own error, raised here
    finally:
        task.cancel()
        await asyncio.wait([task])  # the pump is out of the stream before it is closed
        if not task.cancelled():
            task.exception()  # retrieved: a client that went away has no use for it
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
