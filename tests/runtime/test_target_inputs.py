"""What the driver feeds a latency target, on virtual time: costs, the fit's timing, latencies.

The adaptive strategy with a target plans from three inputs the driver hands the queue: each
batch's duration (its cost model's input), when that fit is updated against the next
decision, and each answered batch's oldest latency (the budget's feedback). Issue 31 moved all
three into new parts (``tally``, ``occupancy``, ``overload``, ``Workers``, ``Delivery``), and
the target's p99 was the one figure that moved after it; these tests pin what each input is,
through the real ``MethodDriver`` on a ``VirtualHost``, so a reordering shows as a failure,
not as a percent of p99 on a quiet machine.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import numpy as np
import pytest

from labserve.batching.budget import STEP
from labserve.batching.containers import Codec
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig
from labserve.runtime.driver import MethodDriver
from labserve.runtime.virtual import Parked, VirtualHost

TARGET_MS = 15.0
ROW = np.zeros((1, 4), dtype=np.float32)


@pytest.fixture
def rig() -> tuple[VirtualHost, MethodDriver]:
    """A target15 driver (batchbench's caps) on virtual time, its model parked per call."""
    host = VirtualHost()
    config = BatchingConfig(
        strategy="adaptive", max_batch_size=64, max_latency_ms=20, latency_slo_ms=TARGET_MS
    )
    queue = BatchQueue("predict", Codec("predict"), config, runner="bench")
    return host, MethodDriver(queue, host.park, is_async=False, scheduler=host)


def _send(host: VirtualHost, driver: MethodDriver) -> concurrent.futures.Future[Any]:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    driver.submit(driver.queue.new_request((ROW,), future))
    host.settle()
    return future


def _finish(host: VirtualHost, after_s: float) -> None:
    """Let the one running model call take ``after_s`` more virtual seconds, then return."""
    host.advance(after_s)
    (call,) = host.parked
    _return(host, call)


def _return(host: VirtualHost, call: Parked) -> None:
    host.release(call, value=call.args[0] * 2)


def test_the_cost_model_is_fed_each_batchs_model_time(rig):
    """From its fire to its release, whether the loop or a worker fired it."""
    host, driver = rig
    _send(host, driver)  # fired by the loop's pump
    host.advance(0.001)
    _send(host, driver)  # queued behind it: fired by the worker that frees the slot
    _finish(host, 0.003)
    _finish(host, 0.005)
    _, durations = driver.queue.cost_model.observations()
    assert durations == pytest.approx([0.004, 0.005], abs=1e-12)
    assert not host.errors


def test_a_worker_decides_with_the_fit_of_the_batch_it_just_ran(rig):
    """The fourth batch's release readies the fit before the same worker decides.

    With four batches seen the target can plan: two requests queued behind the fourth
    are held (the timer fires them later), not fired at once as before the fit.
    """
    host, driver = rig
    for _ in range(3):
        _send(host, driver)
        _finish(host, 0.003)
    assert driver.queue.cost_model.fit.samples == 3
    _send(host, driver)
    host.advance(0.001)
    _send(host, driver)
    _send(host, driver)
    _finish(host, 0.002)
    assert driver.queue.cost_model.fit.ready
    assert host.parked == [], "fired at once: the decision did not see the fourth batch"
    host.advance(TARGET_MS / 1000)  # the hold ends within the target
    (held,) = host.parked
    assert len(held.args[0]) == 2
    assert not host.errors


def test_the_budget_hears_the_oldest_requests_latency_from_its_admission(rig):
    """A request that waited 10 ms behind a batch, then ran 6 ms, missed the 15 ms target.

    Its own batch took 6 ms: a latency taken from the batch's start would count a hit.
    """
    host, driver = rig
    _send(host, driver)  # runs 10 ms: a hit (10 ms)
    host.advance(0.0005)
    second = _send(host, driver)
    _finish(host, 0.0095)
    assert driver.snapshot().latency_budget_ms == TARGET_MS  # a hit at the target: no change
    _finish(host, 0.006)  # answered 15.5 ms after its admission
    assert second.done()
    miss_allowed = (100.0 - driver.queue.config.slo_percentile) / 200.0
    missed = TARGET_MS - STEP * TARGET_MS * (1.0 - miss_allowed)
    assert driver.snapshot().latency_budget_ms == pytest.approx(missed)
    assert not host.errors
