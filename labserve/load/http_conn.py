"""A keep-alive pool of HTTP/1.1 connections for the load generator, on asyncio's protocols.

Measured on this project's 2-core machine (benchmarks/RESULTS.md): aiohttp's client spends
about 150 µs of CPU per request and this pool about 50. When the generator shares two
cores with the server it measures, that difference decides whether it keeps a schedule
of 2,500 req/s. The pool does only what a load generator needs: it writes a request
whose bytes were made once, reads one reply at a time per connection (status, headers,
a body by ``Content-Length``, chunked, or up to the close), and reports every ending as
an outcome (:class:`Reply`) instead of raising: a reset or a timeout is a measurement.
Loop-only: a pool belongs to the loop it was made on.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import re
import ssl
from typing import NamedTuple, cast

from labserve.base.vocabulary import (
    CLIENT_ERROR,
    CONNECT_ERROR,
    FAILED,
    REJECTED,
    RESET,
    SERVED,
    TIMEOUT,
)
from labserve.load.records import clock_s

__all__ = ["ConnectionPool", "Reply", "outcome_of_status", "request_bytes"]

_MAX_HEAD = 64 * 1024  # a reply's status line and headers, at most
# A reply's head is read with four searches (C speed) rather than a loop over its lines.
_STATUS = re.compile(rb"HTTP/1\.([01]) (\d{3})(?: |\r|$)")
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)[ \t]*(?:\r|$)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)
_CONNECTION = re.compile(rb"\r\nconnection:[ \t]*([!-~]+)", re.IGNORECASE)


class Reply(NamedTuple):
    """How one request ended: its outcome code, and the reply's status and body if any."""

    outcome: int
    status: int = 0
    body: bytes = b""
    detail: str = ""
    """Why it failed, when it did not get a reply (for messages)."""
    written_at: float = 0.0
    """Loop time the request was written (0: never, e.g. no connection)."""


def outcome_of_status(status: int) -> int:
    """The outcome code of an HTTP reply status.

    2xx served; 503 and 429 rejected (overload: come back later); 504 and 408 timeout;
    other 5xx failed; other 4xx ``client_error`` (the request itself was refused).
    """
    if 200 <= status < 300:
        return SERVED
    if status in (503, 429):
        return REJECTED
    if status in (504, 408):
        return TIMEOUT
    if status >= 500:
        return FAILED
    return CLIENT_ERROR


