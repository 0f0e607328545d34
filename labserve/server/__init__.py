"""The in-kernel HTTP server: tornado on labserve's background loop."""

from labserve.server.serve import Server, serve

__all__ = ["Server", "serve"]
