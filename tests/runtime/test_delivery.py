"""A batch is recorded before its callers are answered: a snapshot shows every answered batch.

Each caller's future carries a done-callback that takes a snapshot at the very moment the
caller is answered (a concurrent future runs its callbacks inside ``set_result``, on the
answering thread), so the order is checked exactly, whatever the machine's speed. The
synchronous model runs on a VirtualHost; the ``async def`` model on a real asyncio loop
that the test runs itself (VirtualHost has none), in one thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from labserve.base.errors import ModelError
from labserve.batching.containers import Codec
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig
from labserve.runtime.driver import MethodDriver
from labserve.runtime.scheduling import Cancellable
from labserve.runtime.virtual import VirtualHost

N = 4  # callers, one batch: fixed fires when full


def _queue() -> BatchQueue:
    config = BatchingConfig(strategy="fixed", max_batch_size=N, max_latency_ms=5000)
    return BatchQueue("predict", Codec("predict"), config, runner="m")


def _callers(driver: MethodDriver) -> tuple[list[concurrent.futures.Future[Any]], list[int]]:
    """N callers, each noting how many batches a snapshot shows when it is answered."""
    futures: list[concurrent.futures.Future[Any]] = []
    seen: list[int] = []
    for i in range(N):
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.add_done_callback(lambda _: seen.append(driver.snapshot().batches))
        driver.submit(driver.queue.new_request((np.full((1, 2), float(i)),), future))
        futures.append(future)
    return futures, seen


class _AsyncioHost:
    """The Host protocol on the test's own running loop (an async model needs one)."""

    closing = False

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.now = loop.time

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        self.loop.call_soon(fn, *args)

    def call_soon_threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Cancellable:
        return self.loop.call_later(delay_s, fn)

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        raise AssertionError("an async model runs on the loop, not in a worker")


@pytest.mark.parametrize("fails", [False, True], ids=["served", "model_error"])
def test_a_sync_batch_is_recorded_before_any_of_its_callers_is_answered(fails):
    sched = VirtualHost()
    driver = MethodDriver(_queue(), sched.park, is_async=False, scheduler=sched)
    futures, seen = _callers(driver)
    sched.settle()
    (call,) = sched.parked
    if fails:
        sched.release(call, error=ValueError("weights not loaded"))
    else:
        sched.release(call, value=call.args[0] * 2)
    assert all(f.done() for f in futures) and not sched.errors
    assert seen == [1] * N
    if fails:
        assert all(isinstance(f.exception(), ModelError) for f in futures)


@pytest.mark.parametrize("fails", [False, True], ids=["served", "model_error"])
def test_an_async_batch_is_recorded_before_any_of_its_callers_is_answered(fails):
    async def model(x: np.ndarray) -> np.ndarray:
        await asyncio.sleep(0)
        if fails:
            raise ValueError("weights not loaded")
        return x * 2

    async def main() -> tuple[list[concurrent.futures.Future[Any]], list[int]]:
        host = _AsyncioHost(asyncio.get_running_loop())
        driver = MethodDriver(_queue(), model, is_async=True, scheduler=host)
        futures, seen = _callers(driver)
        last = asyncio.wrap_future(futures[-1])
        await asyncio.wait([last])
        last.exception()  # retrieved here; the callers' errors are checked below
        await driver.aclose()
        return futures, seen

    futures, seen = asyncio.run(main())
    assert seen == [1] * N  # before the fix: [0, 0, 0, 0], the batch recorded after
    if fails:
        assert all(isinstance(f.exception(), ModelError) for f in futures)
    else:
        assert [f.result()[0, 0] for f in futures] == [0.0, 2.0, 4.0, 6.0]
