"""What every route shares: the server's state, its guards, JSON errors, bodies, logging.

The guards, in order, on every request: the Host header (DNS rebinding), the Origin header
(pages of other sites), the token (on a non-loopback bind, or where a route asks for it),
then for routes with a body its Content-Type and size. Loop-only: tornado builds and runs
handlers on labserve's background loop.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import inspect
import ipaddress
import json
import logging
import weakref
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn
from urllib.parse import urlsplit

import tornado.web

from labserve.base.errors import (
    HostError,
    InputError,
    LabServeError,
    MethodNotAllowedError,
    ModelError,
    OriginError,
    PayloadTooLargeError,
    ServerError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)
from labserve.runtime.runner import Runner, RunnerMethod

__all__ = ["DISCARD_BYTES", "BaseHandler", "BodyHandler", "ServerState", "log"]

log = logging.getLogger("labserve.server")
"""Client errors (one line each, at INFO) and the server's own failures go here."""

DISCARD_BYTES = 64 * 1024 * 1024
"""How much of a refused body is read and dropped, so that clients which send the whole
body before reading (urllib, http.client) see the JSON error instead of a reset."""

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Loopback names, and the commonest loopback addresses (checked first: no parsing).
_LOCAL_NAMES = frozenset(
    {"localhost", "localhost.localdomain", "ip6-localhost", "127.0.0.1", "::1"}
)


@dataclass(frozen=True)
class ServerState:
    """What a server's handlers read: runners, token, guards and limits. Immutable, thread-safe."""

    runners: Mapping[str, Runner]
    token: str
    token_everywhere: bool  # every route needs the token (a non-loopback bind)
    max_body_bytes: int
    bound_host: str = "127.0.0.1"  # the address the server listens on
    allow_origins: frozenset[str] = frozenset()  # origins besides the server's own; "*" any
    allow_hosts: frozenset[str] = frozenset()  # Host names besides loopback; "*" any

    def host_allowed(self, host: str) -> bool:
        """True if a request's Host header (``name[:port]``) may be served."""
        if "*" in self.allow_hosts:
            return True
        name = _host_name(host)
        if name in _LOCAL_NAMES or name in self.allow_hosts or name == self.bound_host.lower():
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False  # a name: only the ones listed (a rebinding attacker controls DNS)
        # An address is never an attacker's name; off loopback, any address of a wildcard bind.
        return address.is_loopback or self.bound_host in ("0.0.0.0", "::", "")

    def origin_allowed(self, origin: str, host: str) -> bool:
        """True if a request with this ``Origin`` header may be served (same-origin or listed)."""
        if "*" in self.allow_origins or origin in self.allow_origins:
            return True
        return urlsplit(origin.lower()).netloc == host.lower()


