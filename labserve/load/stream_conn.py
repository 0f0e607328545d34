"""Keep-alive HTTP/1.1 connections that hand a streamed reply over as it arrives. Loop-only.

The request load generator's pool (:mod:`labserve.load.http_conn`) reads a whole reply and
then answers; a streamed generation must be seen event by event, each with the time its
last byte came in. This pool does the same little (a request's bytes made once; the
reply's status, headers and body by ``Content-Length``, chunked, or up to the close) and
passes each piece of the body to the request's :class:`StreamHandler` with the time it
was read (``time.monotonic``, read once per read: events that came in one read arrived
together). Every ending is reported once to the handler (:meth:`StreamHandler.ended`),
never raised: a reset or a stall is a measurement. A request whose stream goes quiet for
``idle_timeout_s`` (no byte of head or body) ends as ``timeout``: a long stream that keeps
making progress is not cut.
"""

from __future__ import annotations

import asyncio
import collections
import re
import ssl
from typing import cast

from labserve.base.vocabulary import CONNECT_ERROR, RESET, TIMEOUT
from labserve.load.records import clock_s

__all__ = ["StreamHandler", "StreamPool"]

_MAX_HEAD = 64 * 1024
_STATUS = re.compile(rb"HTTP/1\.([01]) (\d{3})(?: |\r|$)")
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)[ \t]*(?:\r|$)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)
_CONNECTION = re.compile(rb"\r\nconnection:[ \t]*([!-~]+)", re.IGNORECASE)
_TYPE = re.compile(rb"\r\ncontent-type:[ \t]*([^\r;]*)", re.IGNORECASE)


class StreamHandler:
    """What one streamed request is told: its reply's head, its body piece by piece, its end.

    Called on the loop, in this order: :meth:`head` once (if a reply came), :meth:`body`
    for each piece, then :meth:`ended` exactly once, however the request ended.
    """

    def head(self, status: int, content_type: str, now: float) -> None:
        """The reply's status and content type came in at ``now``."""

    def body(self, data: bytes, now: float) -> None:
        """A piece of the (de-chunked) body came in at ``now``."""

    def ended(self, outcome: int | None, detail: str, now: float) -> None:
        """The request ended at ``now``: ``None`` when the reply is complete, else an outcome.

        ``outcome`` is ``reset``, ``timeout`` or ``connect_error`` (``detail`` says why).
        """


class _BadReply(Exception):
    """A reply that does not parse as HTTP/1.1 (internal: becomes a ``reset``)."""


