"""labserve's HTTP routes behind Ray Serve's proxy (ASGI), on the kernel server's pieces.

The same bodies (``labserve.wire``: JSON, ``.npy``, Open Inference Protocol v2 with binary
tensors), the same guards (``ServerState``: Host, Origin, token) and the same error
replies (each error's own status, ``{"error": kind, "detail": message}``) as the tornado
server; only the request and response objects are Starlette's. Runs on the replica's
event loop; every function here is loop-only.
"""

from __future__ import annotations

import hmac
import inspect
import json
import logging
import re
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from labserve._version import __version__
from labserve.base.errors import (
    ConfigError,
    HostError,
    InputError,
    LabServeError,
    MethodNotAllowedError,
    ModelError,
    NotFoundError,
    OriginError,
    PayloadTooLargeError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)
from labserve.metrics.prometheus import SnapshotCollector
from labserve.metrics.snapshot import Snapshot
from labserve.runtime.runner import Runner, RunnerMethod
from labserve.server.handlers import ServerState
from labserve.server.v2 import models
from labserve.wire.codec import JSON, NPY, decode, encode
from labserve.wire.inference import BINARY, HEADER_LENGTH, decode_request, encode_reply, outputs

__all__ = ["Routes"]

log = logging.getLogger("labserve.ray")

_SIMPLE = re.compile(r"^/runners/([^/]+)/([^/]+)$")
_V2_MODEL = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?$")


class _Refused(Exception):
    """Carries an error reply out of a route (the tornado handlers' ``fail``)."""

    def __init__(self, error: LabServeError, v2: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.v2 = v2


def error_response(error: LabServeError, *, v2: bool = False) -> Response:
    """The reply for ``error``: its status, its kind and message (v2 clients read "error")."""
    body = {"error": f"{error.kind}: {error}" if v2 else error.kind, "detail": str(error)}
    headers = {}
    retry_after_s = getattr(error, "retry_after_s", None)
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(retry_after_s)))
    return Response(json.dumps(body), error.status, headers, media_type=JSON)


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status, media_type=JSON)


