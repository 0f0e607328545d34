"""Routes as data: a path template, and per HTTP method its handler, body types and token rule.

One table serves both servers (tornado's and Ray's) and writes the OpenAPI document, so a
route is declared once. Matching is on the decoded path; ``{name}`` matches one segment.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labserve.server.exchange import Exchange, Reply

__all__ = ["Handler", "Route", "Router", "Verb"]

Handler = Callable[["Exchange"], Awaitable["Reply"]]
"""A route's code: reads the exchange (its parameters, body, server), returns the reply."""

_PARAM = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Verb:
    """What one HTTP method of a route does. Immutable."""

    handler: Handler
    summary: str
    """One line for the OpenAPI document and ``GET /``."""
    body: tuple[str | None, ...] | None = None
    """The media types its body may have (None in the tuple: no Content-Type); None: no body."""
    token: bool = False
    """Needs the server's token even on loopback."""
    openapi: Mapping[str, Any] = field(default_factory=dict)
    """More of its OpenAPI operation (request body schema, responses)."""


@dataclass(frozen=True)
class Route:
    """A path template (``/runners/{runner}/{method}``) and what each HTTP method does there."""

    template: str
    verbs: Mapping[str, Verb]

    @property
    def params(self) -> tuple[str, ...]:
        """The template's parameter names, in order."""
        return tuple(_PARAM.findall(self.template))


class Router:
    """Finds the route of a path: exact paths first, then templates in the order given."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = tuple(routes)
        self._exact = {r.template: r for r in routes if not r.params}
        self._patterns = [(_compile(r.template), r) for r in routes if r.params]

    def match(self, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route serving ``path`` (a trailing slash ignored) and its parameters, or None."""
        if len(path) > 1:
            path = path.rstrip("/") or "/"
        exact = self._exact.get(path)
        if exact is not None:
            return exact, {}
        for pattern, route in self._patterns:
            found = pattern.match(path)
            if found is not None:
                return route, found.groupdict()
        return None


def _compile(template: str) -> re.Pattern[str]:
    """A template's regex: its text literally, each ``{name}`` one path segment."""
    parts = _PARAM.split(template)  # literal, name, literal, name, ...
    regex = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)
    )
    return re.compile(f"^{regex}$")
