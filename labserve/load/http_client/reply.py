"""A whole reply, as request batching reads it: one outcome, the status and the body.

:class:`WholeReply` is the reader (:class:`~labserve.load.http_client.connection.ReplyReader`)
that keeps a reply until its end and then holds it as a :class:`Reply`; the other reader,
a streamed generation's, reads server-sent events as they come
(:mod:`labserve.load.generation.stream`). Loop-only, like the connection that feeds it.
"""

from __future__ import annotations

from typing import NamedTuple

from labserve.base.vocabulary import CANCELLED, CLIENT_ERROR, FAILED, REJECTED, SERVED, TIMEOUT
from labserve.load.http_client.connection import ReplyReader

__all__ = ["Reply", "WholeReply", "outcome_of_status"]


class Reply(NamedTuple):
    """How one request ended: its outcome code, and the reply's status and body if any."""

    outcome: int
    status: int = 0
    """0 when no whole reply came (``detail`` says why)."""
    body: bytes = b""
    detail: str = ""
    """Why it failed, when it did not get a reply (for messages)."""


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


class WholeReply(ReplyReader):
    """Keeps a reply's status and body; at its end, :attr:`reply` says how it went. Loop-only."""

    __slots__ = ("data", "reply", "status")

    def __init__(self) -> None:
        self.status = 0
        self.data = b""
        self.reply = Reply(CANCELLED, detail="given up before its end")
        """How the request ended (set when it ended; a request given up keeps this)."""

    def head(self, status: int, content_type: str, now: float) -> None:
        """Note the status."""
        self.status = status

    def body(self, data: bytes, now: float) -> None:
        """Keep the piece."""
        self.data = self.data + data if self.data else data

    def ended(self, outcome: int | None, detail: str, now: float) -> None:
        """Hold the reply (``outcome`` None), or why there is none."""
        if outcome is None:
            self.reply = Reply(outcome_of_status(self.status), self.status, self.data)
        else:
            self.reply = Reply(outcome, detail=detail)