def _host_name(host: str) -> str:
    """The name in a Host header, without the port or an IPv6 address's brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class BaseHandler(tornado.web.RequestHandler):
    """JSON errors ``{"error": class name, "detail": message}`` with their status; the guards."""

    token_methods: frozenset[str] = frozenset()
    """HTTP methods of the route that need the token even on loopback."""

    def initialize(self, state: ServerState) -> None:
        """Called by tornado with the route's arguments."""
        self.state = state
        self._gone = False

    def prepare(self) -> None:
        """Refuse, before any route runs, what the guards refuse."""
        error = self.refusal()
        if error is not None:
            self.fail(error)

    def refusal(self) -> LabServeError | None:
        """The error the Host, Origin and token guards answer this request with, if any."""
        host = self.request.headers.get("Host", "")
        if host and not self.state.host_allowed(host):
            return HostError(host)
        origin = self.request.headers.get("Origin")
        if origin is not None:
            if not self.state.origin_allowed(origin, host):
                return OriginError(origin)
            if origin in self.state.allow_origins or "*" in self.state.allow_origins:
                self.set_header("Access-Control-Allow-Origin", origin)
                self.set_header("Vary", "Origin")
        method = self.request.method or ""
        if method in self.token_methods or (self.state.token_everywhere and method != "OPTIONS"):
            return self.token_refusal()
        return None

    def token_refusal(self) -> UnauthorizedError | None:
        """UnauthorizedError unless the request carries the server's token."""
        sent = self.request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        sent = sent or self.get_query_argument("token", "")
        if not hmac.compare_digest(sent.encode(), self.state.token.encode()):
            return UnauthorizedError()
        return None

    def options(self, *args: str) -> None:
        """A CORS preflight from an allowed origin (the guards refused the others)."""
        self.set_header("Access-Control-Allow-Methods", "GET, POST, PATCH, OPTIONS")
        self.set_header(
            "Access-Control-Allow-Headers",
            "Authorization, Content-Type, Inference-Header-Content-Length",
        )
        self.set_status(204)
        self.finish()

    def content_type_refusal(
        self, accepted: Collection[str | None]
    ) -> UnsupportedMediaTypeError | None:
        """UnsupportedMediaTypeError unless the body's media type is in ``accepted``."""
        sent = self.request.headers.get("Content-Type")
        media = sent.split(";")[0].strip().lower() if sent is not None else None
        if media in accepted:
            return None
        return UnsupportedMediaTypeError(sent, [a for a in accepted if a is not None])

    def fail(self, error: LabServeError) -> NoReturn:
        """Answer with ``error`` (its status, its class name, its message) and stop."""
        level = logging.WARNING if isinstance(error, ServerError) else logging.INFO
        log.log(
            level, "%s %s -> %d %s", self.request.method, self.logged_uri(), error.status, error
        )
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

    def logged_uri(self) -> str:
        """The request's URI as logs may show it: its path, never its query (a token)."""
        # Not a redaction of "token=": a query may spell it "tok%65n=" and still count.
        return self.request.path + ("?..." if self.request.query else "")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """The JSON body of an error tornado raised itself."""
        # A method the route does not answer, or a bug in labserve (logged by log_exception).
        error: LabServeError
        if status_code == 405:
            error = MethodNotAllowedError(self.request.method or "", self.request.path)
        else:
            error = ServerError(self._reason)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(self.error_body(error)))

    def log_exception(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Log what tornado caught: a client's error in one line, a bug with its traceback."""
        # tornado's own version logs the URI (a token in it) and a traceback for 4xx too.
        if isinstance(value, tornado.web.HTTPError) and value.status_code < 500:
            log.info("%s %s -> %d", self.request.method, self.logged_uri(), value.status_code)
        else:
            log.error(
                "%s %s failed inside labserve",
                self.request.method,
                self.logged_uri(),
                exc_info=(typ, value, tb) if typ is not None and value is not None else None,
            )

    def reply_json(self, data: Any) -> None:
        """Answer 200 with ``data`` as JSON."""
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def runners(self) -> Mapping[str, Runner]:
        """The served runners by name."""
        return self.state.runners

    def on_connection_close(self) -> None:
        """The client went away: withdraw its call (the runner counts it ``cancelled``).

        tornado's own hook ends a body still arriving (its handler task waits on it): without
        it, a client that vanished mid-body kept its task until ``body_timeout_s``.
        """
        super().on_connection_close()
        self._gone = True
        self._give_up()

    def _give_up(self) -> None:
        """Cancel the model call in progress, if any, and withdraw its request."""
        call = getattr(self, "_call", None)
        if call is not None and call.cancel():
            withdraw = getattr(self, "_withdraw", None)
            if withdraw is not None:
                withdraw()

    async def call_model(self, method: RunnerMethod, *args: Any) -> Any:
        """``method.async_run(*args)``, withdrawn if the client disconnects; typed errors.

        A plain method's own exception becomes ModelError (its message kept), as a
        batchable method's does. A caller that has gone gets no answer.
        """
        try:
            _check_arity(method, args)
        except InputError as exc:
            self.fail(exc)
        self._call: asyncio.Future[Any]
        if method.batchable and method.runner.bg.in_loop_thread():
            # Straight into the batch queue: the handler awaits the request's own future,
            # with no task of its own in between (one less per request).
            try:
                request, self._call = method.submit_on_loop(args)
            except LabServeError as exc:
                self.fail(exc)
            self._withdraw = functools.partial(method.withdraw_on_loop, request)
        else:  # a plain method, or a runner on another loop than the server's
            self._call = asyncio.ensure_future(method.async_run(*args))
        try:
            return await self._call
        except LabServeError as exc:
            self.fail(exc)
        except asyncio.CancelledError:
            if not self._gone:
                self._give_up()
                raise  # the handler itself is being cancelled (the server stops)
            log.info("%s %s: the client went away", self.request.method, self.logged_uri())
            raise tornado.web.Finish() from None
        except Exception as exc:
            if method.batchable:
                raise  # the runner types every model failure: anything else is a bug
            self.fail(ModelError(f"{method.runner.name}.{method.name}", exc, 1))


class BodyHandler(BaseHandler):
    """Reads the body in chunks (with ``@stream_request_body``) and refuses it after reading.

    A refusal (guards, Content-Type, size) is answered once the body has arrived, reading
    and dropping up to ``DISCARD_BYTES`` past the limit: a client that sends its whole body
    before reading the reply then reads the JSON error instead of a connection reset.
    """

    content_types: tuple[str | None, ...] = ("application/json",)
    """The media types the route documents (None: a request without a Content-Type)."""

    def prepare(self) -> None:
        """Decide the refusal, if any, before reading; refuse at once a body too big to read."""
        limit = self.state.max_body_bytes
        self._chunks: list[bytes] = []
        self._size = 0
        self._refused: LabServeError | None = self.refusal()
        if self.request.method not in _BODY_METHODS:
            if self._refused is not None:
                self.fail(self._refused)
            return  # a route without a body, or tornado's 405
        self._refused = self._refused or self.content_type_refusal(self.content_types)
        length = _content_length(self.request.headers.get("Content-Length"))
        if length is not None and length > limit:
            self._refused = self._refused or PayloadTooLargeError(limit, length)
            if length > limit + DISCARD_BYTES:
                self.fail(self._refused)
        self.request.connection.set_max_body_size(limit + DISCARD_BYTES)  # type: ignore[union-attr]

    def data_received(self, chunk: bytes) -> None:
        """Keep one chunk of the body, or drop it once the request is refused."""
        # Never raise here: tornado would log a traceback and reset the connection.
        self._size += len(chunk)
        if self._refused is None and self._size > self.state.max_body_bytes:
            self._refused = PayloadTooLargeError(self.state.max_body_bytes)
        if self._refused is None:
            self._chunks.append(chunk)
        elif self._chunks:
            self._chunks = []

    def body(self) -> bytes:
        """The whole body received; fails with the request's refusal if it has one."""
        if self._refused is not None:
            self.fail(self._refused)
        return b"".join(self._chunks)


# Per method, per number of inputs: why the model cannot take them (None: it can).
_arity: weakref.WeakKeyDictionary[RunnerMethod, dict[int, str | None]] = weakref.WeakKeyDictionary()


def _check_arity(method: RunnerMethod, args: tuple[Any, ...]) -> None:
    """InputError if the model cannot take ``args`` (a wrong number of inputs)."""
    known = _arity.setdefault(method, {})
    if len(args) not in known:
        try:
            inspect.signature(method.model_fn).bind(*args)
            known[len(args)] = None
        except TypeError as exc:
            known[len(args)] = str(exc)
        except ValueError:
            known[len(args)] = None  # a callable without a signature: let the call decide
    why = known[len(args)]
    if why is not None:
        raise InputError(
            f"{method.runner.name}.{method.name} cannot take {len(args)} input"
            f"{'s' if len(args) != 1 else ''}: {why}"
        )


def _content_length(value: str | None) -> int | None:
    if value is None or not value.isascii() or not value.isdigit():
        return None
    return int(value)
