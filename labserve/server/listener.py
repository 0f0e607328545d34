"""Accepting connections with bounds: at most ``max_connections`` open, calm when out of fds.

tornado's own accept handler takes every connection it can, and when ``accept()`` fails
with "Too many open files" it raises from the loop's reader callback: the listening socket
stays readable, so the loop calls it again at once, at 100% CPU, logging a traceback each
time. Here, at the connection limit the listener closes the connection that has waited
longest for a request (idle keep-alive, or never sent one), as nginx does when it runs
short, and accepts the new one; with none idle it stops accepting (the kernel's listen
backlog holds the rest, queued) and resumes when a connection closes. When ``accept()``
fails it pauses a moment and logs at most one line per interval. Loop-only.

The default limit comes from the process's file-descriptor limit (:func:`default_max_connections`),
so that idle clients cannot take every descriptor and keep a good request waiting for their
idle timeouts.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Any

from tornado import httputil
from tornado.httpserver import HTTPServer
from tornado.iostream import IOStream

from labserve.base.descriptors import socket_budget

__all__ = [
    "ACCEPT_RETRY_S",
    "MIN_IDLE_S",
    "BoundedHTTPServer",
    "Listener",
    "default_max_connections",
]

log = logging.getLogger("labserve.server")

ACCEPT_RETRY_S = 0.25
"""How long accepting pauses after ``accept()`` failed (out of file descriptors)."""
_LOG_EVERY_S = 10.0
_ACCEPT_BATCH = 128  # connections taken per wake-up, so one flood cannot starve the loop
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
MIN_IDLE_S = 0.5
"""How long a connection may wait for a request before it can be closed to make room: a
new one gets this long to send its request, however full the server is."""


def default_max_connections() -> int:
    """The default connection limit: ``min(512, (soft RLIMIT_NOFILE - 64) // 2)``, at least 8.

    Half of what is left once 64 descriptors are kept for the runtime and the model: the
    other half is for an in-kernel load generator's own sockets, in the same process. With
    ``ulimit -n 1024`` it is 480; with 256, 96.
    """
    return socket_budget()


class BoundedHTTPServer(HTTPServer):
    """tornado's HTTPServer that tells its :class:`Listener` what each connection does."""

    listener: Listener | None = None

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        """Tornado's hook as a connection begins to wait for its next request: it is idle."""
        delegate = super().start_request(server_conn, request_conn)
        listener = self.listener
        stream = getattr(server_conn, "stream", None)
        if listener is None or stream is None:
            return delegate
        listener.idle(stream)
        return _BusyOnHeaders(delegate, listener, stream)

    def on_close(self, server_conn: object) -> None:
        """Tornado's hook when a connection's request loop ends."""
        super().on_close(server_conn)
        stream = getattr(server_conn, "stream", None)
        if self.listener is not None and stream is not None:
            self.listener.closed(stream)


class _BusyOnHeaders(httputil.HTTPMessageDelegate):
    """Forwards to the request's delegate; the connection is busy once its headers came."""

    __slots__ = ("_inner", "_listener", "_stream")

    def __init__(
        self, inner: httputil.HTTPMessageDelegate, listener: Listener, stream: IOStream
    ) -> None:
        self._inner = inner
        self._listener = listener
        self._stream = stream

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> Any:
        self._listener.busy(self._stream)
        return self._inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Any:
        return self._inner.data_received(chunk)

    def finish(self) -> None:
        self._inner.finish()

    def on_connection_close(self) -> None:
        self._inner.on_connection_close()


class Listener:
    """Accepts connections on ``sockets`` for ``http``, at most ``max_connections`` at once.

    Loop-only: build, :meth:`start` and :meth:`stop` it on the loop that runs ``http``.
    """

    def __init__(
        self, http: BoundedHTTPServer, sockets: list[socket.socket], max_connections: int
    ) -> None:
        self.http = http
        self.sockets = sockets
        self.max_connections = max_connections
        self._streams: set[IOStream] = set()  # accepted, not closed (nor closed by us)
        # Waiting for a request (no headers yet), since when, longest first: at the limit the
        # first is closed to make room.
        self._idle: dict[IOStream, float] = {}
        self._room: asyncio.TimerHandle | None = None  # when the first idle may be closed
        self.evicted = 0  # idle connections closed to make room, over the listener's life
        self.accept_errors = 0  # accept() failures (out of fds), over the listener's life
        self._loop = asyncio.get_running_loop()
        self._reading = False
        self._stopped = False
        self._retry: asyncio.TimerHandle | None = None
        self._last_log_s = -_LOG_EVERY_S
        self._unlogged = 0
        http.listener = self

    def start(self) -> None:
        """Begin accepting."""
        self._read(True)

    def stop(self) -> None:
        """Stop accepting for good (the caller closes the sockets)."""
        self._stopped = True
        self._read(False)
        for timer in (self._retry, self._room):
            if timer is not None:
                timer.cancel()
        self.http.listener = None

    @property
    def open(self) -> int:
        """Connections accepted and not yet closed."""
        return len(self._streams)

    def idle(self, stream: IOStream) -> None:
        """``stream`` waits for a request: it is now the most recently idle."""
        if stream in self._streams:
            self._idle.pop(stream, None)
            self._idle[stream] = self._loop.time()

    def busy(self, stream: IOStream) -> None:
        """``stream`` sent a request's headers: it is not idle."""
        self._idle.pop(stream, None)

    def closed(self, stream: IOStream) -> None:
        """A connection closed: accept again if the limit had paused accepting."""
        self._idle.pop(stream, None)
        self._streams.discard(stream)
        if self.open < self.max_connections and self._retry is None:
            self._read(True)

    def _room_to_make(self) -> bool:
        """True if a connection has waited long enough for a request to be closed for room.

        If one will have soon, accepting resumes then; if none is idle, when one closes.
        """
        oldest = next(iter(self._idle.values()), None)
        if oldest is None:
            return False
        wait_s = oldest + MIN_IDLE_S - self._loop.time()
        if wait_s <= 0:
            return True
        if self._room is None:
            self._room = self._loop.call_later(wait_s, self._room_made)
        return False

    def _room_made(self) -> None:
        self._room = None
        if self._retry is None:
            self._read(True)

    def _make_room(self) -> None:
        """Close the connection idle longest (there is one)."""
        stream = next(iter(self._idle))
        del self._idle[stream]
        self._streams.discard(stream)
        self.evicted += 1
        stream.close()  # its request loop ends and tornado forgets it

    def _read(self, on: bool) -> None:
        if on == self._reading or (on and self._stopped):
            return
        self._reading = on
        for sock in self.sockets:
            if on:
                self._loop.add_reader(sock.fileno(), self._accept, sock)
            else:
                self._loop.remove_reader(sock.fileno())

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(_ACCEPT_BATCH):
            full = self.open >= self.max_connections
            if full and not self._room_to_make():
                self._read(False)  # the rest wait in the listen backlog
                return
            try:
                connection, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._accept_failed(exc)
                return
            if full:
                self._make_room()  # only now that someone is waiting for the room
            self._serve(connection, address)

    def _serve(self, connection: socket.socket, address: Any) -> None:
        stream = IOStream(connection)
        self._streams.add(stream)
        self._idle[stream] = self._loop.time()  # no request yet
        try:
            self.http.handle_stream(stream, address)
        except Exception:
            self.closed(stream)
            connection.close()
            raise

    def _accept_failed(self, exc: OSError) -> None:
        self.accept_errors += 1
        self._read(False)
        self._retry = self._loop.call_later(ACCEPT_RETRY_S, self._resume)
        now = self._loop.time()
        if now - self._last_log_s < _LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more since the last report)" if self._unlogged else ""
        hint = (
            "; raise the limit (ulimit -n) or lower Server(max_connections=...)"
            if exc.errno in _OUT_OF_RESOURCES
            else ""
        )
        log.warning(
            "cannot accept connections: %s%s; %d open, retrying every %g s%s",
            exc,
            more,
            self.open,
            ACCEPT_RETRY_S,
            hint,
        )
        self._last_log_s = now
        self._unlogged = 0

    def _resume(self) -> None:
        self._retry = None
        if self.open < self.max_connections:
            self._read(True)
