"""labserve's pytest plugin: runners and servers built in a test, stopped after it.

Installed with labserve (entry point ``pytest11``), so the fixtures are there in any
test suite of an environment that has labserve; nothing else changes in pytest's behaviour.

>>> def test_served(labserve_serve, labserve_runner):  # doctest: +SKIP
...     server = labserve_serve(labserve_runner(Scorer, name="scorer"))
...     urllib.request.urlopen(server.url + "/healthz")
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from labserve.runtime.runnable import Runnable
    from labserve.runtime.runner import Runner
    from labserve.server.serve import Server

__all__ = ["labserve_runner", "labserve_serve"]

# labserve is imported inside the fixtures, not here: pytest loads plugins before it
# collects, and a coverage tool would miss every line labserve ran at import time.


@pytest.fixture
def labserve_runner() -> Iterator[Callable[..., Runner]]:
    """A factory with ``labserve.Runner``'s arguments; every runner is stopped after the test."""
    from labserve.runtime.runner import Runner

    runners: list[Runner] = []

    def make(runnable: type[Runnable] | Runnable, **kwargs: Any) -> Runner:
        runner = Runner(runnable, **kwargs)
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.stop(timeout=10)


@pytest.fixture
def labserve_serve(
    labserve_runner: Callable[..., Runner],
) -> Iterator[Callable[..., Server]]:
    """A factory: serve runners on a free loopback port; returns the listening Server.

    Takes a Runner, several Runners, or a Runnable class or instance (served by a new
    runner with default settings); keyword arguments go to ``labserve.Server`` (``port``
    defaults to 0, a free port). Every server is stopped after the test, before its runners.
    """
    from labserve.runtime.runnable import Runnable
    from labserve.server.serve import Server

    servers: list[Server] = []

    def serve(
        target: Runner | Iterable[Runner] | type[Runnable] | Runnable, **kwargs: Any
    ) -> Server:
        if isinstance(target, Runnable) or (
            isinstance(target, type) and issubclass(target, Runnable)
        ):
            target = labserve_runner(target)
        server = Server(target, **kwargs)
        servers.append(server)
        return server.start()

    yield serve
    for server in servers:
        server.stop()
