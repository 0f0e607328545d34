"""serve(): start the HTTP server on labserve's background loop; stop it; re-run safely."""

from __future__ import annotations

import inspect
import ipaddress
import secrets
import socket
import threading
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import ParamSpec

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from labserve.runtime import session
from labserve.runtime.loop import BackgroundLoop, background_loop
from labserve.runtime.runner import Runner
from labserve.server.app import Replies, make_app
from labserve.server.exchange import log
from labserve.server.listener import BoundedHTTPServer, Listener, default_max_connections
from labserve.server.state import ServerState, host_names, origin_names

__all__ = ["Server", "serve"]

P = ParamSpec("P")
_running: dict[int, Server] = {}  # by port: a re-run serve() on the same port replaces it
_running_lock = threading.Lock()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


def _check_config_sections(runners: list[Runner]) -> None:
    """Refuse a config file whose runner sections name runners there are not.

    The runners there are: ``runners``, and others running in this kernel (one file may
    configure two servers). A ``Runner(config=...)`` alone cannot tell: the file's other
    sections may be for runners made later. Raises ConfigError naming the file, the section
    and the runners there are.
    """
    names = [r.name for r in runners]
    names += [n for kind, n in session.running() if kind == "runner" and n not in names]
    checked: set[str] = set()
    for runner in runners:
        file = runner.config_file
        if file.source is not None and file.source not in checked:
            checked.add(file.source)
            file.check_runners(names)


