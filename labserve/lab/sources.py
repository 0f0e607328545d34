"""Snapshot sources: one object per watched method, wherever it runs, for a dashboard or a script.

A :class:`MethodSource` is what a dashboard needs of a batchable method: its config (the
one asked for), a live change, a view (its snapshot, merged over replicas, and each
replica's own), a reset, and load. :class:`RunnerSource` watches a method in this process;
:class:`HttpSource` a method of a labserve server by URL (``GET /stats``, ``GET``/``PATCH
/config``; load through the HTTP load generator), which also reads a Ray application's
per-replica view when the URL is Ray's proxy. ``labserve.ray`` adds a Ray application's
own (``RayApp.method_sources()``). :func:`method_sources` makes them from what a user has.

>>> import labserve                                                 # doctest: +SKIP
>>> [src] = labserve.method_sources(runner)          # or a URL, a Server, a RayApp
>>> src.configure(max_batch_size=64); src.view().snapshot.served
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from labserve.base.errors import RemoteError
from labserve.config.batching import BatchingConfig
from labserve.load.generator import LoadRun, start_load
from labserve.metrics.snapshot import Snapshot, snapshot_from_dict
from labserve.runtime.runner import Runner, RunnerMethod
from labserve.server import Server

__all__ = [
    "HttpMethodBase",
    "HttpSource",
    "MethodSource",
    "RunnerMethodBase",
    "RunnerSource",
    "SourceView",
    "base_url",
    "example_from_spec",
    "is_generative_config",
    "method_sources",
    "request_json",
    "snapshot_from_dict",
]


@dataclass(frozen=True)
class SourceView:
    """One look at a method: its snapshot, the config asked for, and each replica's own."""

    snapshot: Snapshot
    """The method's snapshot (merged over replicas when it has several)."""
    config: BatchingConfig
    """The config asked for: a live change shows here at once, in the snapshot at the next
    batch boundary (an idle method has none)."""
    replicas: Mapping[str, Snapshot] = field(default_factory=dict)
    """Each replica's own snapshot, by replica id (empty for a method in one process)."""
    stale: frozenset[str] = frozenset()
    """Replicas that stopped reporting (killed, scaled down): their counts stay in the merge."""


@runtime_checkable
class MethodSource(Protocol):
    """A batchable method to watch and tune, wherever it runs. Every method is thread-safe.

    ``name`` is ``"runner.method"``; ``resettable`` says whether :meth:`reset_stats` resets
    the method's counts (a remote server's cannot be reset from here).
    """

    name: str
    runner: str
    method: str
    resettable: bool

    @property
    def config(self) -> BatchingConfig:
        """The config asked for (what :meth:`configure` last set, here or elsewhere)."""
        ...

    @property
    def alive(self) -> bool:
        """False once the method cannot answer any more (its runner or server stopped)."""
        ...

    def configure(self, **changes: Any) -> BatchingConfig:
        """Change settings at the next batch boundary; a refusal (ConfigError) changes nothing."""
        ...

    def view(self) -> SourceView:
        """The method as it is now."""
        ...

    def reset_stats(self) -> None:
        """Start the counts over (only when ``resettable``)."""
        ...

    def example(self) -> Any:
        """One request of zeros shaped by the method's declared input, or None if unknown."""
        ...

    def start_load(self, *, example: Any = None, **kwargs: Any) -> LoadRun:
        """Start load on the method (the arguments of :func:`labserve.start_load`)."""
        ...


C = TypeVar("C")
"""A method's config type: BatchingConfig, or GenerationConfig for a generative method."""


C_co = TypeVar("C_co", covariant=True)


class _Served(Protocol[C_co]):
    """What an in-process source needs of a served method (either kind)."""

    name: str
    runner: Any

    @property
    def config(self) -> C_co: ...

    def configure(self, **changes: Any) -> C_co: ...

    def reset_stats(self) -> None: ...


