"""The Open Inference Protocol v2 (KServe, Triton, MLServer): JSON and binary tensors.

A runner with one batchable method is the model ``{runner}``; every batchable method is
also the model ``{runner}.{method}``. Inputs map to the method's positional arguments in
order; a dict result gives outputs named by its keys, a tuple ``output__0``, ``output__1``...
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import tornado.web

from labserve._version import __version__
from labserve.base.errors import InputError, LabServeError, NotFoundError
from labserve.batching.containers import TensorSpec
from labserve.runtime.runner import Runner, RunnerMethod
from labserve.server.handlers import BaseHandler, BodyHandler
from labserve.wire.datatypes import datatype, numpy_dtype

__all__ = ["models", "routes"]

_HEADER_LENGTH = "Inference-Header-Content-Length"


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
        self.reply_json({"live": True} if which == "live" else {"ready": True})


class _Ready(_V2):
    def get(self, name: str, version: str | None = None) -> None:
        self.model(name)
        self.reply_json({"name": name, "ready": True})


class _Metadata(_V2):
    def get(self, name: str, version: str | None = None) -> None:
        spec = self.model(name).spec
        self.reply_json(
            {
                "name": name,
                "versions": ["1"],
                "platform": "labserve",
                "inputs": _tensors("input", spec.input_spec),
                "outputs": _tensors("output", spec.output_spec),
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
    async def post(self, name: str, version: str | None = None) -> None:
        method = self.model(name)
        try:
            request, binary = _split_body(self.body(), self.request.headers.get(_HEADER_LENGTH))
            args = _inputs(request, binary)
            result = await method.async_run(*args)
            outputs = _outputs(result)
        except LabServeError as exc:
            self.fail(exc)
        self._reply(name, request, outputs)

    def _reply(
        self, name: str, request: dict[str, Any], outputs: list[tuple[str, np.ndarray]]
    ) -> None:
        wanted = {o.get("name"): o for o in request.get("outputs") or []}
        default_binary = bool((request.get("parameters") or {}).get("binary_data_output", False))
        header: dict[str, Any] = {"model_name": name, "model_version": "1", "outputs": []}
        if "id" in request:
            header["id"] = request["id"]
        chunks: list[bytes] = []
        for out_name, arr in outputs:
            if wanted and out_name not in wanted:
                continue
            params = (wanted.get(out_name) or {}).get("parameters") or {}
            entry: dict[str, Any] = {
                "name": out_name,
                "datatype": datatype(arr.dtype),
                "shape": list(arr.shape),
            }
            if params.get("binary_data", default_binary):
                raw = np.ascontiguousarray(arr).tobytes()
                entry["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                entry["data"] = arr.reshape(-1).tolist()
            header["outputs"].append(entry)
        head = json.dumps(header).encode()
        if chunks:
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header(_HEADER_LENGTH, str(len(head)))
            self.finish(head + b"".join(chunks))
        else:
            self.set_header("Content-Type", "application/json")
            self.finish(head)


def _split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise InputError(f"{_HEADER_LENGTH} {header_length!r} does not fit the body")
        head, binary = body[: int(header_length)], body[int(header_length) :]
    else:
        head, binary = body, b""
    try:
        request = json.loads(head)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"inference request is not valid JSON: {exc}") from exc
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise InputError('inference request must be a JSON object with an "inputs" list')
    return request, binary


def _inputs(request: dict[str, Any], binary: bytes) -> list[np.ndarray]:
    arrays = []
    offset = 0
    for i, spec in enumerate(request["inputs"]):
        if not isinstance(spec, dict):
            raise InputError(f"inputs[{i}] must be an object")
        name = str(spec.get("name", f"input__{i}"))
        dtype_name = spec.get("datatype")
        dtype = numpy_dtype(dtype_name, what=f"input {name!r}: datatype")
        shape = spec.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise InputError(
                f"input {name!r}: shape must be a list of integers >= 0, got {shape!r}"
            )
        size = (spec.get("parameters") or {}).get("binary_data_size")
        try:
            if size is not None:
                raw = binary[offset : offset + int(size)]
                offset += int(size)
                arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
            else:
                arr = np.asarray(spec.get("data"), dtype=dtype).reshape(shape)
        except (TypeError, ValueError) as exc:
            raise InputError(
                f"input {name!r}: data does not make a {dtype_name}{shape}: {exc}"
            ) from exc
        arrays.append(arr)
    if not arrays:
        raise InputError("inference request has no inputs")
    return arrays


def _outputs(result: Any) -> list[tuple[str, np.ndarray]]:
    if isinstance(result, dict):
        return [(str(k), np.asarray(v)) for k, v in result.items()]
    if isinstance(result, tuple):
        return [(f"output__{i}", np.asarray(v)) for i, v in enumerate(result)]
    return [("output__0", np.asarray(result))]


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
