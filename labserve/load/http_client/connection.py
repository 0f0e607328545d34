"""One keep-alive HTTP/1.1 connection: it frames a reply and hands it to the request's reader.

The connection reads what a load generator needs and no more: the status line and headers
(four or five regular-expression searches, at C speed, not a loop over lines), then a body
by ``Content-Length``, chunked, or up to the close. It passes the reply to the request's
:class:`ReplyReader` as it comes: the head once, each piece of body with the time it was
read (``clock_s``, read once per read: what came in one read arrived together), and the
end exactly once, however the request ended. What a reader makes of it differs: the whole
reply (:class:`~labserve.load.http_client.reply.WholeReply`, request batching), or events
as they arrive (a streamed generation's server-sent events). Every ending is reported, never
raised: a reset or a stall is a measurement. Loop-only.
"""

from __future__ import annotations

import asyncio
import re
from typing import cast

from labserve.base.vocabulary import RESET
from labserve.load.records import clock_s

__all__ = ["Connection", "ReplyReader"]

_MAX_HEAD = 64 * 1024  # a reply's status line and headers, at most
_STATUS = re.compile(rb"HTTP/1\.([01]) (\d{3})(?: |\r|$)")
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)[ \t]*(?:\r|$)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)
_CONNECTION = re.compile(rb"\r\nconnection:[ \t]*([!-~]+)", re.IGNORECASE)
_TYPE = re.compile(rb"\r\ncontent-type:[ \t]*([^\r;]*)", re.IGNORECASE)


class ReplyReader:
    """What one request is told: its reply's head, its body piece by piece, its end. Loop-only.

    Called on the loop, in this order: :meth:`head` once (if a reply came), :meth:`body`
    for each piece, then :meth:`ended` exactly once, however the request ended; a request
    given up (cancelled) hears nothing more.
    """

    __slots__ = ()

    wants_type = False
    """Whether :meth:`head` needs the content type (reading it costs a search per reply)."""

    def head(self, status: int, content_type: str, now: float) -> None:
        """The reply's status (and content type, when asked for) came in at ``now``."""

    def body(self, data: bytes, now: float) -> None:
        """A piece of the (de-chunked) body came in at ``now``."""

    def ended(self, outcome: int | None, detail: str, now: float) -> None:
        """The request ended at ``now``: ``None`` when the reply is complete, else an outcome.

        ``outcome`` is ``reset``, ``timeout`` or ``connect_error`` (``detail`` says why).
        """


class _BadReply(Exception):
    """A reply that does not parse as HTTP/1.1 (internal: becomes a ``reset``)."""


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request in flight at a time. Loop-only."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader: ReplyReader | None = None
        self.done: asyncio.Future[None] | None = None
        self.reusable = True
        self.last_read = 0.0
        """When the request was written or a byte last came in (``clock_s``)."""
        self._buf = b""
        self._remaining = -1  # body bytes still to read; -1 while reading the head
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk still to come (chunked)
        self._crlf_left = 0  # bytes of the CRLF after a chunk still to come
        self._until_close = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        # A stream transport (uvloop's is not an asyncio.Transport subclass, but quacks so).
        self.transport = cast(asyncio.Transport, transport)

    def send(self, data: bytes, reader: ReplyReader) -> asyncio.Future[None]:
        """Write one request; the future ends when ``reader`` has been told the end."""
        assert self.transport is not None
        self.reader = reader
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

    def detach(self) -> None:
        """Give the request up: its reader hears nothing more; the connection is dropped."""
        self.reader = self.done = None
        self.abort()

    def end(self, outcome: int | None, detail: str = "", now: float | None = None) -> None:
        """Tell the reader how the request ended (once, at ``now``) and free the connection."""
        reader, self.reader = self.reader, None
        done, self.done = self.done, None
        if outcome is not None:
            self.abort()
        if done is None or done.done():  # given up meanwhile: the reader hears nothing
            return
        if reader is not None:
            reader.ended(outcome, detail, clock_s() if now is None else now)
        done.set_result(None)

    def data_received(self, data: bytes) -> None:
        """Frame what came in for the reader; end the request when its reply is complete."""
        now = self.last_read = clock_s()
        if self.reader is None:
            self.abort()  # bytes nobody asked for: this connection cannot be trusted
            return
        try:
            complete = self._consume(self._buf + data if self._buf else data, now)
        except (_BadReply, ValueError) as exc:
            self.end(RESET, f"the reply did not parse: {exc}")
            return
        if complete:
            self.end(None, "", now)

    def eof_received(self) -> bool | None:
        """The server closed its side: that ends a reply read up to the close."""
        if self._until_close and self.reader is not None:
            self.reusable = False
            self.end(None)
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: a request still reading ends as ``reset``."""
        self.reusable = False
        if self.reader is not None:
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
        assert self.reader is not None
        if self._chunked:
            return self._chunks(buf, now)
        self._buf = b""
        if self._until_close:
            if buf:
                self.reader.body(buf, now)
            return False
        piece = buf[: self._remaining]
        self._remaining -= len(piece)
        if piece:
            self.reader.body(piece, now)
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
        if code in (204, 304):
            self._remaining = 0
        elif _CHUNKED.search(head) is not None:
            self._chunked = True
            self._remaining = 0
        elif (length := _LENGTH.search(head)) is not None:
            self._remaining = int(length[1])
        else:
            self._until_close = True
            self._remaining = 0
            self.reusable = False
        reader = self.reader
        assert reader is not None
        kind = _TYPE.search(head) if reader.wants_type else None
        reader.head(code, kind[1].strip().decode("latin-1").lower() if kind else "", now)
        return True

    def _chunks(self, buf: bytes, now: float) -> bool:
        """De-chunk ``buf`` into the reader (one call per read); True at the last chunk."""
        assert self.reader is not None
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
            self.reader.body(b"".join(pieces), now)
        return complete