class RunnerMethodBase(Generic[C]):
    """A method of a runner in this process, watched as a source: what both kinds share.

    ``server``: the server it is watched through, if any (the source ends with it).
    Thread-safe: the runner's doors are. Subclasses add the view and the load of their kind.
    """

    resettable = True

    def __init__(self, method: _Served[C], server: Server | None = None) -> None:
        self._served = method
        self.server = server
        self.runner: str = method.runner.name
        self.method: str = method.name
        self.name = f"{self.runner}.{self.method}"

    @property
    def config(self) -> C:
        """The config asked for (in force from the next batch, or step)."""
        return self._served.config

    @property
    def alive(self) -> bool:
        """False once the runner (or the server it is watched through) stopped."""
        if self.server is not None and not self.server.running:
            return False
        return not self._served.runner.stopped

    def configure(self, **changes: Any) -> C:
        """``runner.configure(method, **changes)``."""
        return self._served.configure(**changes)

    def reset_stats(self) -> None:
        """Start the method's counts over."""
        self._served.reset_stats()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class RunnerSource(RunnerMethodBase[BatchingConfig]):
    """A runner method in this process (``labserve.Runner``), as a :class:`MethodSource`."""

    def __init__(self, method: RunnerMethod, server: Server | None = None) -> None:
        if not method.batchable:
            raise TypeError(f"{method!r} is not batchable: there is no batching to watch")
        super().__init__(method, server)
        self.runner_method = method

    def view(self) -> SourceView:
        """The runner method's snapshot and the config asked for."""
        return SourceView(snapshot=self.runner_method.stats(), config=self.runner_method.config)

    def example(self) -> Any:
        """Zeros shaped by the method's ``input_spec``, or None if it declares none."""
        return example_from_spec(self.runner_method)

    def start_load(self, *, example: Any = None, **kwargs: Any) -> LoadRun:
        """:func:`labserve.start_load` on the method itself (in-process calls)."""
        return start_load(self.runner_method, example=example, **kwargs)


def example_from_spec(method: RunnerMethod) -> Any:
    """One request of zeros shaped by the method's ``input_spec``, or None if it has none."""
    specs = method.spec.input_spec
    if not specs or len(specs) != 1 or any(d == -1 for d in specs[0].shape):
        return None
    shape = list(specs[0].shape)
    batch_dim = method.spec.batch_dim
    shape.insert(batch_dim if isinstance(batch_dim, int) else batch_dim[0], 1)
    return np.zeros(shape, dtype=specs[0].dtype)


class HttpMethodBase(Generic[C]):
    """A method of a labserve server by its URL, watched as a source: what both kinds share.

    Reads ``GET /config``; changes through ``PATCH /config`` (needs the server's ``token``).
    Its counts cannot be reset from here (``resettable`` is False). Thread-safe: each call
    is its own HTTP request (blocking, up to ``timeout_s``). Subclasses say which kind of
    method they read (``kind``) and how its config entry becomes a config (``_make_config``).
    """

    resettable = False
    kind = "batchable"

    def __init__(
        self,
        url: str,
        runner: str,
        method: str,
        *,
        token: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.url = base_url(url)
        self.runner = runner
        self.method = method
        self.name = f"{runner}.{method}"
        self.token = token
        self.timeout_s = timeout_s

    @property
    def config(self) -> C:
        """The config asked for (``GET /config``)."""
        return self._config_of(self._get("/config"))

    @property
    def alive(self) -> bool:
        """Always True: a server that stopped answering shows as an error, not as the end."""
        return True

    def _get(self, path: str) -> Any:
        return request_json(self.url, path, token=self.token, timeout_s=self.timeout_s)

    def _make_config(self, entry: Mapping[str, Any]) -> C:
        raise NotImplementedError

    def _missing(self, path: str) -> RemoteError:
        return RemoteError(
            f"{self.url}{path}", None, "NotFoundError", f"no {self.kind} method {self.name}"
        )

    def _config_of(self, configs: Any) -> C:
        try:
            return self._make_config(configs[self.runner][self.method])
        except (KeyError, TypeError, AttributeError) as exc:
            raise self._missing("/config") from exc

    def _entry(self, stats: Any) -> Any:
        """This method's entry of ``GET /stats``."""
        try:
            return stats[self.runner][self.method]
        except (KeyError, TypeError):
            raise self._missing("/stats") from None

    def configure(self, **changes: Any) -> C:
        """``PATCH /config`` with the token; the server's refusal comes back as RemoteError."""
        body = {"runner": self.runner, "method": self.method, **changes}
        configs = request_json(
            self.url, "/config", body=body, token=self.token, timeout_s=self.timeout_s
        )
        return self._config_of(configs)

    def reset_stats(self) -> None:
        """Not over HTTP: a server's counts are its own."""
        raise TypeError(f"{self.url} has no route to reset its counts: restart it, or clear a view")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} at {self.url}>"


