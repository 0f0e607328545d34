"""One HTTP request and its reply, whatever the framework: guards, body, model call, errors.

An adapter (tornado's handler, the Ray replica's Starlette app) builds a :class:`Head` from
the request line and headers and asks the core for an :class:`Exchange`. The exchange has
decided, before any body is read, whether the request is refused: in order, its Host
(DNS rebinding), its Origin (pages of other sites), the token (on a non-loopback bind, or
where a route asks for it), the route and method, then for a body its Content-Type and
declared size. The adapter then feeds it the body's chunks (:meth:`Exchange.feed`) and
sends what :meth:`Exchange.respond` returns: a :class:`Reply`, whose ``stream`` (if any)
it sends chunk by chunk as they come. Loop-only: one exchange lives on the loop of its
server.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs

from labserve.base.errors import (
    HostError,
    InputError,
    LabServeError,
    MethodNotAllowedError,
    ModelError,
    NotFoundError,
    OriginError,
    PayloadTooLargeError,
    ServerError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)
from labserve.generation.api import Generator
from labserve.runtime.runner import Runner, RunnerMethod
from labserve.runtime.served import ServedMethod
from labserve.server.state import ServerState
from labserve.wire.codec import JSON

__all__ = [
    "DISCARD_BYTES",
    "OPENAI_TAILS",
    "PARAM",
    "Backend",
    "ClientGoneError",
    "ErrorStyle",
    "Exchange",
    "Handler",
    "Head",
    "Reply",
    "Route",
    "Verb",
    "allowed",
    "error_reply",
    "error_style",
    "generator_names",
    "json_reply",
    "log",
    "model_names",
    "typed_call",
]

T = TypeVar("T")

log = logging.getLogger("labserve.server")
"""Client errors (one line each, at INFO) and the server's own failures go here."""

DISCARD_BYTES = 64 * 1024 * 1024
"""How much of a refused body is read and dropped, so that clients which send the whole
body before reading (urllib, http.client) see the JSON error instead of a reset."""

_PREFLIGHT = {
    "Access-Control-Allow-Methods": "GET, POST, PATCH, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Inference-Header-Content-Length",
}


@dataclass(frozen=True)
class Head:
    """A request's line and headers: all that the guards read. Immutable.

    ``headers`` is the framework's own case-insensitive mapping (tornado's HTTPHeaders,
    Starlette's Headers), not a copy.
    """

    method: str
    path: str
    """The decoded path, without the query."""
    headers: Mapping[str, str]
    query: str = ""
    """The raw query string (read only for a token)."""

    def query_value(self, name: str) -> str:
        """The first value of query argument ``name``, or ``""``."""
        return parse_qs(self.query).get(name, [""])[0] if self.query else ""


@dataclass(frozen=True)
class Reply:
    """What to send back: a status, headers, a body, and maybe a stream of more. Immutable.

    ``stream`` (server-sent events, for instance) is sent after ``body``, chunk by chunk as
    the handler yields them; an adapter whose client went away stops reading it and calls
    its ``aclose()``, so the handler's ``finally`` frees what it holds.
    """

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    stream: AsyncIterator[bytes] | None = None


def json_reply(data: Any, status: int = 200) -> Reply:
    """``data`` as a JSON reply."""
    return Reply(status, json.dumps(data).encode(), {"Content-Type": JSON})


ErrorStyle = Literal["labserve", "v2", "openai"]
"""How a route family writes its errors (the clients that read them differ)."""


def error_reply(error: LabServeError, *, style: ErrorStyle = "labserve") -> Reply:
    """The reply for ``error``: its status, and its kind and message in the route's style.

    labserve's routes: ``{"error": kind, "detail": message}``. v2 clients (tritonclient)
    show only ``"error"``: on v2 routes the message is there too. The OpenAI-compatible
    routes use OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``), which
    the ``openai`` client reads. An error with ``retry_after_s`` gets a ``Retry-After``
    header (whole seconds, >= 1).
    """
    body: dict[str, Any]
    if style == "openai":
        body = {"error": _openai_error(error)}
    else:
        kind = f"{error.kind}: {error}" if style == "v2" else error.kind
        body = {"error": kind, "detail": str(error)}
    headers = {"Content-Type": JSON}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(error.retry_after_s)))
    return Reply(error.status, json.dumps(body).encode(), headers)


