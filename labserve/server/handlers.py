"""What every route shares: the server's state, JSON errors, the token check, body limits.

Loop-only: tornado builds and runs handlers on labserve's background loop.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import tornado.web

from labserve.base.errors import (
    LabServeError,
    MethodNotAllowedError,
    PayloadTooLargeError,
    ServerError,
    UnauthorizedError,
)
from labserve.runtime.runner import Runner

__all__ = ["BaseHandler", "BodyHandler", "ServerState"]


@dataclass(frozen=True)
class ServerState:
    """What a server's handlers read: its runners, token and limits. Immutable, thread-safe."""

    runners: Mapping[str, Runner]
    token: str
    token_everywhere: bool  # every route needs the token (a non-loopback bind)
    max_body_bytes: int


class BaseHandler(tornado.web.RequestHandler):
    """JSON errors ``{"error": class name, "detail": message}`` with their status; the token."""

    def initialize(self, state: ServerState) -> None:
        """Called by tornado with the route's arguments."""
        self.state = state

    def prepare(self) -> None:
        """Checks made before any route runs."""
        if self.state.token_everywhere:
            self.require_token()

    def require_token(self) -> None:
        """Fail with UnauthorizedError unless the request carries the server's token."""
        sent = self.request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        sent = sent or self.get_query_argument("token", "")
        if not hmac.compare_digest(sent.encode(), self.state.token.encode()):
            self.fail(UnauthorizedError())

    def fail(self, error: LabServeError) -> NoReturn:
        """Answer with ``error`` (its status, its class name, its message) and stop."""
        self.set_status(error.status)
        retry_after_s = getattr(error, "retry_after_s", None)
        if retry_after_s is not None:
            self.set_header("Retry-After", str(max(1, round(retry_after_s))))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(self.error_body(error)))
        raise tornado.web.Finish()

    def error_body(self, error: LabServeError) -> dict[str, str]:
        """The JSON body of an error reply."""
        return {"error": error.kind, "detail": str(error)}

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """The JSON body of an error tornado raised itself."""
        # Errors tornado raises itself (a method the route does not answer) or a bug.
        error: LabServeError
        if status_code == 405:
            error = MethodNotAllowedError(self.request.method or "", self.request.path)
        else:
            error = ServerError(self._reason)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(self.error_body(error)))

    def reply_json(self, data: Any) -> None:
        """Answer 200 with ``data`` as JSON."""
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def runners(self) -> Mapping[str, Runner]:
        """The served runners by name."""
        return self.state.runners


class BodyHandler(BaseHandler):
    """Reads the body in chunks (with ``@stream_request_body``), refusing past the limit."""

    def prepare(self) -> None:
        """Refuse a declared body over the limit before reading it."""
        super().prepare()
        limit = self.state.max_body_bytes
        self._chunks: list[bytes] = []
        self._size = 0
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            self.fail(PayloadTooLargeError(limit, int(length)))
        self.request.connection.set_max_body_size(limit + 1)  # type: ignore[union-attr]

    def data_received(self, chunk: bytes) -> None:
        """Keep one chunk of the body, refusing past the limit."""
        self._size += len(chunk)
        if self._size > self.state.max_body_bytes:
            self.fail(PayloadTooLargeError(self.state.max_body_bytes))
        self._chunks.append(chunk)

    def body(self) -> bytes:
        """The whole body received."""
        return b"".join(self._chunks)
