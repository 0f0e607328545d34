"""Fixtures for the real runtime: runners on labserve's loop, stopped after each test."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import labserve


@pytest.fixture
def make_runner(
    labserve_runner: Callable[..., labserve.Runner],
) -> Callable[..., labserve.Runner]:
    """Build runners like ``labserve.Runner(...)``; every one is stopped at teardown.

    The shipped plugin's ``labserve_runner`` (labserve.testing.plugin), under this suite's name.
    """
    return labserve_runner


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event a model can block on; always opened at teardown so no worker stays stuck."""
    event = threading.Event()
    yield event
    event.set()


async def _wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            pytest.fail(f"condition not reached within {timeout_s} s")
        await asyncio.sleep(0.002)


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """``await wait_until(predicate)``: yield to the running loop until it holds.

    A safety net, not a timing claim: it fails the test instead of hanging it.
    """
    return _wait_until


def _poll_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached within {timeout_s} s")
        time.sleep(0.002)


@pytest.fixture
def poll_until() -> Callable[..., None]:
    """``poll_until(predicate)``: the blocking twin of ``wait_until``, for plain threads."""
    return _poll_until