def _openai_error(error: LabServeError) -> dict[str, Any]:
    kinds = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
    default = "server_error" if error.status >= 500 else "invalid_request_error"
    return {
        "message": str(error),
        "type": kinds.get(error.status, default),
        # The parameter at fault, where one is (the message names it too).
        "param": error.param if isinstance(error, InputError) else None,
        "code": error.kind,
    }


OPENAI_TAILS = ("/completions", "/chat/completions", "/models")
"""The OpenAI-compatible routes' paths below ``/v1``."""


def allowed(route: Route) -> str:
    """The ``Allow`` header of a 405 on ``route``: its methods, and OPTIONS (CORS preflight)."""
    return ", ".join([*route.verbs, "OPTIONS"])


def error_style(path: str) -> ErrorStyle:
    """The error style of the routes under ``path``."""
    if path == "/v2" or path.startswith("/v2/"):
        return "v2"
    if path == "/v1" or path.startswith("/v1/"):
        return "openai"
    return "labserve"


def generator_names(runners: Mapping[str, Runner]) -> dict[str, Generator]:
    """The OpenAI model name of each runner's generative method, by name.

    The runner's name when it has one generative method, ``runner.method`` when several.
    """
    served: dict[str, Generator] = {}
    for name, runner in runners.items():
        gens = runner.generators
        for method, model in model_names(name, tuple(gens)).items():
            served[model] = gens[method]
    return served


def model_names(runner: str, methods: Sequence[str]) -> dict[str, str]:
    """The OpenAI model name of each of ``runner``'s generative ``methods``, by method.

    The runner's name when it has one generative method, ``runner.method`` when several.
    """
    return {m: runner if len(methods) == 1 else f"{runner}.{m}" for m in methods}


class Backend:
    """What differs between servers: where ``/stats``, ``/metrics`` and live config go.

    This base reads and changes the served runners in-process (the tornado server); the Ray
    replica's subclass asks the application's stats board, which reaches every replica.
    Loop-only.
    """

    def __init__(
        self, state: ServerState, generators: Mapping[str, Generator] | None = None
    ) -> None:
        self.state = state
        self._generators: Mapping[str, Generator] = dict(generators or {})

    def generators(self) -> Mapping[str, Generator]:
        """The generative models the OpenAI-compatible routes serve, by model name.

        A runner's generative method is the model named after the runner (``runner.method``
        when the runner has several), beside those given explicitly.
        """
        return {**self._generators, **generator_names(self.state.runners)}

    async def stats(self) -> dict[str, Any]:
        """``/stats``: every method's snapshot as a dict, by runner and method."""
        return {
            name: {
                **{s.method: s.as_dict() for s in runner.snapshots()},
                **{s.method: s.as_dict() for s in runner.generation_snapshots()},
            }
            for name, runner in self.state.runners.items()
        }

    async def snapshots(self) -> list[Any]:
        """The snapshots ``/metrics`` shows."""
        return [s for runner in self.state.runners.values() for s in runner.snapshots()]

    async def generation_snapshots(self) -> list[Any]:
        """The generative methods' snapshots ``/metrics`` shows."""
        return [s for runner in self.state.runners.values() for s in runner.generation_snapshots()]

    async def configure(self, changes: list[tuple[ServedMethod, dict[str, Any]]]) -> dict[str, Any]:
        """Apply validated ``changes`` (each method's settings); return ``GET /config``'s body."""
        for method, settings in changes:
            method.configure(**settings)
        return configs(self.state)


def configs(state: ServerState) -> dict[str, Any]:
    """``GET /config``: every batchable and generative method's config, by runner and method."""
    return {
        name: {m.name: m.config.as_dict() for m in runner.configurable().values()}
        for name, runner in state.runners.items()
    }


Handler = Callable[["Exchange"], Awaitable[Reply]]
"""A route's code: reads the exchange (its parameters, body, server), returns the reply."""

PARAM = re.compile(r"\{(\w+)\}")
"""A parameter in a route's path template: ``{name}`` matches one path segment."""


@dataclass(frozen=True)
class Verb:
    """What one HTTP method of a route does. Immutable."""

    handler: Handler
    summary: str
    """One line for the OpenAPI document and ``GET /``."""
    body: tuple[str | None, ...] | None = None
    """The media types its body may have (None in the tuple: no Content-Type); None: no body."""
    token: bool = False
    """Needs the server's token even on loopback."""
    openapi: Mapping[str, Any] = field(default_factory=dict)
    """More of its OpenAPI operation (request body schema, responses)."""


