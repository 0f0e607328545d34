"""Accepting connections with bounds: at most ``max_connections`` open, calm when out of fds.

tornado's own accept handler takes every connection it can, and when ``accept()`` fails
with "Too many open files" it raises from the loop's reader callback: the listening socket
stays readable, so the loop calls it again at once, at 100% CPU, logging a traceback each
time. Here, at the connection limit the listener stops accepting (the kernel's listen
backlog holds the rest, queued) and resumes when a connection closes; when ``accept()``
fails it pauses a moment and logs at most one line per interval. Loop-only.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.iostream import IOStream

__all__ = ["ACCEPT_RETRY_S", "BoundedHTTPServer", "Listener"]

log = logging.getLogger("labserve.server")

ACCEPT_RETRY_S = 0.25
"""How long accepting pauses after ``accept()`` failed (out of file descriptors)."""
_LOG_EVERY_S = 10.0
_ACCEPT_BATCH = 128  # connections taken per wake-up, so one flood cannot starve the loop
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class BoundedHTTPServer(HTTPServer):
    """tornado's HTTPServer that tells its :class:`Listener` when a connection closed."""

    listener: Listener | None = None

    def on_close(self, server_conn: object) -> None:
        """Tornado's hook when a connection's request loop ends."""
        super().on_close(server_conn)
        if self.listener is not None:
            self.listener.closed()


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
        self.open = 0  # connections accepted and not yet closed
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
        if self._retry is not None:
            self._retry.cancel()
        self.http.listener = None

    def closed(self) -> None:
        """A connection closed: accept again if the limit had paused accepting."""
        self.open -= 1
        if self.open < self.max_connections and self._retry is None:
            self._read(True)

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
            if self.open >= self.max_connections:
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
            self.open += 1
            self._serve(connection, address)

    def _serve(self, connection: socket.socket, address: Any) -> None:
        try:
            stream = IOStream(connection)
            self.http.handle_stream(stream, address)
        except Exception:
            self.open -= 1
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
