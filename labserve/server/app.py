"""The tornado adapter: one handler class that hands every request to the HTTP core.

It reads the body in chunks (``@stream_request_body``) so that a refusal decided from the
headers drops the body instead of buffering it, and withdraws the model call when the
client disconnects. Loop-only: tornado builds and runs handlers on labserve's loop.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any
from urllib.parse import unquote

import tornado.web
from tornado.iostream import StreamClosedError

from labserve.base.errors import LabServeError, MethodNotAllowedError, ServerError
from labserve.server.core import HttpCore
from labserve.server.exchange import (
    Exchange,
    Head,
    Reply,
    allowed,
    error_reply,
    error_style,
    log,
)
from labserve.server.state import ServerState

__all__ = ["Replies", "make_app"]


class Replies:
    """The replies an app is still writing, so that stopping can let them end. Loop-only.

    A reply counts from its request's headers until tornado finishes it (its last bytes
    handed to the socket) or its client goes away.
    """

    def __init__(self) -> None:
        self._open: set[tornado.web.RequestHandler] = set()
        self._ended: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._open)

    def begin(self, handler: tornado.web.RequestHandler) -> None:
        """``handler`` began a reply."""
        self._open.add(handler)

    def end(self, handler: tornado.web.RequestHandler) -> None:
        """``handler``'s reply ended (idempotent)."""
        self._open.discard(handler)
        if not self._open and self._ended is not None:
            self._ended.set()

    async def ended(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every reply to end; True if they did."""
        if not self._open:
            return True
        self._ended = asyncio.Event()
        try:
            await asyncio.wait_for(self._ended.wait(), timeout_s)
        except TimeoutError:
            return False
        finally:
            self._ended = None
        return True


@tornado.web.stream_request_body
class _Handler(tornado.web.RequestHandler):
    """Every route: the core decides, this handler reads and writes."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "DELETE", "PATCH", "PUT", "OPTIONS")

    def initialize(self, core: HttpCore, replies: Replies) -> None:
        """Called by tornado with the route's arguments."""
        self.core = core
        self.replies = replies
        self.exchange: Exchange | None = None
        self._streaming: asyncio.Task[Any] | None = None

    async def prepare(self) -> None:
        """Begin the exchange; answer at once a body too big to read and drop."""
        request = self.request
        self.replies.begin(self)
        head = Head(request.method or "", unquote(request.path), request.headers, request.query)
        self.exchange = exchange = self.core.begin(head)
        if exchange.answer_now:
            await self._answer()
        elif exchange.reads_body:
            request.connection.set_max_body_size(exchange.read_limit)  # type: ignore[union-attr]

    def data_received(self, chunk: bytes) -> None:
        """Give one chunk of the body to the exchange (which drops it once refused)."""
        if self.exchange is not None:
            self.exchange.feed(chunk)

    async def _answer(self, *args: str) -> None:
        assert self.exchange is not None  # prepare ran
        reply = await self.exchange.respond()
        if reply is None or self._finished:
            return  # the client went away: nobody to answer
        self.set_status(reply.status)
        for name, value in reply.headers.items():
            self.set_header(name, value)
        if reply.stream is None:
            self.finish(reply.body or None)  # tornado refuses even b"" with a 204
        else:
            await self._stream(reply)

    get = head = post = delete = patch = put = options = _answer

    async def _stream(self, reply: Reply) -> None:
        """Send the reply's chunks as they come; stop (and close the stream) if the client goes."""
        assert reply.stream is not None and self.exchange is not None
        # A client that leaves cancels this task, wherever the stream is waiting (for its
        # next token, say), so the stream's ``finally`` frees what it holds at once.
        self._streaming = asyncio.current_task()
        # Each event goes out when written: with Nagle's algorithm on, a small write waits
        # for the ACK of the last one, which the client delays (measured: ITL p99 22 ms for
        # tokens 1 ms apart, and a chat's tokens all held behind its role chunk).
        self.request.connection.stream.set_nodelay(True)  # type: ignore[union-attr]
        try:
            if reply.body:
                self.write(reply.body)
            async for chunk in reply.stream:
                self.write(chunk)
                await self.flush()
        except (StreamClosedError, asyncio.CancelledError):
            if not self.exchange.gone and not self.request.connection.stream.closed():  # type: ignore[union-attr]
                raise  # the server stops
            self.exchange.cancel()
        finally:
            self._streaming = None
            aclose = getattr(reply.stream, "aclose", None)
            if aclose is not None:
                await aclose()
        if not self.exchange.gone:
            self.finish()

    def on_connection_close(self) -> None:
        """The client went away: withdraw its call (the runner counts it ``cancelled``).

        tornado's own hook ends a body still arriving (its handler task waits on it): without
        it, a client that vanished mid-body kept its task until ``body_timeout_s``.
        """
        super().on_connection_close()
        self.replies.end(self)
        if self.exchange is not None:
            self.exchange.cancel()
        if self._streaming is not None:
            self._streaming.cancel()

    def on_finish(self) -> None:
        """Tornado's hook once the reply's last bytes are written: it has ended."""
        self.replies.end(self)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """The JSON body of an error tornado raised itself (a method it does not know).

        In the error style of the path's routes: OpenAI's shape on ``/v1``.
        """
        error: LabServeError
        path = unquote(self.request.path)
        if status_code == 405:
            error = MethodNotAllowedError(self.request.method or "", path)
            found = self.core.router.match(path)
            if found is not None:
                self.set_header("Allow", allowed(found[0]))
        else:
            error = ServerError(self._reason)
        reply = error_reply(error, style=error_style(path))
        self.set_header("Content-Type", reply.headers["Content-Type"])
        self.finish(reply.body)

    def log_exception(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Log what tornado caught: a client's error in one line, a bug with its traceback."""
        # tornado's own version logs the URI (a token in it) and a traceback for 4xx too.
        uri = self.request.path + ("?..." if self.request.query else "")
        if isinstance(value, tornado.web.HTTPError) and value.status_code < 500:
            log.info("%s %s -> %d", self.request.method, uri, value.status_code)
        else:
            log.error(
                "%s %s failed inside labserve",
                self.request.method,
                uri,
                exc_info=(typ, value, tb) if typ is not None and value is not None else None,
            )


def make_app(
    state: ServerState, core: HttpCore | None = None, replies: Replies | None = None
) -> tornado.web.Application:
    """The tornado application over ``state`` (runners, token, limits). Build on the loop.

    ``core``: the HTTP core to serve (by default one over ``state`` with every route).
    ``replies``: where its replies in progress are counted (to wait for them at a stop).
    """
    core = core if core is not None else HttpCore(state)
    replies = replies if replies is not None else Replies()
    return tornado.web.Application(
        log_function=_quiet,
        handlers=[(r".*", _Handler, {"core": core, "replies": replies})],
    )


def _quiet(handler: tornado.web.RequestHandler) -> None:
    """No access log: in a notebook it would print a line per request into the cell."""