class Routes:
    """The routes of one replica: its runner, its guards, and where stats and config go.

    ``stats`` gives ``/stats``'s JSON and ``merged`` the snapshots ``/metrics`` shows
    (both from the application's stats board); ``configure`` applies a live change to
    every replica (through Ray Serve's ``user_config``) and returns the configs.
    """

    def __init__(
        self,
        runner: Runner,
        state: ServerState,
        *,
        stats: Callable[[], Awaitable[dict[str, Any]]],
        merged: Callable[[], Awaitable[list[Snapshot]]],
        configure: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]],
    ) -> None:
        self.runner = runner
        self.state = state
        self._stats = stats
        self._merged = merged
        self._configure = configure

    async def __call__(self, request: Request) -> Response:
        """Answer one HTTP request; every refusal is a typed JSON error."""
        path = request.url.path.rstrip("/") or "/"
        v2 = path.startswith("/v2")
        try:
            self._guard(request, token=request.method == "PATCH")
            response = await self._route(request, path)
        except _Refused as refused:
            error = refused.error
            level = logging.WARNING if error.status >= 500 else logging.INFO
            log.log(level, "%s %s -> %d %s", request.method, path, error.status, error)
            return error_response(error, v2=v2 or refused.v2)
        except LabServeError as error:
            return error_response(error, v2=v2)
        origin = request.headers.get("origin")
        if origin is not None and (
            origin in self.state.allow_origins or "*" in self.state.allow_origins
        ):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"
        return response

    def _guard(self, request: Request, *, token: bool) -> None:
        host = request.headers.get("host", "")
        if host and not self.state.host_allowed(host):
            raise _Refused(HostError(host))
        origin = request.headers.get("origin")
        if origin is not None and not self.state.origin_allowed(origin, host):
            raise _Refused(OriginError(origin))
        if token or (self.state.token_everywhere and request.method != "OPTIONS"):
            sent = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            sent = sent or request.query_params.get("token", "")
            if not hmac.compare_digest(sent.encode(), self.state.token.encode()):
                raise _Refused(UnauthorizedError())

    async def _body(self, request: Request, accepted: tuple[str | None, ...]) -> bytes:
        sent = request.headers.get("content-type")
        media = sent.split(";")[0].strip().lower() if sent is not None else None
        if media not in accepted:
            raise _Refused(UnsupportedMediaTypeError(sent, [a for a in accepted if a]))
        limit = self.state.max_body_bytes
        length = request.headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > limit:
            raise _Refused(PayloadTooLargeError(limit, int(length)))
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _Refused(PayloadTooLargeError(limit))
            chunks.append(chunk)
        return b"".join(chunks)

    async def _route(self, request: Request, path: str) -> Response:
        verb = request.method
        if verb == "OPTIONS":
            return Response(status_code=204, headers=_preflight(request, self.state))
        simple = _SIMPLE.match(path)
        if simple:
            self._allow(verb, "POST", path)
            return await self._infer(request, *simple.groups())
        if path.startswith("/v2"):
            return await self._v2(request, path)
        if path == "/healthz":
            self._allow(verb, "GET", path)
            stuck = {
                f"{self.runner.name}.{s.method}": f"{s.stuck_batches} stuck batch(es)"
                for s in self.runner.snapshots()
                if not s.ready
            }
            return _json({"status": "degraded", "not_ready": stuck} if stuck else {"status": "ok"})
        if path == "/stats":
            self._allow(verb, "GET", path)
            return _json(await self._stats())
        if path == "/metrics":
            self._allow(verb, "GET", path)
            snaps = await self._merged()
            registry = CollectorRegistry()
            registry.register(SnapshotCollector(lambda: snaps))
            return Response(
                generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
            )
        if path == "/config":
            if verb == "GET":
                return _json(self.configs())
            self._allow(verb, "PATCH", path)
            return _json(await self._patch(await self._body(request, (JSON, None))))
        raise _Refused(NotFoundError("route", path))

    @staticmethod
    def _allow(verb: str, allowed: str, path: str) -> None:
        if verb != allowed:
            raise _Refused(MethodNotAllowedError(verb, path))

    def configs(self) -> dict[str, Any]:
        """``GET /config``: every batchable method's config in force on this replica."""
        return {
            self.runner.name: {
                m.name: m.config.as_dict() for m in self.runner.methods.values() if m.batchable
            }
        }

    async def _patch(self, raw: bytes) -> dict[str, Any]:
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, RecursionError) as exc:
            raise _Refused(InputError(f"body is not valid JSON: {exc!r}")) from None
        if not isinstance(body, dict):
            raise _Refused(InputError("body must be a JSON object"))
        runner_name = body.pop("runner", self.runner.name)
        method_name = body.pop("method", None)
        method = self.runner.methods.get(method_name) if isinstance(method_name, str) else None
        if runner_name != self.runner.name or method is None or not method.batchable:
            served = [
                f"{self.runner.name}.{m.name}" for m in self.runner.methods.values() if m.batchable
            ]
            raise _Refused(
                NotFoundError("batchable method", f"{runner_name}.{method_name}", served=served)
            )
        try:
            method.config.replace(**body)  # checked here first: a bad change reaches no replica
        except ConfigError as exc:
            raise _Refused(exc) from None
        except (TypeError, ValueError) as exc:
            raise _Refused(
                ConfigError("the request", sorted(body), f"settings it knows ({exc})")
            ) from None
        return await self._configure(method.name, body)

    async def _infer(self, request: Request, runner_name: str, method_name: str) -> Response:
        body = await self._body(request, (JSON, NPY))
        method = self._method(runner_name, method_name)
        arg, kind = decode(body, request.headers.get("content-type", ""))
        result = await call(method, arg)
        reply, content_type = encode(result, kind)
        return Response(reply, headers={"Content-Type": content_type})

    def _method(self, runner_name: str, method_name: str) -> RunnerMethod:
        if runner_name != self.runner.name:
            raise _Refused(NotFoundError("runner", runner_name, served=[self.runner.name]))
        method = self.runner.methods.get(method_name)
        if method is None:
            raise _Refused(
                NotFoundError(
                    "method",
                    method_name,
                    served=self.runner.methods,
                    within=f"runner {runner_name!r}",
                )
            )
        return method

    async def _v2(self, request: Request, path: str) -> Response:
        verb = request.method
        served = models({self.runner.name: self.runner})
        if path == "/v2":
            self._allow(verb, "GET", path)
            return _json(
                {"name": "labserve", "version": __version__, "extensions": ["binary_tensor_data"]}
            )
        if path in ("/v2/health/live", "/v2/health/ready"):
            self._allow(verb, "GET", path)
            if path.endswith("live"):
                return _json({"live": True})
            ready = all(m.stats().ready for m in served.values())
            return _json({"ready": ready}, 200 if ready else 503)
        match = _V2_MODEL.match(path)
        if match is None:
            raise _Refused(NotFoundError("route", path), v2=True)
        name, _version, action = match.groups()
        method = served.get(name)
        if method is None:
            raise _Refused(NotFoundError("model", name, served=served), v2=True)
        if action == "/infer":
            self._allow(verb, "POST", path)
            body = await self._body(request, (JSON, BINARY, None))  # tritonclient: no type
            infer = decode_request(body, request.headers.get(HEADER_LENGTH))
            result = await call(method, *infer.inputs)
            reply, header_length = encode_reply(name, infer, outputs(result))
            if header_length is None:
                return Response(reply, media_type=JSON)
            return Response(reply, media_type=BINARY, headers={HEADER_LENGTH: str(header_length)})
        self._allow(verb, "GET", path)
        if action == "/ready":
            ready = method.stats().ready
            return _json({"name": name, "ready": ready}, 200 if ready else 503)
        return _json(
            {"name": name, "versions": ["1"], "platform": "labserve", "inputs": [], "outputs": []}
        )