class HttpSource(HttpMethodBase[BatchingConfig]):
    """A batchable method of a labserve server (in a kernel, a shell, or on Ray) by its URL.

    Reads ``GET /stats`` and ``GET /config``; load goes to its simple route through the
    HTTP load generator. Behind Ray's proxy, ``/stats`` holds every replica's own view,
    and :meth:`view` shows it. See :class:`HttpMethodBase`.
    """

    def _make_config(self, entry: Mapping[str, Any]) -> BatchingConfig:
        return BatchingConfig(**entry)

    def view(self) -> SourceView:
        """``GET /stats`` and ``GET /config``: the snapshot, the config asked, each replica's."""
        stats = self._get("/stats")
        config = self.config
        snap = snapshot_from_dict(self._entry(stats))
        replicas: dict[str, Snapshot] = {}
        stale = set()
        for rid, rview in dict(stats.get("replicas") or {}).items():
            own = (rview.get(self.runner) or {}).get(self.method)
            if own is not None:
                replicas[rid] = snapshot_from_dict(own)
                if rview.get("stale"):
                    stale.add(rid)
        return SourceView(snap, config, replicas, frozenset(stale))

    def example(self) -> Any:
        """None: a URL does not say what its method takes (pass an example)."""
        return None

    def start_load(self, *, example: Any = None, **kwargs: Any) -> LoadRun:
        """The HTTP load generator on ``/runners/{runner}/{method}`` (with the token)."""
        route = f"{self.url}/runners/{_quote(self.runner)}/{_quote(self.method)}"
        kwargs.setdefault("token", self.token)
        return start_load(route, example=example, **kwargs)


def is_generative_config(config: Any) -> bool:
    """Whether a ``GET /config`` entry is a generative method's (its knobs are vLLM's)."""
    return isinstance(config, dict) and "max_num_seqs" in config


def method_sources(target: Any, *, token: str | None = None, **options: Any) -> list[MethodSource]:
    """The batchable methods of ``target`` as sources, one per method, in its order.

    ``target``: a Runner, a RunnerMethod, a list of Runners, a Server (its runners, in
    process), a URL of a labserve server or of Ray's proxy in front of a labserve
    application (``token`` for changes), a MethodSource or a list of them, or anything
    with a ``method_sources(**options)`` method (``labserve.ray.RayApp``).

    Raises:
        TypeError: ``target`` is none of these.
        ValueError: it has no batchable method.
        RemoteError: the URL did not answer ``GET /config``.
    """
    sources: list[MethodSource]
    if isinstance(target, str):
        base = base_url(target)
        configs = request_json(base, "/config", token=token, timeout_s=5.0)
        sources = [
            HttpSource(base, runner, method, token=token)
            for runner, methods in configs.items()
            for method, config in methods.items()
            if not is_generative_config(config)
        ]
    elif isinstance(target, MethodSource):
        sources = [target]
    elif isinstance(target, Server):
        sources = [
            RunnerSource(m, server=target)
            for r in target.runners.values()
            for m in r.methods.values()
            if m.batchable
        ]
    elif isinstance(target, RunnerMethod):
        sources = [RunnerSource(target)]
    elif isinstance(target, Runner):
        sources = [RunnerSource(m) for m in target.methods.values() if m.batchable]
    elif callable(getattr(target, "method_sources", None)):
        sources = list(target.method_sources(**options))
    elif isinstance(target, (list, tuple)) and target:
        sources = [s for item in target for s in _one_or_many(item)]
    else:
        raise TypeError(
            "a source needs a Runner, a RunnerMethod, a Server, a URL, a RayApp, a "
            f"MethodSource or a list of them, got {type(target).__name__}"
        )
    if not sources:
        raise ValueError(f"no batchable method to watch in {target!r}")
    return sources


def _one_or_many(item: Any) -> list[MethodSource]:
    if isinstance(item, (list, tuple)):
        raise TypeError("a list of sources holds Runners or MethodSources, not lists")
    return method_sources(item)


def base_url(url: str) -> str:
    """``url`` without a trailing slash; ValueError unless it looks like http(s)://host:port."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"a server URL must look like http://host:port, got {url!r}")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def request_json(
    base: str,
    path: str,
    *,
    body: Mapping[str, Any] | None = None,
    token: str | None,
    timeout_s: float,
) -> Any:
    """One JSON request to a labserve server; its error reply (or none) as RemoteError."""
    url = base + path
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(
        url, data=data, headers=headers, method="PATCH" if body is not None else "GET"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raise _remote_error(url, exc) from None
    except (OSError, ValueError) as exc:  # refused, timed out, not JSON
        raise RemoteError(url, None, type(exc).__name__, str(exc)) from None


def _remote_error(url: str, exc: urllib.error.HTTPError) -> RemoteError:
    try:
        reply = json.loads(exc.read())
        kind, detail = str(reply["error"]), str(reply["detail"])
    except (ValueError, KeyError, TypeError, OSError):
        kind, detail = "HTTPError", str(exc.reason)
    finally:
        exc.close()
    return RemoteError(url, exc.code, kind.split(":")[0], detail)
