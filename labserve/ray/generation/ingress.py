"""The OpenAI routes in front of a generative deployment, for a router that reads the prompt.

Ray's proxy routes a request before its body is read, so a replica's router never sees an
HTTP request's prompt (:mod:`labserve.ray.router`). With a router that scores the prompt
(``prefix``, ``prefix_affinity``), an application gets this ingress as a second Serve
application at ``<route prefix>/v1`` (Serve's proxy takes the longest matching prefix, so
only ``/v1/...`` comes here; ``/stats``, ``/config``, ``/runners``, ``/v2`` still go straight
to the replicas). It reads and checks the body with the kernel server's own HTTP core (the
same guards, parsing and typed errors: :mod:`labserve.server.openai`) and calls the
generative deployment through a handle with the checked request as the call's argument,
so the handle's ``LabServeRouter`` keys the prompt; the text comes back through here, as
Ray Serve LLM's OpenAI ingress does in front of its LLM servers. Loop-only: everything
runs on the ingress replica's event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from labserve.generation.api import GenerateRequest
from labserve.ray.generation.calls import AsyncRayStream
from labserve.ray.http import Routes
from labserve.ray.spec import ReplicaSpec
from labserve.server.core import HttpCore
from labserve.server.exchange import Backend, model_names
from labserve.server.state import ServerState

__all__ = [
    "MOUNT",
    "Ingress",
    "PiecesStream",
    "RemoteGenerator",
    "ingress_app",
    "ingress_route",
]

MOUNT = "/v1"
"""Where under the application's route prefix the ingress serves (the OpenAI routes)."""


def ingress_app(app: str) -> str:
    """The Serve application name of application ``app``'s ingress."""
    return f"{app}-ingress"


def ingress_route(route_prefix: str) -> str:
    """The ingress's route prefix: ``/v1`` under the application's."""
    return route_prefix.rstrip("/") + MOUNT


class RemoteGenerator:
    """A generative method of the deployment behind ``handle``, as the OpenAI routes drive it.

    Each request is one streaming call of the replica's ``stream_request`` with the
    checked GenerateRequest as its argument (the router keys its prompt); the replica
    admits it by the kernel server's door (``GenerativeMethod.start``), so answers and
    refusals are the kernel server's. Errors come back typed.
    """

    def __init__(self, handle: DeploymentHandle[Any], method: str) -> None:
        self._handle = handle
        self.method = method

    def start(self, request: GenerateRequest) -> PiecesStream:
        """Admit one generation on the replica the router picks; its text as it comes."""
        call = self._handle.options(stream=True).stream_request.remote(self.method, request)
        return PiecesStream(call)


class PiecesStream(AsyncRayStream):
    """The text pieces of a replica's ``stream_request`` (which sends them in lists)."""

    async def __aiter__(self) -> AsyncIterator[str]:
        async for pieces in self._items():
            for piece in pieces:
                yield piece


class Ingress:
    """The ingress deployment's class: the OpenAI routes, generation through a handle.

    Serve builds it once per ingress replica, on the loop that answers its requests.
    """

    def __init__(self, spec: ReplicaSpec) -> None:
        handle: DeploymentHandle[Any] = serve.get_deployment_handle(spec.runner, spec.app)
        names = model_names(spec.runner, tuple(spec.generation))
        generators = {model: RemoteGenerator(handle, m) for m, model in names.items()}
        state = ServerState(
            runners={},
            token=spec.token,
            token_everywhere=spec.token_everywhere,
            max_body_bytes=spec.max_body_bytes,
            allow_origins=spec.allow_origins,
            allow_hosts=spec.allow_hosts,
        )
        self.http = Routes(HttpCore(state, Backend(state, generators)), mount=MOUNT)

    async def __call__(self, request: Request) -> Response:
        """An HTTP request under ``/v1`` from Ray Serve's proxy."""
        return await self.http(request)