def request_bytes(
    method: str, path: str, host: str, headers: dict[str, str], body: bytes = b""
) -> bytes:
    """One HTTP/1.1 request, ready to write as it is (made once, written many times)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _BadReply(Exception):
    """A reply that does not parse as HTTP/1.1 (internal: becomes a ``reset`` outcome)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request in flight at a time. Loop-only."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Reply] | None = None
        self.reusable = True
        self._buf = bytearray()
        self._status = 0
        self._length = -1  # body bytes still to read; -1 while reading the head
        self._chunked = False
        self._until_close = False
        self._body = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, but quacks so).
        self.transport = cast(asyncio.Transport, transport)

    def send(self, data: bytes) -> asyncio.Future[Reply]:
        """Write one request; the future gets its Reply."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self._buf.clear()
        self._body.clear()
        self._length = -1
        self._chunked = self._until_close = False
        self.transport.write(data)
        return self.waiter

    def abort(self) -> None:
        """Drop the connection (its state is unknown)."""
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.abort()  # bytes nobody asked for: this connection cannot be trusted
            return
        self._buf += data
        try:
            done = self._parse()
        except (_BadReply, ValueError) as exc:
            self._finish(Reply(RESET, detail=f"the reply did not parse: {exc}"))
            self.abort()
            return
        if done:
            self._finish(Reply(outcome_of_status(self._status), self._status, bytes(self._body)))

    def eof_received(self) -> bool | None:
        if self._until_close and self.waiter is not None and not self.waiter.done():
            self._finish(Reply(outcome_of_status(self._status), self._status, bytes(self._body)))
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            if self._until_close and exc is None:
                reply = Reply(outcome_of_status(self._status), self._status, bytes(self._body))
            else:
                said = repr(exc) if exc is not None else "closed by the server"
                reply = Reply(RESET, detail=f"the connection broke before the reply ({said})")
            self._finish(reply)

    def _finish(self, reply: Reply) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)

    def _parse(self) -> bool:
        """Consume what the buffer holds; True when the reply is complete."""
        if self._length == -1 and not self._chunked and not self._until_close:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    raise _BadReply(f"no end of headers in {_MAX_HEAD} bytes")
                return False
            self._head(bytes(self._buf[:end]))
            del self._buf[: end + 4]
            if self._status < 200:  # 1xx: an interim reply; the real one follows
                self._length = -1
                return self._parse()
        if self._chunked:
            return self._chunks()
        if self._until_close:
            self._body += self._buf
            self._buf.clear()
            return False
        if len(self._buf) < self._length:
            return False
        self._body += self._buf[: self._length]
        del self._buf[: self._length]
        return True

    def _head(self, head: bytes) -> None:
        status = _STATUS.match(head)
        if status is None:
            raise _BadReply(f"status line {head[:80]!r}")
        self._status = int(status[2])
        keep_alive = status[1] == b"1"
        if (connection := _CONNECTION.search(head)) is not None:
            value = connection[1].lower()
            keep_alive = value == b"keep-alive" or (keep_alive and value != b"close")
        self.reusable = self.reusable and keep_alive
        length = _LENGTH.search(head)
        if self._status in (204, 304) or self._status < 200:
            self._length = 0
        elif _CHUNKED.search(head) is not None:
            self._chunked = True
            self._length = 0
        elif length is not None:
            self._length = int(length[1])
        else:
            self._until_close = True
            self.reusable = False

    def _chunks(self) -> bool:
        while True:
            line_end = self._buf.find(b"\r\n")
            if line_end < 0:
                return False
            size = int(bytes(self._buf[:line_end]).split(b";")[0], 16)
            if size == 0:
                trailers_end = self._buf.find(b"\r\n\r\n", line_end)
                if self._buf[line_end : line_end + 4] == b"\r\n\r\n":
                    trailers_end = line_end
                if trailers_end < 0:
                    return False
                del self._buf[: trailers_end + 4]
                return True
            start = line_end + 2
            if len(self._buf) < start + size + 2:
                return False
            self._body += self._buf[start : start + size]
            del self._buf[: start + size + 2]


class ConnectionPool:
    """Keep-alive HTTP/1.1 connections to one host, at most ``limit`` open. Loop-only.

    A request takes an idle connection, or opens one while fewer than ``limit`` are
    open, or waits for one to come free; ``timeout_s`` covers all of it, from the call
    to the reply's last byte. A connection whose state is in doubt (an error, a timeout,
    a cancelled request, ``Connection: close``) is dropped, never reused.
    """

    def __init__(self, host: str, port: int, *, tls: bool = False, limit: int = 64) -> None:
        self.host = host
        self.port = port
        self.limit = limit
        self._ssl = ssl.create_default_context() if tls else None
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()
        self._closed = False
        self.most_open = 0
        """The most connections open at once (opened ahead of the run, or as needed)."""
        self.waited_at_limit = 0
        """Requests that found all ``limit`` connections open and busy, and waited."""

    async def prewarm(self, n: int, timeout_s: float) -> None:
        """Open up to ``n`` connections ahead of the run (failures are left to the run)."""
        n = min(n, self.limit) - self._open
        results = await asyncio.gather(
            *(self._connect(timeout_s) for _ in range(max(n, 0))), return_exceptions=True
        )
        for conn in results:
            if isinstance(conn, _Connection):
                self._release(conn)

    def try_send(self, data: bytes, timeout_s: float) -> asyncio.Future[Reply] | None:
        """Send ``data`` at once on an idle connection; None when there is none at hand.

        The fast path of an open-loop run: no task, no coroutine. The future gets the
        Reply (never an exception); cancelling it gives the request up and drops its
        connection. The pool takes the connection back by itself.
        """
        conn = self._take_idle()
        if conn is None:
            return None
        loop = asyncio.get_running_loop()
        waiter = conn.send(data)
        timer = loop.call_at(loop.time() + timeout_s, _expire, waiter)
        waiter.add_done_callback(functools.partial(self._sent, conn, timer))
        return waiter

    def _sent(
        self, conn: _Connection, timer: asyncio.TimerHandle, waiter: asyncio.Future[Reply]
    ) -> None:
        timer.cancel()
        if waiter.cancelled() or not conn.reusable or not waiter.result().status:
            conn.abort()
            self._drop(conn)
        else:
            self._release(conn)

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and conn.transport is not None and not conn.transport.is_closing():
                return conn
            self._drop(conn)
        return None

    async def request(self, data: bytes, timeout_s: float) -> Reply:
        """Send ``data`` (a whole request) and return how it ended; never raises for it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        conn = self._take_idle()
        if conn is None:
            try:
                conn = await self._acquire(deadline)
            except (asyncio.TimeoutError, TimeoutError):
                return Reply(TIMEOUT, detail="no connection in time")
            except OSError as exc:
                return Reply(CONNECT_ERROR, detail=f"cannot connect: {exc}")
        waiter = conn.send(data)
        written_at = clock_s()  # the load records' clock, not the loop's
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            reply = (await waiter)._replace(written_at=written_at)
        except BaseException:  # cancelled: the reply may still come; the connection is lost
            conn.abort()
            self._drop(conn)
            raise
        finally:
            timer.cancel()
        if reply.outcome == TIMEOUT and not reply.status:
            conn.abort()
        if conn.reusable:
            self._release(conn)
        else:
            conn.abort()
            self._drop(conn)
        return reply

    async def close(self) -> None:
        """Close every connection (idempotent)."""
        self._closed = True
        for conn in self._idle:
            conn.abort()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.cancel()

    async def _acquire(self, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        counted = False
        while True:
            if self._open < self.limit:
                return await self._connect(deadline - loop.time())
            if not counted:
                self.waited_at_limit += 1
                counted = True
            waiter: asyncio.Future[_Connection | None] = loop.create_future()
            self._waiters.append(waiter)
            timer = loop.call_at(deadline, _expire_waiter, waiter)
            try:
                conn = await waiter
            finally:
                timer.cancel()
            if conn is not None:
                return conn
            # None: a connection was dropped, so there is room to open one.

    async def _connect(self, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        if timeout_s <= 0:
            raise asyncio.TimeoutError()
        self._open += 1
        self.most_open = max(self.most_open, self._open)
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port, ssl=self._ssl),
                timeout_s,
            )
        except BaseException:
            self._open -= 1
            self._wake_one(None)
            raise
        return conn

    def _release(self, conn: _Connection) -> None:
        if self._closed:
            conn.abort()
            self._drop(conn)
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def _drop(self, conn: _Connection) -> None:
        self._open -= 1
        self._wake_one(None)

    def _wake_one(self, value: _Connection | None) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(value)
                return


def _expire(waiter: asyncio.Future[Reply]) -> None:
    if not waiter.done():
        waiter.set_result(Reply(TIMEOUT, detail="no reply in time"))


def _expire_waiter(waiter: asyncio.Future[_Connection | None]) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())