# Per method, per number of inputs: why the model cannot take them (None: it can).
_arity: weakref.WeakKeyDictionary[RunnerMethod, dict[int, str | None]] = weakref.WeakKeyDictionary()


def _arity_refusal(method: RunnerMethod, n: int) -> str | None:
    known = _arity.setdefault(method, {})
    if n not in known:
        try:
            inspect.signature(method.model_fn).bind(*range(n))
            known[n] = None
        except TypeError as exc:
            known[n] = str(exc)
        except ValueError:
            known[n] = None  # a callable without a signature: the call decides
    return known[n]


async def call(method: RunnerMethod, *args: Any) -> Any:
    """``method.async_run(*args)`` with every failure typed (a plain method's too)."""
    why = _arity_refusal(method, len(args))
    if why is not None:
        raise InputError(
            f"{method.runner.name}.{method.name} cannot take {len(args)} input(s): {why}"
        )
    try:
        return await method.async_run(*args)
    except LabServeError:
        raise
    except Exception as exc:
        if method.batchable:
            raise  # the runner types every model failure: anything else is a bug
        raise ModelError(f"{method.runner.name}.{method.name}", exc, 1) from exc


def _preflight(request: Request, state: ServerState) -> dict[str, str]:
    headers = {
        "Access-Control-Allow-Methods": "GET, POST, PATCH, OPTIONS",
        "Access-Control-Allow-Headers": (
            "Authorization, Content-Type, Inference-Header-Content-Length"
        ),
    }
    origin = request.headers.get("origin")
    if origin is not None and (origin in state.allow_origins or "*" in state.allow_origins):
        headers |= {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
    return headers
