"""The routes: inference, health, stats, Prometheus metrics and live config. Loop-only."""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from typing import Any, NoReturn

import tornado.web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from labserve.base.errors import ConfigError, InputError, LabServeError
from labserve.metrics.prometheus import SnapshotCollector
from labserve.runtime.runner import Runner, RunnerMethod
from labserve.wire.codec import decode, encode

__all__ = ["make_app"]


class _Base(tornado.web.RequestHandler):
    """JSON errors ``{"error", "detail"}`` with the right status; token checks."""

    def initialize(self, state: Mapping[str, Any]) -> None:
        self.state = state

    def prepare(self) -> None:
        if self.state["token_everywhere"]:
            self.require_token()

    def require_token(self) -> None:
        sent = self.request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        sent = sent or self.get_query_argument("token", "")
        if not hmac.compare_digest(sent.encode(), self.state["token"].encode()):
            self.fail(401, "unauthorized", "a valid token is required (Authorization: Bearer ...)")

    def fail(
        self, status: int, error: str, detail: str, retry_after_s: float | None = None
    ) -> NoReturn:
        self.set_status(status)
        if retry_after_s is not None:
            self.set_header("Retry-After", str(max(1, round(retry_after_s))))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": error, "detail": detail}))
        raise tornado.web.Finish()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": self._reason, "detail": self._reason}))

    def reply_json(self, data: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def runners(self) -> dict[str, Runner]:
        runners: dict[str, Runner] = self.state["runners"]
        return runners


class _BodyMixin(_Base):
    """Reads the body in chunks, refusing with 413 past the limit (before reading it all)."""

    def prepare(self) -> None:
        super().prepare()
        limit = self.state["max_body_bytes"]
        self._chunks: list[bytes] = []
        self._size = 0
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            self.fail(
                413, "body_too_large", f"body of {length} bytes is over the {limit}-byte limit"
            )
        self.request.connection.set_max_body_size(limit + 1)  # type: ignore[union-attr]

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self.state["max_body_bytes"]:
            limit = self.state["max_body_bytes"]
            self.fail(413, "body_too_large", f"body is over the {limit}-byte limit")
        self._chunks.append(chunk)


@tornado.web.stream_request_body
class _Infer(_BodyMixin):
    """``POST /runners/{name}/{method}``: one request, JSON or ``.npy``."""

    async def post(self, runner_name: str, method_name: str) -> None:
        method = self._method(runner_name, method_name)
        try:
            arg, kind = decode(b"".join(self._chunks), self.request.headers.get("Content-Type", ""))
            result = await method.async_run(arg)
        except LabServeError as exc:
            self.fail(exc.status, exc.kind, str(exc), getattr(exc, "retry_after_s", None))
        body, content_type = encode(result, kind)
        self.set_header("Content-Type", content_type)
        self.finish(body)

    def _method(self, runner_name: str, method_name: str) -> RunnerMethod:
        runner = self.runners().get(runner_name)
        if runner is None:
            known = ", ".join(self.runners()) or "none"
            self.fail(404, "not_found", f"no runner {runner_name!r} (served: {known})")
        method = runner.methods.get(method_name)
        if method is None:
            known = ", ".join(runner.methods)
            self.fail(
                404, "not_found", f"runner {runner_name!r} has no method {method_name!r} ({known})"
            )
        return method


class _Health(_Base):
    def get(self) -> None:
        self.reply_json({"status": "ok"})


class _Stats(_Base):
    def get(self) -> None:
        self.reply_json(
            {
                name: {s.method: s.as_dict() for s in runner.snapshots()}
                for name, runner in self.runners().items()
            }
        )


class _Metrics(_Base):
    def get(self) -> None:
        registry = CollectorRegistry()
        registry.register(
            SnapshotCollector(
                lambda: [s for runner in self.runners().values() for s in runner.snapshots()]
            )
        )
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(registry))


class _Config(_Base):
    def get(self) -> None:
        self.reply_json(_configs(self.runners()))

    def patch(self) -> None:
        self.require_token()
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as exc:
            self.fail(400, InputError.__name__, f"body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            self.fail(400, InputError.__name__, "body must be a JSON object")
        runner_name = body.pop("runner", None)
        method_name = body.pop("method", None)
        runner = self.runners().get(str(runner_name))
        if runner is None or method_name not in runner.methods:
            self.fail(404, "not_found", f"no batchable method {runner_name!r}.{method_name!r}")
        try:
            runner.configure(str(method_name), **body)
        except ConfigError as exc:
            self.fail(422, exc.kind, str(exc))
        except TypeError as exc:
            self.fail(422, ConfigError.__name__, str(exc))
        self.reply_json(_configs(self.runners()))


def _configs(runners: Mapping[str, Runner]) -> dict[str, Any]:
    return {
        name: {m.name: m.config.as_dict() for m in runner.methods.values() if m.batchable}
        for name, runner in runners.items()
    }


def make_app(state: Mapping[str, Any]) -> tornado.web.Application:
    """The tornado application over ``state`` (runners, token, limits). Build on the loop."""
    args = {"state": state}
    from labserve.server import v2

    return tornado.web.Application(
        log_function=_quiet,
        handlers=[
            *v2.routes(args),
            (r"/runners/([^/]+)/([^/]+)", _Infer, args),
            (r"/healthz", _Health, args),
            (r"/stats", _Stats, args),
            (r"/metrics", _Metrics, args),
            (r"/config", _Config, args),
        ],
        default_handler_class=_NotFound,
        default_handler_args=args,
    )


def _quiet(handler: tornado.web.RequestHandler) -> None:
    """No access log: in a notebook it would print a line per request into the cell."""


class _NotFound(_Base):
    def prepare(self) -> None:
        super().prepare()
        self.fail(404, "not_found", f"no route {self.request.path!r}")