@dataclass(frozen=True)
class Route:
    """A path template (``/runners/{runner}/{method}``) and what each HTTP method does there."""

    template: str
    verbs: Mapping[str, Verb]

    @property
    def params(self) -> tuple[str, ...]:
        """The template's parameter names, in order."""
        return tuple(PARAM.findall(self.template))


class ClientGoneError(Exception):
    """Raised inside a handler whose client went away: there is nobody to answer."""


class Exchange:
    """One request: refused or not from its head, then its body, then its reply. Loop-only.

    Built by :meth:`labserve.server.core.HttpCore.begin`. ``refusal`` is the error the
    request gets whatever its body; ``reads_body`` says whether the adapter should read a
    body; ``answer_now`` says it should answer without reading any (a declared body too big
    to drain).
    """

    def __init__(
        self,
        head: Head,
        state: ServerState,
        backend: Backend,
        found: tuple[Route, dict[str, str]] | None,
    ) -> None:
        self.head = head
        self.state = state
        self.backend = backend
        self.route: Route | None = found[0] if found else None
        self.params: dict[str, str] = found[1] if found else {}
        self.style = error_style(head.path)
        self.gone = False
        self._chunks: list[bytes] = []
        self._size = 0
        self._call: asyncio.Future[Any] | None = None
        self._withdraw: Callable[[], object] | None = None
        verb = self.route.verbs.get(head.method) if self.route else None
        self.verb: Verb | None = verb
        self.reads_body = verb is not None and verb.body is not None
        self.refusal: LabServeError | None = self._guard() or self._body_refusal()
        length = _content_length(head.headers.get("Content-Length"))
        # Whatever refused it: a body too big to read and drop is answered before it comes.
        self.answer_now = length is not None and length > self.read_limit

    # -- before the body ----------------------------------------------------------------

    def _guard(self) -> LabServeError | None:
        """The Host, Origin, token, route and method refusal, if any."""
        headers = self.head.headers
        host = headers.get("Host") or ""
        if host and not self.state.host_allowed(host):
            return HostError(host)
        origin = headers.get("Origin")
        if origin is not None and not self.state.origin_allowed(origin, host):
            return OriginError(origin)
        method = self.head.method
        token = self.verb is not None and self.verb.token
        if token or (self.state.token_everywhere and method != "OPTIONS"):
            refused = self._token_refusal()
            if refused is not None:
                return refused
        if self.route is None:
            return self._no_route()
        if self.verb is None and method != "OPTIONS":
            return MethodNotAllowedError(method, self.head.path)
        return None

    def _no_route(self) -> NotFoundError:
        """No route here; an OpenAI route's path without ``/v1`` is told to add it.

        An ``openai`` client whose base URL lacks ``/v1`` sends ``/chat/completions``: it
        shows the error body's message only in OpenAI's shape.
        """
        path = self.head.path
        if self.style != "labserve" or not path.rstrip("/").endswith(OPENAI_TAILS):
            return NotFoundError("route", path)
        self.style = "openai"
        base = f"http://{self.head.headers.get('Host') or 'host:port'}/v1"
        return NotFoundError("route", path, within=f"add /v1 to the base URL ({base}): this server")

    def _token_refusal(self) -> UnauthorizedError | None:
        sent = self.head.headers.get("Authorization") or ""
        sent = sent.removeprefix("Bearer ").strip() or self.head.query_value("token")
        if not hmac.compare_digest(sent.encode(), self.state.token.encode()):
            return UnauthorizedError()
        return None

    def _body_refusal(self) -> LabServeError | None:
        """The Content-Type or declared-size refusal of a route with a body, if any."""
        if self.verb is None or self.verb.body is None:
            return None
        accepted = self.verb.body
        sent = self.head.headers.get("Content-Type")
        media = sent.split(";")[0].strip().lower() if sent is not None else None
        if media not in accepted:
            return UnsupportedMediaTypeError(sent, [a for a in accepted if a is not None])
        length = _content_length(self.head.headers.get("Content-Length"))
        limit = self.state.max_body_bytes
        if length is not None and length > limit:
            return PayloadTooLargeError(limit, length)
        return None

    @property
    def read_limit(self) -> int:
        """The most body bytes the adapter should take in (a refused body is read and dropped)."""
        return self.state.max_body_bytes + DISCARD_BYTES

    # -- the body ----------------------------------------------------------------------

    def feed(self, chunk: bytes) -> bool:
        """Take one chunk of the body; False once the adapter should stop reading."""
        self._size += len(chunk)
        if self.refusal is None and self._size > self.state.max_body_bytes:
            self.refusal = PayloadTooLargeError(self.state.max_body_bytes)
        if self.refusal is None:
            self._chunks.append(chunk)
        elif self._chunks:
            self._chunks = []
        return self._size <= self.read_limit

    @property
    def body(self) -> bytes:
        """The whole body received."""
        return b"".join(self._chunks)

    # -- the reply ---------------------------------------------------------------------

    async def respond(self) -> Reply | None:
        """The reply to send, every failure typed; None when the client has gone."""
        try:
            if self.refusal is not None:
                raise self.refusal
            if self.verb is None:  # OPTIONS on a route: a CORS preflight
                reply = Reply(204, headers=_PREFLIGHT)
            else:
                reply = await self.verb.handler(self)
        except ClientGoneError:
            log.info("%s %s: the client went away", self.head.method, self.logged_uri())
            return None
        except LabServeError as error:
            reply = self.error(error)
        except Exception:
            log.error(
                "%s %s failed inside labserve", self.head.method, self.logged_uri(), exc_info=True
            )
            reply = self.error(ServerError("a bug in labserve (logged to labserve.server)"))
        return self._with_cors(reply)

    def error(self, error: LabServeError) -> Reply:
        """Log ``error`` in one line and return its reply."""
        level = logging.WARNING if isinstance(error, ServerError) else logging.INFO
        log.log(level, "%s %s -> %d %s", self.head.method, self.logged_uri(), error.status, error)
        reply = error_reply(error, style=self.style)
        if isinstance(error, MethodNotAllowedError) and self.route is not None:
            reply = Reply(reply.status, reply.body, {**reply.headers, "Allow": allowed(self.route)})
        return reply

    def _with_cors(self, reply: Reply) -> Reply:
        origin = self.head.headers.get("Origin")
        if origin is None or not self.state.origin_listed(origin):
            return reply
        headers = {**reply.headers, "Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        return Reply(reply.status, reply.body, headers, reply.stream)

    def logged_uri(self) -> str:
        """The request's URI as logs may show it: its path, never its query (a token)."""
        # Not a redaction of "token=": a query may spell it "tok%65n=" and still count.
        return self.head.path + ("?..." if self.head.query else "")

    # -- the model call ----------------------------------------------------------------

    def cancel(self) -> None:
        """The client went away: withdraw its model call (the runner counts it ``cancelled``)."""
        self.gone = True
        self._give_up()

    def _give_up(self) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._withdraw is not None:
            self._withdraw()  # a no-op once the request has its outcome

    async def call(self, method: RunnerMethod, *args: Any) -> Any:
        """``method.async_run(*args)``, withdrawn if the client goes away; every error typed.

        A plain method's own exception becomes ModelError (its message kept), as a
        batchable method's does. Raises ClientGoneError once the client has gone.
        """
        if method.batchable and method.runner.bg.in_loop_thread():
            # Straight into the batch queue: the handler awaits the request's own future,
            # with no task of its own in between (one less per request).
            request, self._call = method.submit_on_loop(args)
            self._withdraw = functools.partial(method.withdraw_on_loop, request)
            return await self._await_call(self._call)
        # A plain method, or a runner on another loop than the server's.
        return await self.until_gone(typed_call(method, *args))

    async def until_gone(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` as a task that is cancelled if the client goes away.

        What ``work`` holds (a generation, say) is freed by its own cancellation: its
        ``finally`` runs as soon as the client is gone, not when ``work`` would have ended.
        Raises ClientGoneError once the client has gone (``work`` is not started if it had).
        """
        if self.gone:
            work.close()
            raise ClientGoneError()
        self._call = task = asyncio.ensure_future(work)
        return await self._await_call(task)

    async def _await_call(self, call: asyncio.Future[T]) -> T:
        try:
            return await call
        except asyncio.CancelledError:
            if not self.gone:
                self._give_up()
                raise  # the handler itself is being cancelled (the server stops)
            raise ClientGoneError() from None


async def typed_call(method: RunnerMethod, *args: Any) -> Any:
    """``await method.async_run(*args)``, a plain method's own exception as ModelError.

    A batchable method's failures are typed by the runner already; anything else from
    one is a bug, and propagates as it is.
    """
    try:
        return await method.async_run(*args)
    except LabServeError:
        raise
    except Exception as exc:
        if method.batchable:
            raise
        raise ModelError(f"{method.runner.name}.{method.name}", exc, 1) from exc


def _content_length(value: str | None) -> int | None:
    if value is None or not value.isascii() or not value.isdigit():
        return None
    return int(value)
