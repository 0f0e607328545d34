"""Which route serves a path: routes as data, matched by their path templates.

A :class:`Route` is a path template and, per HTTP method, a :class:`Verb` (its handler,
body types and token rule; both defined beside the exchange that runs them). One table
serves both servers (tornado's and Ray's) and writes the OpenAPI document, so a route is
declared once. Matching is on the decoded path; ``{name}`` matches one segment.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from labserve.server.exchange import PARAM, Route, Verb

__all__ = ["Route", "Router", "Verb"]


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
    parts = PARAM.split(template)  # literal, name, literal, name, ...
    regex = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)
    )
    return re.compile(f"^{regex}$")
