"""A Ray application's batchable method as a snapshot source, for a dashboard or a script.

Merged snapshots over the replicas (from the application's stats board), each replica's
own, live changes that reach every replica, a reset of every replica's counts, and load
through Ray's proxy (the HTTP load generator on the simple route).
"""

from __future__ import annotations

import time
import urllib.parse
from typing import Any, Protocol

from labserve.config.batching import BatchingConfig
from labserve.config.generation import GenerationConfig
from labserve.lab.sources import SourceView
from labserve.load.generator import LoadRun, start_load
from labserve.metrics.snapshot import Snapshot
from labserve.ray.stats import merge_snapshots

__all__ = ["RaySource"]


class _App(Protocol):
    """What a source needs of a RayApp (which makes its sources)."""

    runner: str
    token: str

    @property
    def stopped(self) -> bool: ...

    def configs(self) -> dict[str, BatchingConfig]: ...

    def configure(self, method: str, **changes: Any) -> BatchingConfig | GenerationConfig: ...

    def reset_stats(self) -> None: ...

    def watch(
        self,
    ) -> tuple[dict[str, BatchingConfig], dict[str, dict[str, Snapshot]], set[str]]: ...


class RaySource:
    """One batchable method of a :class:`~labserve.ray.RayApp`, as a ``labserve.MethodSource``.

    Thread-safe: each call is a call to Ray (the application's stats board) or a load run.
    """

    resettable = True
    wait_s = 2.0
    """How long :meth:`view` waits for a first report."""

    def __init__(self, app: _App, method: str, proxy_url: str) -> None:
        self.app = app
        self.runner = app.runner
        self.method = method
        self.name = f"{app.runner}.{method}"
        self.proxy_url = proxy_url.rstrip("/")

    @property
    def config(self) -> BatchingConfig:
        """The config deployed (every replica's at its next batch boundary)."""
        return self.app.configs()[self.method]

    @property
    def alive(self) -> bool:
        """False once the application was stopped."""
        return not self.app.stopped

    def configure(self, **changes: Any) -> BatchingConfig:
        """Change the method's settings on every replica, live (``RayApp.configure``)."""
        config = self.app.configure(self.method, **changes)
        assert isinstance(config, BatchingConfig)  # a source is made for a batchable method
        return config

    def view(self) -> SourceView:
        """The merged snapshot, the config deployed, each replica's own and the stale ones.

        Right after a deploy or a reset no replica may have reported yet: it waits for the
        first report (they come every 0.25 s), and raises LookupError after ``wait_s``.
        """
        deadline = time.monotonic() + self.wait_s
        while True:
            configs, by_method, stale = self.app.watch()
            replicas = by_method.get(self.method, {})
            if replicas:
                break
            if time.monotonic() > deadline:
                raise LookupError(f"no replica of {self.name} has reported yet")
            time.sleep(0.05)
        merged = merge_snapshots([replicas[r] for r in sorted(replicas)])
        return SourceView(merged, configs[self.method], dict(sorted(replicas.items())),
                          frozenset(stale) & frozenset(replicas))  # fmt: skip

    def reset_stats(self) -> None:
        """Start every replica's counts over (``RayApp.reset_stats``)."""
        self.app.reset_stats()

    def example(self) -> Any:
        """None: pass an example request."""
        return None

    def start_load(self, *, example: Any = None, **kwargs: Any) -> LoadRun:
        """The HTTP load generator through Ray's proxy (``/runners/{runner}/{method}``)."""
        route = (
            f"{self.proxy_url}/runners/{urllib.parse.quote(self.runner, safe='')}/"
            f"{urllib.parse.quote(self.method, safe='')}"
        )
        kwargs.setdefault("token", self.app.token)
        return start_load(route, example=example, **kwargs)

    def __repr__(self) -> str:
        return f"<RaySource {self.name} via {self.proxy_url}>"
