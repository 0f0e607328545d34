"""The Open Inference Protocol v2 (KServe, Triton, MLServer): JSON and binary tensors.

A runner with one batchable method is the model ``{runner}``; every batchable method is
also the model ``{runner}.{method}``. Inputs map to the method's positional arguments in
order; a dict result gives outputs named by its keys, a tuple ``output__0``, ``output__1``...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tornado.web

from labserve._version import __version__
from labserve.base.errors import InputError, LabServeError, NotFoundError, OutputError
from labserve.batching.containers import TensorSpec
from labserve.runtime.runner import Runner, RunnerMethod
from labserve.server.handlers import BaseHandler, BodyHandler
from labserve.wire.codec import JSON
from labserve.wire.datatypes import datatype
from labserve.wire.inference import BINARY, HEADER_LENGTH, decode_request, encode_reply, outputs

__all__ = ["models", "routes"]


def models(runners: Mapping[str, Runner]) -> dict[str, RunnerMethod]:
    """Every served model name and the method behind it."""
    found: dict[str, RunnerMethod] = {}
    for name, runner in runners.items():
        batchable = [m for m in runner.methods.values() if m.batchable]
        for m in batchable:
            found[f"{name}.{m.name}"] = m
        if len(batchable) == 1:
            found[name] = batchable[0]
    return found


class _V2(BaseHandler):
    def error_body(self, error: LabServeError) -> dict[str, str]:
        # v2 clients (tritonclient) show only "error": put the message there too.
        return {"error": f"{error.kind}: {error}", "detail": str(error)}

    def model(self, name: str) -> RunnerMethod:
        served = models(self.runners())
        method = served.get(name)
        if method is None:
            self.fail(NotFoundError("model", name, served=served))
        return method


class _Server(_V2):
    def get(self) -> None:
        self.reply_json(
            {"name": "labserve", "version": __version__, "extensions": ["binary_tensor_data"]}
        )


class _Health(_V2):
    def get(self, which: str) -> None:
        if which == "live":
            self.reply_json({"live": True})
            return
        ready = all(m.stats().ready for m in models(self.runners()).values())
        if not ready:
            self.set_status(503)
        self.reply_json({"ready": ready})


class _Ready(_V2):
    def get(self, name: str, version: str | None = None) -> None:
        # Not ready while every batch slot is held by a stuck model call (503, as Triton
        # answers a model that is not ready with an error status).
        ready = self.model(name).stats().ready
        if not ready:
            self.set_status(503)
        self.reply_json({"name": name, "ready": ready})


class _Metadata(_V2):
    def get(self, name: str, version: str | None = None) -> None:
        spec = self.model(name).spec
        try:
            inputs = _tensors("input", spec.input_spec)
            outs = _tensors("output", spec.output_spec)
        except InputError as exc:  # a declared dtype with no v2 name: the model's side
            self.fail(OutputError(str(exc), "v2 metadata"))
        self.reply_json(
            {
                "name": name,
                "versions": ["1"],
                "platform": "labserve",
                "inputs": inputs,
                "outputs": outs,
            }
        )


def _tensors(prefix: str, specs: tuple[TensorSpec, ...] | None) -> list[dict[str, Any]]:
    """Metadata of declared tensors, named ``{prefix}__0``, ``{prefix}__1``..."""
    return [
        {"name": f"{prefix}__{i}", "datatype": datatype(np.dtype(s.dtype)), "shape": [-1, *s.shape]}
        for i, s in enumerate(specs or ())
    ]


@tornado.web.stream_request_body
class _Infer(BodyHandler, _V2):
    content_types = (JSON, BINARY, None)  # tritonclient sends no Content-Type

    async def post(self, name: str, version: str | None = None) -> None:
        body = self.body()
        method = self.model(name)
        try:
            request = decode_request(body, self.request.headers.get(HEADER_LENGTH))
        except LabServeError as exc:
            self.fail(exc)
        result = await self.call_model(method, *request.inputs)
        try:
            reply, header_length = encode_reply(name, request, outputs(result))
        except LabServeError as exc:
            self.fail(exc)
        if header_length is None:
            self.set_header("Content-Type", JSON)
        else:
            self.set_header("Content-Type", BINARY)
            self.set_header(HEADER_LENGTH, str(header_length))
        self.finish(reply)


def routes(args: dict[str, Any]) -> list[Any]:
    """The v2 routes, for make_app."""
    model = r"/v2/models/([^/]+)"
    version = r"(?:/versions/([^/]+))?"
    return [
        (r"/v2/?", _Server, args),
        (r"/v2/health/(live|ready)", _Health, args),
        (model + version + r"/ready", _Ready, args),
        (model + version + r"/infer", _Infer, args),
        (model + version, _Metadata, args),
    ]