class Server:
    """An HTTP server for runners, on labserve's background loop.

    ``start()`` returns once it listens (``url``, ``port``, ``token`` set); ``stop()`` is
    idempotent and closes its sockets. Thread-safe; a context manager.

    Guarded by default (README, "Security"): a request whose ``Host`` is not a loopback
    name or the bound address is refused (403, against DNS rebinding), as is one sent by a
    page of another origin (403) or with a Content-Type its route does not document (415).

    Args:
        runners: the runners to serve, by their names. A runner section of a config file
            they read must name one of them, or another runner in this kernel (ConfigError).
        host: the address to bind; anything but loopback needs ``token``.
        port: the port; 0 picks a free one.
        token: required by ``PATCH /config``, and by every route off loopback; generated
            when None.
        max_body_bytes: the largest request body; larger ones get 413.
        allow_origin: web origins (``"https://app.example:8443"``) whose pages may call the
            server, besides its own; ``"*"`` allows any. None by default, as Jupyter Server.
        allow_hosts: Host names served besides loopback names and the bound address;
            ``"*"`` turns the check off (behind a proxy that sets its own Host).
        max_connections: connections open at once (None: from the file-descriptor limit,
            ``min(512, (ulimit -n - 64) // 2)``). At the limit the connection idle longest
            (waiting for a request) is closed to make room; with none idle, more wait in the
            listen backlog.
        idle_timeout_s: how long a connection may sit without sending a request, or take to
            send its headers, before it is closed.
        body_timeout_s: how long a request may take to send its body.
        loop: the background loop to run on (labserve's by default).
    """

    def __init__(
        self,
        runners: Runner | Iterable[Runner],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_body_bytes: int = 16 * 1024 * 1024,
        allow_origin: str | Iterable[str] = (),
        allow_hosts: str | Iterable[str] = (),
        max_connections: int | None = None,
        idle_timeout_s: float = 60.0,
        body_timeout_s: float = 60.0,
        loop: BackgroundLoop | None = None,
    ) -> None:
        runner_list = [runners] if isinstance(runners, Runner) else list(runners)
        names = [r.name for r in runner_list]
        if len(set(names)) != len(names):
            raise ValueError(f"runner names must be unique, got {names}")
        _check_config_sections(runner_list)
        if not _loopback(host) and token is None:
            raise ValueError(
                f"binding {host!r} (not loopback) needs token=...: every route will require it"
            )
        _check_count("max_body_bytes", max_body_bytes)
        if max_connections is None:
            max_connections = default_max_connections()
        _check_count("max_connections", max_connections)
        _check_seconds("idle_timeout_s", idle_timeout_s)
        _check_seconds("body_timeout_s", body_timeout_s)
        self.max_connections = max_connections
        self.idle_timeout_s = float(idle_timeout_s)
        self.body_timeout_s = float(body_timeout_s)
        self.host = host
        self.requested_port = port
        self.port = 0
        self.token = token or secrets.token_urlsafe(24)
        self._bg = loop
        self._http: HTTPServer | None = None
        self._sockets: list[socket.socket] = []
        self._listener: Listener | None = None
        self._replies = Replies()
        self._state = ServerState(
            runners=MappingProxyType({r.name: r for r in runner_list}),
            token=self.token,
            token_everywhere=not _loopback(host),
            max_body_bytes=max_body_bytes,
            bound_host=host,
            allow_origins=origin_names(allow_origin),
            allow_hosts=host_names(allow_hosts),
        )

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:8123``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def token_everywhere(self) -> bool:
        """True when every route needs the token (a non-loopback bind), not only PATCH /config."""
        return self._state.token_everywhere

    @property
    def runners(self) -> dict[str, Runner]:
        """The served runners by name (a copy)."""
        return dict(self._state.runners)

    @property
    def running(self) -> bool:
        """True while it listens."""
        return self._http is not None

    @property
    def bg(self) -> BackgroundLoop:
        """The loop the server runs on."""
        if self._bg is None:
            self._bg = background_loop()
        return self._bg

    def start(self) -> Server:
        """Listen; a server already running on the same explicit port is stopped first."""
        if self.requested_port:
            with _running_lock:
                previous = _running.get(self.requested_port)
            if previous is not None:
                previous.stop()
        self.bg.call(self._listen)
        with _running_lock:
            _running[self.port] = self
        # Named by its address (a re-run on the same port replaced the old one above): one
        # runner may be served on two. A new runner of one of its runners' names ends it
        # (it would serve a stopped runner); so does labserve.stop_all().
        needs = [("runner", n) for n in self._state.runners]
        session.track(self, "server", self.url, self.stop, needs=needs)
        return self

    def _listen(self) -> None:
        # On the loop thread: tornado attaches to the loop it is built on.
        self._sockets = bind_sockets(self.requested_port, address=self.host)
        self._http = BoundedHTTPServer(
            make_app(self._state, replies=self._replies),
            # Routes with a body raise it per request to read and drop past the limit.
            max_body_size=self._state.max_body_bytes + 1,
            idle_connection_timeout=self.idle_timeout_s,  # tornado: also the headers' timeout
            body_timeout=self.body_timeout_s,
        )
        self._listener = Listener(self._http, self._sockets, self.max_connections)
        self._listener.start()
        self.port = self._sockets[0].getsockname()[1]

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop listening and close connections and sockets. Idempotent.

        ``drain_s``: how long replies in progress may take to end before their connections
        are closed. After ``runner.stop()`` every stream of the runner's generations ends
        at once with its final error event; a drain lets that event reach the client.
        """
        if isinstance(drain_s, bool) or not isinstance(drain_s, (int, float)) or drain_s < 0:
            raise ValueError(f"drain_s must be a number of seconds >= 0, got {drain_s!r}")
        http = self._http
        if http is None:
            return
        self._http = None
        session.forget(self)
        with _running_lock:
            if _running.get(self.port) is self:
                del _running[self.port]
        if self.bg.running:
            self.bg.run(self._close(http, drain_s), timeout=10 + drain_s)

    async def _close(self, http: HTTPServer, drain_s: float = 0.0) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        http.stop()
        if drain_s > 0 and not await self._replies.ended(drain_s):
            log.warning(
                "server %s stopping: %d replies still open after %g s, cut",
                self.url,
                len(self._replies),
                drain_s,
            )
        await http.close_all_connections()
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"listening on {self.url}" if self._http is not None else "stopped"
        return f"<labserve.Server {state} runners={list(self._state.runners)}>"


def _starting(cls: Callable[P, Server]) -> Callable[P, Server]:
    """``cls(...).start()``, with ``cls``'s own parameters (declared once, on Server)."""

    def serve(*args: P.args, **kwargs: P.kwargs) -> Server:
        """Serve ``runners`` over HTTP from labserve's background loop; returns at once.

        Binds loopback by default; a token is always generated (``server.token``) and
        guards ``PATCH /config``, or every route on a non-loopback address. Re-running it
        with the same ``port`` replaces the previous server. Takes :class:`Server`'s
        arguments.

        >>> server = labserve.serve(runner, port=0)      # doctest: +SKIP
        >>> server.url, server.stop()                      # doctest: +SKIP
        """
        return cls(*args, **kwargs).start()

    # help() and IDEs show Server's parameters, and that it returns the Server.
    signature = inspect.signature(cls).replace(return_annotation=Server.__name__)
    setattr(serve, "__signature__", signature)  # noqa: B010 (mypy: functions have no such field)
    return serve


serve = _starting(Server)
