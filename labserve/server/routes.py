"""The simple routes: inference, health, stats, Prometheus metrics and live config.

Framework-neutral handlers over an :class:`~labserve.server.exchange.Exchange`; both
servers serve them (:mod:`labserve.server.core` holds the table). Loop-only.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from labserve.base.errors import (
    BatchSizeMismatchError,
    ConfigError,
    InputError,
    ModelError,
    NotFoundError,
)
from labserve.generation.prometheus import GenerationCollector
from labserve.metrics.prometheus import SnapshotCollector
from labserve.runtime.runner import RunnerMethod
from labserve.runtime.served import ServedMethod
from labserve.server.exchange import Exchange, Reply, configs, json_reply
from labserve.server.routing import Route, Verb
from labserve.server.state import ServerState
from labserve.wire.codec import JSON, NPY, decode, encode

__all__ = ["ROUTES", "served_method"]


def served_method(state: ServerState, runner_name: str, method_name: str) -> RunnerMethod:
    """The method behind ``/runners/{runner}/{method}``; NotFoundError naming what is served."""
    runner = state.runners.get(runner_name)
    if runner is None:
        raise NotFoundError("runner", runner_name, served=state.runners)
    method = runner.methods.get(method_name)
    if method is None:
        raise NotFoundError(
            "method", method_name, served=runner.methods, within=f"runner {runner_name!r}"
        )
    return method


async def _infer(ex: Exchange) -> Reply:
    method = served_method(ex.state, ex.params["runner"], ex.params["method"])
    arg, kind = decode(ex.body, ex.head.headers.get("Content-Type") or "")
    args = arguments(method, arg)
    try:
        result = await ex.call(method, *args)
    except (ModelError, BatchSizeMismatchError) as exc:
        refused = _one_dimensional(method, args, exc) or _misnamed(method, args, exc)
        if refused is None:
            raise
        raise refused from exc
    body, content_type = encode(result, kind)
    return Reply(200, body, {"Content-Type": content_type})


def arguments(method: RunnerMethod, arg: Any) -> tuple[Any, ...]:
    """The call's arguments: an object whose names are the method's parameters, by name.

    Any other body (an array, an object of other names) is the method's one argument.
    """
    if not isinstance(arg, dict):
        return (arg,)  # the usual body: no signature to read (inspect costs 20-30 µs a call)
    names = method.parameters
    if not names or not set(arg) <= set(names):
        return (arg,)
    count = max(names.index(n) for n in arg) + 1
    missing = [n for n in names[:count] if n not in arg]
    if missing:
        raise InputError(
            f"{method.runner.name}.{method.name} takes its inputs in the order "
            f"{', '.join(names)}: the body names {', '.join(arg)} but not {', '.join(missing)}",
            sent=sorted(arg),
            expected=list(names),
        )
    return tuple(arg[n] for n in names[:count])


def _one_dimensional(
    method: RunnerMethod, args: tuple[Any, ...], exc: Exception
) -> InputError | None:
    """A model that failed on a 1-D body (a row sent without its brackets): the client's error.

    The simple route's body is the batch's rows, so ``[1, 2, 3, 4]`` is four rows of one
    value. A model that takes rows of features fails on it; that is a 400 naming the shape
    and what to send, not the model's 500. (A method that declares ``input_spec`` refuses
    the shape at admission instead.)
    """
    batch_dim = method.spec.batch_dim
    in_dim = batch_dim if isinstance(batch_dim, int) else batch_dim[0]
    arr = args[0] if len(args) == 1 else None
    if (
        not (isinstance(arr, np.ndarray) and arr.ndim == 1 and in_dim == 0 and method.batchable)
        or method.spec.input_spec is not None
    ):
        return None
    shape = f"{arr.dtype}[{arr.shape[0]}]"
    return InputError(
        f"{method.runner.name}.{method.name} failed on a 1-D body ({shape}): the body holds "
        f"the batch's rows, so one row of {arr.shape[0]} values is [[...]], not [...] "
        f"(the model said: {exc})",
        sent=shape,
        expected="rows: [[...], ...]",
    )


def _misnamed(method: RunnerMethod, args: tuple[Any, ...], exc: Exception) -> InputError | None:
    """A model that failed on an object whose names are not its parameters: the client's error.

    Such an object is the method's one argument (a model may take a dict of arrays); one
    that fails on it most likely wanted an array, or the object named by its parameters.
    """
    if len(args) != 1 or not isinstance(args[0], dict) or not method.parameters:
        return None
    return InputError(
        f"{method.runner.name}.{method.name} failed on an object named "
        f"{', '.join(map(repr, args[0]))}, which are not its parameters "
        f"({', '.join(method.parameters)}): send an array of rows, or an object named by "
        f"its parameters (the model said: {exc})",
        sent=sorted(args[0]),
        expected=list(method.parameters),
    )


async def _health(ex: Exchange) -> Reply:
    # Alive while it answers; "degraded" names the methods whose every batch slot is
    # held by a model call past its request timeout (they refuse requests meanwhile).
    stuck = {
        f"{name}.{s.method}": f"{s.stuck_batches} stuck batch(es), refusing requests"
        for name, runner in ex.state.runners.items()
        for s in runner.snapshots()
        if not s.ready
    }
    return json_reply({"status": "degraded", "not_ready": stuck} if stuck else {"status": "ok"})


async def _stats(ex: Exchange) -> Reply:
    return json_reply(await ex.backend.stats())


async def _metrics(ex: Exchange) -> Reply:
    snapshots = await ex.backend.snapshots()
    generating = await ex.backend.generation_snapshots()
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshots))
    registry.register(GenerationCollector(lambda: generating))
    return Reply(200, generate_latest(registry), {"Content-Type": CONTENT_TYPE_LATEST})


async def _get_config(ex: Exchange) -> Reply:
    return json_reply(configs(ex.state))


async def _patch_config(ex: Exchange) -> Reply:
    try:
        body = json.loads(ex.body or b"{}")
    except (ValueError, RecursionError) as exc:
        raise InputError(f"body is not valid JSON: {exc!r}") from None
    if not isinstance(body, dict):
        raise InputError("body must be a JSON object")
    changes = config_changes(ex.state, body)
    for method, settings in changes:  # all checked first: a bad change applies none
        try:
            method.config.replace(**settings)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:  # an unknown key
            raise ConfigError(
                "the request", sorted(settings), f"settings it knows ({exc})"
            ) from exc
    return json_reply(await ex.backend.configure(changes))


def config_changes(
    state: ServerState, body: dict[str, Any]
) -> list[tuple[ServedMethod, dict[str, Any]]]:
    """The methods a ``PATCH /config`` body changes, and each one's settings.

    Two shapes: ``GET /config``'s (``{runner: {method: {setting: value}}}``, any subset),
    and one method's, flat (``{"runner": r, "method": m, setting: value}``; ``runner`` may
    be left out when one runner is served).
    """
    if "method" in body and not isinstance(body["method"], dict):
        return [_flat_change(state, dict(body))]
    if not body:
        raise InputError(f"body names no method: {_what_to_send(state, {})}")
    changes = []
    for runner_name, methods in body.items():
        if not isinstance(methods, dict):
            # Most often a setting sent alone ({"max_num_seqs": 8}): say both shapes.
            raise InputError(
                f"body[{runner_name!r}] must be an object of methods' settings, as "
                f"GET /config returns, got {type(methods).__name__}; "
                f"{_what_to_send(state, body)}"
            )
        for method_name, settings in methods.items():
            if not isinstance(settings, dict):
                raise InputError(
                    f"body[{runner_name!r}][{method_name!r}] must be an object of settings, "
                    f"got {type(settings).__name__}"
                )
            changes.append((_configurable(state, runner_name, method_name), dict(settings)))
    return changes


def _what_to_send(state: ServerState, body: dict[str, Any]) -> str:
    """The two shapes PATCH /config takes, written for a method served here and ``body``."""
    served = [(n, m) for n, r in state.runners.items() for m in r.configurable()]
    if not served:
        return "this server has no method whose settings change live"
    runner_name, method_name = served[0]
    settings = {k: v for k, v in body.items() if not isinstance(v, dict)} or {"...": "..."}
    flat = {"method": method_name, **settings}
    if len(state.runners) > 1:
        flat = {"runner": runner_name, **flat}
    nested = {runner_name: {method_name: settings}}
    return (
        f"send one method's settings flat, {json.dumps(flat)}, or GET /config's shape, "
        f"{json.dumps(nested)}"
    )


def _flat_change(state: ServerState, body: dict[str, Any]) -> tuple[ServedMethod, dict[str, Any]]:
    only = next(iter(state.runners)) if len(state.runners) == 1 else None
    runner_name = body.pop("runner", only)
    method_name = body.pop("method")
    if not isinstance(runner_name, str) or not isinstance(method_name, str):
        raise InputError(
            '"runner" and "method" must be strings, got '
            f"{type(runner_name).__name__} and {type(method_name).__name__}"
        )
    return _configurable(state, runner_name, method_name), body


def _configurable(state: ServerState, runner_name: str, method_name: str) -> ServedMethod:
    """A method whose settings change live: batchable, or generative (continuous batching)."""
    runner = state.runners.get(runner_name)
    method = runner.configurable().get(method_name) if runner is not None else None
    if method is None:
        generating = any(r.generators for r in state.runners.values())
        raise NotFoundError(
            "batchable or generative method" if generating else "batchable method",
            f"{runner_name}.{method_name}",
            served=[f"{n}.{name}" for n, r in state.runners.items() for name in r.configurable()],
        )
    return method


_CONFIG_BODY = {"type": "object", "additionalProperties": {"type": "object"}}

ROUTES = (
    Route(
        "/runners/{runner}/{method}",
        {
            "POST": Verb(
                _infer,
                "One request: a JSON array of rows (or an object of named arrays), or .npy",
                body=(JSON, NPY),
            )
        },
    ),
    Route("/healthz", {"GET": Verb(_health, "Alive; degraded names stuck methods")}),
    # vLLM's, TGI's and transformers' servers answer GET /health, and clients built for them
    # check it before sending load (guidellm's start-up check stops at a 404).
    Route("/health", {"GET": Verb(_health, "As /healthz (the path vLLM and TGI answer)")}),
    Route("/stats", {"GET": Verb(_stats, "Every batchable method's snapshot, as JSON")}),
    Route("/metrics", {"GET": Verb(_metrics, "Prometheus text")}),
    Route(
        "/config",
        {
            "GET": Verb(_get_config, "Every batchable method's config in force"),
            "PATCH": Verb(
                _patch_config,
                "Change settings live (GET /config's shape, any subset); needs the token",
                body=(JSON, None),
                token=True,
                openapi={"requestBody": {"content": {JSON: {"schema": _CONFIG_BODY}}}},
            ),
        },
    ),
)
"""The simple routes, in matching order."""