class _StreamConnection(asyncio.Protocol):
    """One keep-alive connection, one streamed request at a time. Loop-only."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.handler: StreamHandler | None = None
        self.done: asyncio.Future[None] | None = None
        self.reusable = True
        self.last_read = 0.0
        self._buf = b""
        self._remaining = -1  # body bytes still to read; -1 while reading the head
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk still to come (chunked)
        self._crlf_left = 0  # bytes of the CRLF after a chunk still to come
        self._until_close = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def send(self, data: bytes, handler: StreamHandler) -> asyncio.Future[None]:
        """Write one request; the future ends when ``handler`` has been told the end."""
        assert self.transport is not None
        self.handler = handler
        self.done = asyncio.get_running_loop().create_future()
        self._buf = b""
        self._remaining = -1
        self._chunked = self._until_close = False
        self._chunk_left = self._crlf_left = 0
        self.last_read = clock_s()
        self.transport.write(data)
        return self.done

    def abort(self) -> None:
        """Drop the connection (its state is unknown)."""
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    def end(self, outcome: int | None, detail: str = "") -> None:
        """Tell the handler how the request ended (once) and free the connection."""
        handler, self.handler = self.handler, None
        done, self.done = self.done, None
        if outcome is not None:
            self.abort()
        if handler is not None:
            handler.ended(outcome, detail, clock_s())
        if done is not None and not done.done():
            done.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = self.last_read = clock_s()
        if self.handler is None:
            self.abort()  # bytes nobody asked for: this connection cannot be trusted
            return
        try:
            complete = self._consume(self._buf + data if self._buf else data, now)
        except (_BadReply, ValueError) as exc:
            self.end(RESET, f"the reply did not parse: {exc}")
            return
        if complete:
            self.end(None)

    def eof_received(self) -> bool | None:
        if self._until_close and self.handler is not None:
            self.reusable = False
            self.end(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self.handler is not None:
            if self._until_close and exc is None:
                self.end(None)
                return
            said = repr(exc) if exc is not None else "closed by the server"
            where = "before the reply" if self._remaining == -1 else "mid-stream"
            self.end(RESET, f"the connection broke {where} ({said})")

    def _consume(self, buf: bytes, now: float) -> bool:
        """Parse what ``buf`` holds; True when the reply is complete."""
        if self._remaining == -1 and not self._chunked and not self._until_close:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise _BadReply(f"no end of headers in {_MAX_HEAD} bytes")
                self._buf = buf
                return False
            if not self._head(buf[:end], now):  # 1xx: the real reply follows
                return self._consume(buf[end + 4 :], now)
            buf = buf[end + 4 :]
        assert self.handler is not None
        if self._chunked:
            return self._chunks(buf, now)
        self._buf = b""
        if self._until_close:
            if buf:
                self.handler.body(buf, now)
            return False
        piece = buf[: self._remaining]
        self._remaining -= len(piece)
        if piece:
            self.handler.body(piece, now)
        return self._remaining == 0

    def _head(self, head: bytes, now: float) -> bool:
        """Read the status line and headers; False for an interim (1xx) reply."""
        status = _STATUS.match(head)
        if status is None:
            raise _BadReply(f"status line {head[:80]!r}")
        code = int(status[2])
        if code < 200:
            return False
        keep_alive = status[1] == b"1"
        if (connection := _CONNECTION.search(head)) is not None:
            value = connection[1].lower()
            keep_alive = value == b"keep-alive" or (keep_alive and value != b"close")
        self.reusable = self.reusable and keep_alive
        length = _LENGTH.search(head)
        if code in (204, 304):
            self._remaining = 0
        elif _CHUNKED.search(head) is not None:
            self._chunked = True
            self._remaining = 0
        elif length is not None:
            self._remaining = int(length[1])
        else:
            self._until_close = True
            self._remaining = 0
            self.reusable = False
        kind = _TYPE.search(head)
        assert self.handler is not None
        self.handler.head(code, kind[1].strip().decode("latin-1").lower() if kind else "", now)
        return True

    def _chunks(self, buf: bytes, now: float) -> bool:
        """De-chunk ``buf`` into the handler (one call per read); True at the last chunk."""
        assert self.handler is not None
        pieces = []
        pos, size, complete = 0, len(buf), False
        while pos < size or self._chunk_left == 0:
            if self._chunk_left:  # inside a chunk's data
                piece = buf[pos : pos + self._chunk_left]
                pieces.append(piece)
                self._chunk_left -= len(piece)
                pos += len(piece)
                if self._chunk_left:
                    break
                self._crlf_left = 2
            if self._crlf_left:  # the CRLF after a chunk's data (skipped, not checked)
                skip = min(self._crlf_left, size - pos)
                pos += skip
                self._crlf_left -= skip
                if self._crlf_left:
                    break
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                break
            length = int(buf[pos:line_end].split(b";")[0], 16)
            if length == 0:
                if buf[line_end : line_end + 4] == b"\r\n\r\n":
                    trailers_end = line_end
                else:
                    trailers_end = buf.find(b"\r\n\r\n", line_end)
                if trailers_end >= 0:
                    pos, complete = trailers_end + 4, True
                break
            self._chunk_left = length
            pos = line_end + 2
        self._buf = buf[pos:] if pos < size else b""
        if pieces:
            self.handler.body(b"".join(pieces), now)
        return complete


class StreamPool:
    """Keep-alive connections to one host for streamed requests, at most ``limit`` open.

    Loop-only. A request takes an idle connection, or opens one while fewer than ``limit``
    are open, or waits for one to come free; that wait is part of the request (its
    latency runs from its intended time). A connection whose state is in doubt (an
    error, a timeout, a cancelled request, ``Connection: close``) is dropped.
    """

    def __init__(self, host: str, port: int, *, tls: bool = False, limit: int = 256) -> None:
        self.host = host
        self.port = port
        self.limit = limit
        self._ssl = ssl.create_default_context() if tls else None
        self._idle: list[_StreamConnection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    @property
    def has_idle(self) -> bool:
        """True when a request now would find a connection waiting (the open loop asks)."""
        return bool(self._idle) or self._open < self.limit

    async def prewarm(self, n: int, timeout_s: float) -> None:
        """Open up to ``n`` connections ahead of the run (failures are left to the run)."""
        n = min(n, self.limit) - self._open
        made = await asyncio.gather(
            *(self._connect(timeout_s) for _ in range(max(n, 0))), return_exceptions=True
        )
        for conn in made:
            if isinstance(conn, _StreamConnection):
                self._release(conn)

    async def stream(self, data: bytes, handler: StreamHandler, idle_timeout_s: float) -> float:
        """Send ``data`` and stream its reply to ``handler``; return the time it was written.

        Never raises for the request: ``handler.ended`` is told how it went (0.0 returned
        when it was never written). Cancelling gives the request up; the handler then
        hears nothing more (the caller records it as cancelled).
        """
        conn = await self._acquire(handler, idle_timeout_s)
        if conn is None:
            return 0.0
        loop = asyncio.get_running_loop()
        done = conn.send(data, handler)
        written_at = conn.last_read
        timer = loop.call_later(idle_timeout_s, _check_idle, conn, done, idle_timeout_s)
        try:
            await done
        except BaseException:  # cancelled: the connection's state is unknown
            conn.handler = conn.done = None
            conn.abort()
            self._drop()
            raise
        finally:
            timer.cancel()
        if conn.reusable and not self._closed:
            self._release(conn)
        else:
            conn.abort()
            self._drop()
        return written_at

    async def close(self) -> None:
        """Close every idle connection and wake every waiter (idempotent)."""
        self._closed = True
        for conn in self._idle:
            conn.abort()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.cancel()

    async def _acquire(self, handler: StreamHandler, timeout_s: float) -> _StreamConnection | None:
        """A connection ready to send on; None after telling ``handler`` why there is none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            while self._idle:
                conn = self._idle.pop()
                if conn.reusable and conn.transport is not None and not conn.transport.is_closing():
                    return conn
                self._drop()
            if self._open < self.limit:
                try:
                    return await self._connect(deadline - loop.time())
                except (asyncio.TimeoutError, TimeoutError):
                    handler.ended(TIMEOUT, "no connection in time", clock_s())
                except OSError as exc:
                    handler.ended(CONNECT_ERROR, f"cannot connect: {exc}", clock_s())
                return None
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            timer = loop.call_at(deadline, _expire, waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if not timer.cancelled() and loop.time() >= deadline:
                    handler.ended(TIMEOUT, "no connection in time", clock_s())
                    return None
                raise
            finally:
                timer.cancel()

    async def _connect(self, timeout_s: float) -> _StreamConnection:
        loop = asyncio.get_running_loop()
        if timeout_s <= 0:
            raise asyncio.TimeoutError()
        self._open += 1
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_StreamConnection, self.host, self.port, ssl=self._ssl),
                timeout_s,
            )
        except BaseException:
            self._drop()
            raise
        return conn

    def _release(self, conn: _StreamConnection) -> None:
        self._idle.append(conn)
        self._wake_one()

    def _drop(self) -> None:
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.cancel()


def _check_idle(conn: _StreamConnection, done: asyncio.Future[None], idle_timeout_s: float) -> None:
    """End the request if its stream has been quiet for ``idle_timeout_s``; else look again."""
    if done.done() or conn.done is not done:
        return
    quiet_s = clock_s() - conn.last_read
    if quiet_s >= idle_timeout_s:
        conn.end(TIMEOUT, f"no byte for {idle_timeout_s:g} s")
        return
    loop = asyncio.get_running_loop()
    loop.call_later(idle_timeout_s - quiet_s, _check_idle, conn, done, idle_timeout_s)
