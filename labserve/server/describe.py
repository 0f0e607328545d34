"""What a server serves, said two ways: ``GET /`` for a person, ``/openapi.json`` for tools.

Both are written from the route table and the served runners, so they cannot drift from
what the server does. Loop-only handlers, framework-neutral.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from labserve._version import __version__
from labserve.runtime.runner import RunnerMethod
from labserve.server.exchange import Exchange, Reply, generator_names, json_reply
from labserve.server.openai import CHAT_PATH, COMPLETIONS_PATH
from labserve.server.routing import Route, Verb
from labserve.server.state import ServerState
from labserve.server.v2 import models
from labserve.wire.codec import JSON, NPY
from labserve.wire.inference import BINARY

__all__ = ["completion_curl", "document", "index", "openai_client", "openapi"]

_ERROR = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string", "description": "The error's class name (v2: and message)"},
        "detail": {"type": "string", "description": "What was wrong and what was expected"},
    },
}
_ROWS = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "array", "minItems": 1, "items": {"type": "number"}},
    "description": "The batch's rows: one row per item",
}
_V2_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "inputs": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "datatype", "shape", "data"],
                "properties": {
                    "name": {"type": "string"},
                    "datatype": {"type": "string", "enum": ["FP32", "FP64", "INT32", "INT64"]},
                    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "data": {"type": "array", "items": {"type": "number"}},
                },
            },
        },
    },
}


def _example_body(method: RunnerMethod) -> str:
    """A body of one row (of the declared width if declared), by name for several inputs."""
    specs = method.spec.input_spec or ()
    widths = [s.shape[0] if s.shape and s.shape[0] > 0 else 1 for s in specs]
    names = method.parameters or ("x",)
    rows = [[[1.0] * w] for w in widths] or [[[1.0, 2.0, 3.0]] for _ in names]
    if len(rows) == 1:
        return json.dumps(rows[0])
    return json.dumps({name: row for name, row in zip(names, rows, strict=False)})


def _curl(base: str, method: RunnerMethod, state: ServerState) -> str:
    auth = ' -H "Authorization: Bearer $TOKEN"' if state.token_everywhere else ""
    return (
        f"curl -X POST {base}/runners/{method.runner.name}/{method.name}{auth} "
        f"-H 'Content-Type: application/json' -d '{_example_body(method)}'"
    )


def completion_curl(base: str, model: str, *, token: bool = False) -> str:
    """A ``curl`` that asks ``model`` for a completion at ``base`` (``http://host:port``).

    ``token``: every route needs the token (a non-loopback bind): the curl sends ``$TOKEN``.
    """
    auth = ' -H "Authorization: Bearer $TOKEN"' if token else ""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 16})
    return f"curl {base}{COMPLETIONS_PATH}{auth} -H 'Content-Type: application/json' -d '{body}'"


def openai_client(base: str, *, token: bool = False) -> str:
    """The line that points the ``openai`` client at ``base``: its base URL and key.

    ``token``: every route needs the token, which goes as the key.
    """
    if token:
        key, why = '"<token>"', "the server's token"
    else:
        key, why = '"unused"', "any key: this server asks for none"
    return f'openai.OpenAI(base_url="{base}/v1", api_key={key})  # {why}'


def _generative(base: str, model: str, state: ServerState) -> dict[str, Any]:
    return {
        "generative": True,
        "model": model,
        "routes": [COMPLETIONS_PATH, CHAT_PATH],
        "openai_base_url": f"{base}/v1",
        "example": completion_curl(base, model, token=state.token_everywhere),
    }


def _methods(ex: Exchange, base: str) -> dict[str, Any]:
    v2_names: dict[RunnerMethod, list[str]] = {}
    for name, m in models(ex.state.runners).items():
        v2_names.setdefault(m, []).append(name)
    model_of = {id(g): name for name, g in generator_names(ex.state.runners).items()}
    described: dict[str, Any] = {}
    for runner_name, runner in ex.state.runners.items():
        entry = described[runner_name] = {
            m.name: {
                "batchable": m.batchable,
                "route": f"/runners/{runner_name}/{m.name}",
                "parameters": list(m.parameters),
                "v2_models": sorted(v2_names.get(m, [])),
                "example": _curl(base, m, ex.state),
            }
            for m in runner.methods.values()
        }
        for name, gen in runner.generators.items():
            entry[name] = _generative(base, model_of[id(gen)], ex.state)
    return described


def _routes(table: Sequence[Route]) -> list[dict[str, Any]]:
    return [
        {"method": verb, "path": r.template, "summary": v.summary, "token": v.token}
        for r in table
        for verb, v in r.verbs.items()
    ]


def index(table: Sequence[Route]) -> Verb:
    """``GET /``: the runners, their methods and routes, an example curl for each."""

    async def handler(ex: Exchange) -> Reply:
        base = f"http://{ex.head.headers.get('Host') or '127.0.0.1'}"
        return json_reply(
            {
                "name": "labserve",
                "version": __version__,
                "runners": _methods(ex, base),
                "routes": _routes(table),
                "openai_models": sorted(ex.backend.generators()),
                "openai_client": (
                    openai_client(base, token=ex.state.token_everywhere)
                    if ex.backend.generators()
                    else None
                ),
                "openapi": "/openapi.json",
                "token": (
                    "every route needs it"
                    if ex.state.token_everywhere
                    else "PATCH /config needs it (header Authorization: Bearer <token>)"
                ),
            }
        )

    return Verb(handler, "What this server serves, with an example curl per method")


def openapi(table: Sequence[Route]) -> Verb:
    """``GET /openapi.json``: an OpenAPI 3.0 document of every route, for the served runners."""

    async def handler(ex: Exchange) -> Reply:
        return json_reply(document(table, ex.state))

    return Verb(handler, "This document: OpenAPI 3.0 for every route")


def document(table: Sequence[Route], state: ServerState) -> dict[str, Any]:
    """The OpenAPI document of ``table`` as served over ``state``'s runners."""
    paths: dict[str, Any] = {}
    for route in table:
        params = [_parameter(name, state) for name in route.params]
        item: dict[str, Any] = {}
        for verb, v in route.verbs.items():
            op: dict[str, Any] = {
                "summary": v.summary,
                "operationId": f"{verb.lower()}{route.template}",
                "responses": _responses(route),
            }
            if params:
                op["parameters"] = params
            if v.body is not None:
                op["requestBody"] = _request_body(route, v)
            if v.token or state.token_everywhere:
                op["security"] = [{"token": []}]
            op.update(v.openapi)  # what the route says of itself
            item[verb.lower()] = op
        paths[route.template] = item
    return {
        "openapi": "3.0.3",
        "info": {"title": "labserve", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR},
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
    }


def _parameter(name: str, state: ServerState) -> dict[str, Any]:
    served: dict[str, list[str]] = {
        "runner": sorted(state.runners),
        "method": sorted({m for r in state.runners.values() for m in r.methods}),
        "model": sorted(models(state.runners)),
        "version": ["1"],
    }
    schema: dict[str, Any] = {"type": "string"}
    if served.get(name):
        schema["enum"] = served[name]
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _request_body(route: Route, verb: Verb) -> dict[str, Any]:
    types = [t for t in verb.body or () if t is not None]
    schemas: dict[str, Any] = {
        JSON: {"type": "object"},
        NPY: {"type": "string", "format": "binary"},
        BINARY: {"type": "string", "format": "binary"},
    }
    if route.template.startswith("/runners/"):
        schemas[JSON] = {
            "oneOf": [
                _ROWS,
                {"type": "object", "minProperties": 1, "additionalProperties": _ROWS},
            ]
        }
    elif route.template.endswith("/infer"):
        schemas[JSON] = _V2_REQUEST
    content = {t: {"schema": schemas[t]} for t in types}
    return {"required": None not in (verb.body or ()), "content": content}


def _responses(route: Route) -> dict[str, Any]:
    error = {"description": "A typed error", "content": {JSON: {"schema": _ERROR}}}
    return {"200": {"description": "OK"}, "default": error}
