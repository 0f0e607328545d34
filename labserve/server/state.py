"""What a server's routes read: its runners, token, guards and limits (both servers')."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from labserve.runtime.runner import Runner

__all__ = ["ServerState", "host_names", "origin_names"]

# Loopback names, and the commonest loopback addresses (checked first: no parsing).
_LOCAL_NAMES = frozenset(
    {"localhost", "localhost.localdomain", "ip6-localhost", "127.0.0.1", "::1"}
)


@dataclass(frozen=True)
class ServerState:
    """What a server's routes read: runners, token, guards and limits. Immutable, thread-safe."""

    runners: Mapping[str, Runner]
    token: str
    token_everywhere: bool  # every route needs the token (a non-loopback bind)
    max_body_bytes: int
    bound_host: str = "127.0.0.1"  # the address the server listens on
    allow_origins: frozenset[str] = frozenset()  # origins besides the server's own; "*" any
    allow_hosts: frozenset[str] = frozenset()  # Host names besides loopback; "*" any

    def host_allowed(self, host: str) -> bool:
        """True if a request's Host header (``name[:port]``) may be served."""
        if "*" in self.allow_hosts:
            return True
        name = _host_name(host)
        if name in _LOCAL_NAMES or name in self.allow_hosts or name == self.bound_host.lower():
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False  # a name: only the ones listed (a rebinding attacker controls DNS)
        # An address is never an attacker's name; off loopback, any address of a wildcard bind.
        return address.is_loopback or self.bound_host in ("0.0.0.0", "::", "")

    def origin_allowed(self, origin: str, host: str) -> bool:
        """True if a request with this ``Origin`` header may be served (same-origin or listed)."""
        if self.origin_listed(origin):
            return True
        return urlsplit(origin.lower()).netloc == host.lower()

    def origin_listed(self, origin: str) -> bool:
        """True if ``origin`` is allowed by name (its replies then carry CORS headers)."""
        return "*" in self.allow_origins or origin in self.allow_origins


def _host_name(host: str) -> str:
    """The name in a Host header, without the port or an IPv6 address's brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def origin_names(value: str | Iterable[str]) -> frozenset[str]:
    """``allow_origin`` as a server keeps it: each origin without a trailing slash.

    ValueError for anything but a non-empty string or strings (both servers check it so).
    """
    return frozenset(n.rstrip("/") for n in _strings("allow_origin", value))


def host_names(value: str | Iterable[str]) -> frozenset[str]:
    """``allow_hosts`` as a server keeps it: each name lower-case (Host is case-blind)."""
    return frozenset(n.lower() for n in _strings("allow_hosts", value))


def _strings(what: str, value: str | Iterable[str]) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{what} must be a string or strings, got {value!r}")
    return names
