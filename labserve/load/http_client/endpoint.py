"""Where a load's requests go, and their bytes: an http(s) URL read once, requests made once.

Both load generators (requests and streamed generations) send to an :class:`Endpoint` over a
:class:`~labserve.load.http_client.pool.ConnectionPool`; each request's bytes are made once
by :func:`request_bytes` and written as they are.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from labserve.base.errors import LoadTargetError

__all__ = ["Endpoint", "path_of", "request_bytes"]


@dataclass(frozen=True)
class Endpoint:
    """An http(s) URL as the client needs it: where to connect, and the request target."""

    url: str
    origin: str
    """``scheme://host[:port]``: the server's root."""
    host: str
    port: int
    tls: bool
    path: str
    """The request target: path and query."""

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Read a load URL; LoadTargetError if it is not an http(s) URL."""
        parsed = urllib.parse.urlsplit(url)
        try:
            port = parsed.port
        except ValueError as exc:
            raise LoadTargetError(url, f"bad port: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise LoadTargetError(url, "the URL must start with http:// or https:// and a host")
        tls = parsed.scheme == "https"
        return cls(
            url,
            f"{parsed.scheme}://{parsed.netloc}",
            parsed.hostname,
            port or (443 if tls else 80),
            tls,
            path_of(url),
        )

    @property
    def host_header(self) -> str:
        """The ``Host`` header's value."""
        default = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def request(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        """One request to ``path`` on this server, ready to write (see :func:`request_bytes`)."""
        return request_bytes(method, path, self.host_header, headers, body)


def path_of(url: str) -> str:
    """The request target (path and query) of a URL."""
    parsed = urllib.parse.urlsplit(url)
    return (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")


def request_bytes(
    method: str, path: str, host: str, headers: dict[str, str], body: bytes = b""
) -> bytes:
    """One HTTP/1.1 request, ready to write as it is (made once, written many times)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
