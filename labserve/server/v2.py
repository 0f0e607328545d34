"""The Open Inference Protocol v2 (KServe, Triton, MLServer): JSON and binary tensors.

A runner with one batchable method is the model ``{runner}``; every batchable method is
also the model ``{runner}.{method}``. Inputs map to the method's positional arguments in
order; a dict result gives outputs named by its keys, a tuple ``output__0``, ``output__1``...
Framework-neutral handlers (both servers serve them); loop-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from labserve._version import __version__
from labserve.base.errors import InputError, NotFoundError, OutputError
from labserve.batching.containers import TensorSpec
from labserve.runtime.runner import Runner, RunnerMethod
from labserve.server.exchange import Exchange, Reply, json_reply
from labserve.server.routing import Route, Verb
from labserve.wire.codec import JSON
from labserve.wire.datatypes import datatype
from labserve.wire.inference import BINARY, HEADER_LENGTH, decode_request, encode_reply, outputs

__all__ = ["ROUTES", "metadata", "models"]


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


def _model(ex: Exchange) -> tuple[str, RunnerMethod]:
    name = ex.params["model"]
    served = models(ex.state.runners)
    method = served.get(name)
    if method is None:
        raise NotFoundError("model", name, served=served)
    return name, method


async def _server(ex: Exchange) -> Reply:
    return json_reply(
        {"name": "labserve", "version": __version__, "extensions": ["binary_tensor_data"]}
    )


async def _live(ex: Exchange) -> Reply:
    return json_reply({"live": True})


async def _ready(ex: Exchange) -> Reply:
    ready = all(m.stats().ready for m in models(ex.state.runners).values())
    return json_reply({"ready": ready}, 200 if ready else 503)


async def _model_ready(ex: Exchange) -> Reply:
    # Not ready while every batch slot is held by a stuck model call (503, as Triton
    # answers a model that is not ready with an error status).
    name, method = _model(ex)
    ready = method.stats().ready
    return json_reply({"name": name, "ready": ready}, 200 if ready else 503)


async def _metadata(ex: Exchange) -> Reply:
    name, method = _model(ex)
    return json_reply(metadata(name, method))


def metadata(name: str, method: RunnerMethod) -> dict[str, Any]:
    """A model's v2 metadata: its declared input and output tensors (none if undeclared).

    OutputError for a declared dtype with no v2 name (the model's side, not the client's).
    """
    spec = method.spec
    try:
        inputs = _tensors("input", spec.input_spec)
        outs = _tensors("output", spec.output_spec)
    except InputError as exc:
        raise OutputError(str(exc), "v2 metadata") from None
    return {
        "name": name,
        "versions": ["1"],
        "platform": "labserve",
        "inputs": inputs,
        "outputs": outs,
    }


def _tensors(prefix: str, specs: tuple[TensorSpec, ...] | None) -> list[dict[str, Any]]:
    """Metadata of declared tensors, named ``{prefix}__0``, ``{prefix}__1``..."""
    return [
        {"name": f"{prefix}__{i}", "datatype": datatype(np.dtype(s.dtype)), "shape": [-1, *s.shape]}
        for i, s in enumerate(specs or ())
    ]


async def _infer(ex: Exchange) -> Reply:
    name, method = _model(ex)
    request = decode_request(ex.body, ex.head.headers.get(HEADER_LENGTH))
    result = await ex.call(method, *request.inputs)
    reply, header_length = encode_reply(name, request, outputs(result))
    if header_length is None:
        return Reply(200, reply, {"Content-Type": JSON})
    return Reply(200, reply, {"Content-Type": BINARY, HEADER_LENGTH: str(header_length)})


def _model_routes(prefix: str) -> tuple[Route, ...]:
    infer = Verb(
        _infer,
        "Open Inference Protocol v2 inference (JSON or binary tensors)",
        body=(JSON, BINARY, None),  # tritonclient sends no Content-Type
    )
    return (
        Route(prefix + "/ready", {"GET": Verb(_model_ready, "Whether the model is ready")}),
        Route(prefix + "/infer", {"POST": infer}),
        Route(prefix, {"GET": Verb(_metadata, "The model's declared input and output tensors")}),
    )


ROUTES = (
    Route("/v2", {"GET": Verb(_server, "The server's v2 metadata")}),
    Route("/v2/health/live", {"GET": Verb(_live, "Alive")}),
    Route("/v2/health/ready", {"GET": Verb(_ready, "Every model ready")}),
    *_model_routes("/v2/models/{model}/versions/{version}"),
    *_model_routes("/v2/models/{model}"),
)
"""The v2 routes, in matching order."""
