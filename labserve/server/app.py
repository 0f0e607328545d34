"""The routes: inference, health, stats, Prometheus metrics and live config. Loop-only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import tornado.web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from labserve.base.errors import (
    ConfigError,
    InputError,
    LabServeError,
    NotFoundError,
)
from labserve.metrics.prometheus import SnapshotCollector
from labserve.runtime.runner import Runner, RunnerMethod
from labserve.server import v2
from labserve.server.handlers import BaseHandler, BodyHandler, ServerState
from labserve.wire.codec import JSON, NPY, decode, encode

__all__ = ["make_app"]


@tornado.web.stream_request_body
class _Infer(BodyHandler):
    """``POST /runners/{name}/{method}``: one request, JSON or ``.npy``."""

    content_types = (JSON, NPY)

    async def post(self, runner_name: str, method_name: str) -> None:
        body = self.body()
        method = self._method(runner_name, method_name)
        try:
            arg, kind = decode(body, self.request.headers.get("Content-Type", ""))
        except LabServeError as exc:
            self.fail(exc)
        result = await self.call_model(method, arg)
        try:
            reply, content_type = encode(result, kind)
        except LabServeError as exc:
            self.fail(exc)
        self.set_header("Content-Type", content_type)
        self.finish(reply)

    def _method(self, runner_name: str, method_name: str) -> RunnerMethod:
        runner = self.runners().get(runner_name)
        if runner is None:
            self.fail(NotFoundError("runner", runner_name, served=self.runners()))
        method = runner.methods.get(method_name)
        if method is None:
            self.fail(
                NotFoundError(
                    "method", method_name, served=runner.methods, within=f"runner {runner_name!r}"
                )
            )
        return method


class _Health(BaseHandler):
    def get(self) -> None:
        # Alive while it answers; "degraded" names the methods whose every batch slot is
        # held by a model call past its request timeout (they refuse requests meanwhile).
        stuck = {
            f"{name}.{s.method}": f"{s.stuck_batches} stuck batch(es), refusing requests"
            for name, runner in self.runners().items()
            for s in runner.snapshots()
            if not s.ready
        }
        self.reply_json({"status": "degraded", "not_ready": stuck} if stuck else {"status": "ok"})


class _Stats(BaseHandler):
    def get(self) -> None:
        self.reply_json(
            {
                name: {s.method: s.as_dict() for s in runner.snapshots()}
                for name, runner in self.runners().items()
            }
        )


class _Metrics(BaseHandler):
    def get(self) -> None:
        registry = CollectorRegistry()
        registry.register(
            SnapshotCollector(
                lambda: [s for runner in self.runners().values() for s in runner.snapshots()]
            )
        )
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(registry))


@tornado.web.stream_request_body
class _Config(BodyHandler):
    token_methods = frozenset({"PATCH"})

    def get(self) -> None:
        self.reply_json(_configs(self.runners()))

    def patch(self) -> None:
        raw = self.body()
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, RecursionError) as exc:
            self.fail(InputError(f"body is not valid JSON: {exc!r}"))
        if not isinstance(body, dict):
            self.fail(InputError("body must be a JSON object"))
        runner_name = body.pop("runner", None)
        method_name = body.pop("method", None)
        if not isinstance(runner_name, str) or not isinstance(method_name, str):
            self.fail(
                InputError(
                    '"runner" and "method" must be strings, got '
                    f"{type(runner_name).__name__} and {type(method_name).__name__}"
                )
            )
        runner = self.runners().get(runner_name)
        if runner is None or method_name not in runner.methods:
            self.fail(
                NotFoundError(
                    "batchable method",
                    f"{runner_name}.{method_name}",
                    served=[
                        f"{n}.{m.name}"
                        for n, r in self.runners().items()
                        for m in r.methods.values()
                        if m.batchable
                    ],
                )
            )
        try:
            runner.configure(method_name, **body)
        except ConfigError as exc:
            self.fail(exc)
        except (TypeError, ValueError) as exc:  # an unknown key, or a plain method
            self.fail(ConfigError("the request", sorted(body), f"settings it knows ({exc})"))
        self.reply_json(_configs(self.runners()))


def _configs(runners: Mapping[str, Runner]) -> dict[str, Any]:
    return {
        name: {m.name: m.config.as_dict() for m in runner.methods.values() if m.batchable}
        for name, runner in runners.items()
    }


def make_app(state: ServerState) -> tornado.web.Application:
    """The tornado application over ``state`` (runners, token, limits). Build on the loop."""
    args = {"state": state}
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


class _NotFound(BaseHandler):
    def prepare(self) -> None:
        super().prepare()
        self.fail(NotFoundError("route", self.request.path))
