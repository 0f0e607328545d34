"""The HTTP core both servers share: one route table, one way to guard, answer and fail.

The tornado server (:mod:`labserve.server.app`) and the Ray replica's Starlette app
(:mod:`labserve.ray.http`) are thin adapters over it: each turns its framework's request
into a :class:`~labserve.server.exchange.Head`, feeds the body to the exchange the core
begins, and sends the :class:`~labserve.server.exchange.Reply` it returns (streamed if it
has a stream). What differs between them (where stats and live config go) is a
:class:`~labserve.server.exchange.Backend`.

>>> core = HttpCore(state)                              # doctest: +SKIP
>>> exchange = core.begin(Head("GET", "/healthz", headers))   # doctest: +SKIP
>>> reply = await exchange.respond()                    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence

from labserve.server import openai, routes, v2
from labserve.server.describe import index, openapi
from labserve.server.exchange import Backend, Exchange, Head
from labserve.server.routing import Route, Router
from labserve.server.state import ServerState

__all__ = ["TABLE", "HttpCore"]

_DESCRIBED: list[Route] = []  # what GET / and /openapi.json describe: the whole table
TABLE: tuple[Route, ...] = (
    *routes.ROUTES,
    *v2.ROUTES,
    *openai.ROUTES,
    Route("/", {"GET": index(_DESCRIBED)}),
    Route("/openapi.json", {"GET": openapi(_DESCRIBED)}),
)
"""Every route both servers serve, in matching order."""
_DESCRIBED.extend(TABLE)


class HttpCore:
    """Begins one :class:`Exchange` per request over ``state`` and ``backend``. Loop-only.

    ``table`` is the routes served (:data:`TABLE` by default). Immutable once built (the
    table and state are), so one core serves every request.
    """

    def __init__(
        self,
        state: ServerState,
        backend: Backend | None = None,
        table: Sequence[Route] = TABLE,
    ) -> None:
        self.state = state
        self.backend = backend if backend is not None else Backend(state)
        self.router = Router(table)

    def begin(self, head: Head) -> Exchange:
        """The exchange of the request ``head`` describes, its refusal decided."""
        return Exchange(head, self.state, self.backend, self.router.match(head.path))
