"""A keep-alive pool of HTTP/1.1 connections for the load generators, on asyncio's protocols.

Measured on this project's 2-core machine (benchmarks/RESULTS.md): aiohttp's client spends
about 150 µs of CPU per request and this pool about 50. When the generator shares two
cores with the server it measures, that difference decides whether it keeps a schedule
of 2,500 req/s. Both load generators use it: request batching reads each reply whole
(:class:`~labserve.load.http_client.reply.WholeReply`), a generation load reads its
stream's events as they come; the pool only finds each request a connection, times it
and takes the connection back. Loop-only: a pool belongs to the loop it was made on.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ssl

from labserve.base.vocabulary import CONNECT_ERROR, TIMEOUT
from labserve.load.http_client.connection import Connection, ReplyReader
from labserve.load.http_client.reply import Reply, WholeReply
from labserve.load.records import clock_s

__all__ = ["ConnectionPool"]


class ConnectionPool:
    """Keep-alive HTTP/1.1 connections to one host, at most ``limit`` open. Loop-only.

    A request takes an idle connection, or opens one while fewer than ``limit`` are
    open, or waits for one to come free; that wait is part of the request (its latency
    runs from its intended time). A connection whose state is in doubt (an error, a
    timeout, a cancelled request, ``Connection: close``) is dropped, never reused.
    """

    def __init__(self, host: str, port: int, *, tls: bool = False, limit: int = 64) -> None:
        self.host = host
        self.port = port
        self.limit = limit
        self._ssl = ssl.create_default_context() if tls else None
        self._idle: list[Connection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[Connection | None]] = collections.deque()
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
            if isinstance(conn, Connection):
                self._release(conn)

    def try_send(
        self, data: bytes, reader: ReplyReader, timeout_s: float
    ) -> asyncio.Future[None] | None:
        """Send ``data`` at once on an idle connection; None when there is none at hand.

        The fast path of an open-loop run: no task, no coroutine. The future ends when
        ``reader`` has been told the end (``timeout_s`` after the call at the latest);
        cancelling it gives the request up and drops its connection. The pool takes the
        connection back by itself.
        """
        conn = self._take_idle()
        if conn is None:
            return None
        loop = asyncio.get_running_loop()
        done = conn.send(data, reader)
        timer = loop.call_at(loop.time() + timeout_s, _expire, conn, done)
        done.add_done_callback(functools.partial(self._sent, conn, timer))
        return done

    async def send(
        self, data: bytes, reader: ReplyReader, timeout_s: float, *, idle_timeout: bool = False
    ) -> float:
        """Send ``data`` and read its reply into ``reader``; return when it was written.

        ``timeout_s`` covers the wait for a connection, then the reply: up to its last
        byte, or with ``idle_timeout`` each silence in it (a long stream that keeps coming
        is not cut). Never raises for the request: ``reader.ended`` is told how it went
        (0.0 returned when it was never written). Cancelling gives the request up; the
        reader then hears nothing more (the caller records it as cancelled).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        conn = self._take_idle()
        if conn is None:
            try:
                conn = await self._acquire(deadline)
            except (asyncio.TimeoutError, TimeoutError):
                reader.ended(TIMEOUT, "no connection in time", clock_s())
                return 0.0
            except OSError as exc:
                reader.ended(CONNECT_ERROR, f"cannot connect: {exc}", clock_s())
                return 0.0
        done = conn.send(data, reader)
        written_at = conn.last_read
        if idle_timeout:
            timer = loop.call_later(timeout_s, _check_idle, conn, done, timeout_s)
        else:
            timer = loop.call_at(deadline, _expire, conn, done)
        try:
            await done
        except BaseException:  # cancelled: the reply may still come, the connection is lost
            conn.detach()
            self._drop()
            raise
        finally:
            timer.cancel()
        self._done_with(conn)
        return written_at

    async def request(self, data: bytes, timeout_s: float) -> Reply:
        """Send ``data`` (a whole request) and return how it ended; never raises for it."""
        reader = WholeReply()
        await self.send(data, reader, timeout_s)
        return reader.reply

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

    def _done_with(self, conn: Connection) -> None:
        """Take back the connection of a request that ended: idle again, or dropped."""
        if conn.reusable and not self._closed:
            self._release(conn)
        else:
            conn.abort()
            self._drop()

    def _sent(
        self, conn: Connection, timer: asyncio.TimerHandle, done: asyncio.Future[None]
    ) -> None:
        """A request sent by :meth:`try_send` ended, or was given up."""
        timer.cancel()
        if done.cancelled():  # given up: the reply may still come, the connection is lost
            conn.detach()
            self._drop()
        else:
            self._done_with(conn)

    def _take_idle(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and conn.transport is not None and not conn.transport.is_closing():
                return conn
            self._drop()
        return None

    async def _acquire(self, deadline: float) -> Connection:
        loop = asyncio.get_running_loop()
        counted = False
        while True:
            if self._open < self.limit:
                return await self._connect(deadline - loop.time())
            if not counted:
                self.waited_at_limit += 1
                counted = True
            waiter: asyncio.Future[Connection | None] = loop.create_future()
            self._waiters.append(waiter)
            timer = loop.call_at(deadline, _expire_waiter, waiter)
            try:
                conn = await waiter
            finally:
                timer.cancel()
            if conn is not None:
                return conn
            # None: a connection was dropped, so there is room to open one.

    async def _connect(self, timeout_s: float) -> Connection:
        loop = asyncio.get_running_loop()
        if timeout_s <= 0:
            raise asyncio.TimeoutError()
        self._open += 1
        self.most_open = max(self.most_open, self._open)
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(Connection, self.host, self.port, ssl=self._ssl),
                timeout_s,
            )
        except BaseException:
            self._drop()
            raise
        return conn

    def _release(self, conn: Connection) -> None:
        if self._closed:
            conn.abort()
            self._drop()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def _drop(self) -> None:
        self._open -= 1
        while self._waiters:  # there is room to open one: the first waiter opens it
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _expire(conn: Connection, done: asyncio.Future[None]) -> None:
    """The request's time is up: end it as ``timeout`` unless it ended already."""
    if conn.done is done and not done.done():
        conn.end(TIMEOUT, "no reply in time")


def _check_idle(conn: Connection, done: asyncio.Future[None], idle_timeout_s: float) -> None:
    """End the request if its reply has been quiet for ``idle_timeout_s``; else look again."""
    if done.done() or conn.done is not done:
        return
    quiet_s = clock_s() - conn.last_read
    if quiet_s >= idle_timeout_s:
        conn.end(TIMEOUT, f"no byte for {idle_timeout_s:g} s")
        return
    loop = asyncio.get_running_loop()
    loop.call_later(idle_timeout_s - quiet_s, _check_idle, conn, done, idle_timeout_s)


def _expire_waiter(waiter: asyncio.Future[Connection | None]) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())
