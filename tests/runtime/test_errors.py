"""Errors on the real runtime: model failures, bad outputs, cancellation, overload, accounting."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import numpy as np
import pytest

import labserve


def row(i: float, width: int = 4) -> np.ndarray:
    return np.full((1, width), float(i))


def full_batches(cap: int) -> dict[str, Any]:
    """Settings under which ``cap`` requests sent together run as one batch."""
    return {
        "strategy": "fixed",
        "max_batch_size": cap,
        "max_latency_ms": 5000,
        "on_overload": "wait",
    }


class Broken(labserve.Runnable):
    @labserve.method(batchable=True)
    def predict(self, x: np.ndarray) -> np.ndarray:
        raise ValueError("weights not loaded")

    @labserve.method(batchable=True)
    async def apredict(self, x: np.ndarray) -> np.ndarray:
        await asyncio.sleep(0)
        raise ValueError("weights not loaded")


@pytest.mark.parametrize("method", ["predict", "apredict"])
def test_model_exception_fails_every_request_of_the_batch_with_model_error(make_runner, method):
    n = 12
    runner = make_runner(Broken, **full_batches(n))

    async def main() -> list[Any]:
        calls = (getattr(runner, method).async_run(row(i)) for i in range(n))
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(main())

    for err in results:
        assert isinstance(err, labserve.ModelError)
        assert "ValueError: weights not loaded" in str(err)
        assert isinstance(err.__cause__, ValueError)
        assert err.batch_requests == n
        assert err.status == 500
    snap = runner.stats(method)
    assert snap.batches == 1
    assert snap.failed == n
    assert snap.pending == 0


class NanHater(labserve.Runnable):
    def __init__(self) -> None:
        self.poisoned_batches: list[int] = []

    @labserve.method(batchable=True)
    def predict(self, x: np.ndarray) -> np.ndarray:
        if np.isnan(x).any():
            self.poisoned_batches.append(len(x))
            raise FloatingPointError("NaN in input")
        return x * 2

    @labserve.method(batchable=True)
    async def apredict(self, x: np.ndarray) -> np.ndarray:
        await asyncio.sleep(0)
        return self.predict(x)


@pytest.mark.parametrize("method", ["predict", "apredict"])
def test_isolate_errors_fails_only_the_poisoned_request(make_runner, method):
    n, poisoned = 24, 17
    runner = make_runner(NanHater, isolate_errors=True, **full_batches(n))

    async def main() -> list[Any]:
        calls = (
            getattr(runner, method).async_run(row(np.nan if i == poisoned else i)) for i in range(n)
        )
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(main())

    err = results.pop(poisoned)
    assert isinstance(err, labserve.ModelError)
    assert "NaN in input" in str(err)
    assert err.batch_requests == 1
    for i, y in enumerate(j for j in range(n) if j != poisoned):
        np.testing.assert_array_equal(results[i], row(2 * y))
    assert runner.instance.poisoned_batches[0] == n, "the poisoned request was batched with all"
    assert runner.instance.poisoned_batches[-1] == 1
    snap = runner.stats(method)
    assert (snap.served, snap.failed, snap.pending) == (n - 1, 1, 0)


def test_without_isolate_errors_the_poisoned_request_fails_its_whole_batch(make_runner):
    n = 8
    runner = make_runner(NanHater, **full_batches(n))

    async def main() -> list[Any]:
        calls = (runner.predict.async_run(row(np.nan if i == 3 else i)) for i in range(n))
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(main())

    assert all(isinstance(r, labserve.ModelError) for r in results)
    assert runner.instance.poisoned_batches == [n]


class RowDropper(labserve.Runnable):
    @labserve.method(batchable=True)
    def predict(self, x: np.ndarray) -> np.ndarray:
        return x[:1]

    @labserve.method(batchable=True)
    async def apredict(self, x: np.ndarray) -> np.ndarray:
        return x[:1]


@pytest.mark.parametrize("method", ["predict", "apredict"])
def test_wrong_number_of_rows_gives_every_caller_batch_size_mismatch(make_runner, method):
    n = 8
    runner = make_runner(RowDropper, isolate_errors=True, **full_batches(n))

    async def main() -> list[Any]:
        calls = (getattr(runner, method).async_run(row(i)) for i in range(n))
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(main())

    for err in results:
        assert isinstance(err, labserve.BatchSizeMismatchError)
        assert (err.sent_items, err.returned_items) == (n, 1)
        assert f"given {n} items" in str(err)
        assert "returned 1" in str(err)
    snap = runner.stats(method)
    assert (snap.failed, snap.pending) == (n, 0)


class Gated(labserve.Runnable):
    """A model whose first call blocks until the test opens ``gate``; it records every row."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.rows: list[float] = []

    @labserve.method(batchable=True, strategy="greedy", on_overload="wait")
    def predict(self, x: np.ndarray) -> np.ndarray:
        self.started.set()
        if not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        self.rows.extend(x[:, 0].tolist())
        return x * 2


@pytest.fixture
def gated(make_runner):
    """A runner over a Gated model; the gate is opened at teardown so nothing stays stuck."""
    model = Gated()
    runner = make_runner(model)
    yield runner, model
    model.gate.set()


def test_cancelled_async_run_is_withdrawn_and_others_are_unaffected(gated, wait_until):
    runner, model = gated

    async def main() -> None:
        first = asyncio.create_task(runner.predict.async_run(row(1)))
        await asyncio.to_thread(model.started.wait, 10)
        doomed = asyncio.create_task(runner.predict.async_run(row(2)))
        other = asyncio.create_task(runner.predict.async_run(row(3)))
        await wait_until(lambda: runner.stats("predict").queue_requests == 2)

        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        await wait_until(lambda: runner.stats("predict").cancelled == 1)
        assert runner.stats("predict").queue_requests == 1
        model.gate.set()

        np.testing.assert_array_equal(await first, row(2))
        np.testing.assert_array_equal(await other, row(6))

    asyncio.run(main())

    assert 2.0 not in model.rows, "the withdrawn request never reached the model"
    snap = runner.stats("predict")
    assert (snap.served, snap.cancelled, snap.pending) == (2, 1, 0)


def test_cancelled_async_run_on_labserves_loop_is_withdrawn(gated, wait_until):
    runner, model = gated

    async def main() -> None:
        first = asyncio.create_task(runner.predict.async_run(row(1)))
        await asyncio.to_thread(model.started.wait, 10)
        doomed = asyncio.create_task(runner.predict.async_run(row(2)))
        other = asyncio.create_task(runner.predict.async_run(row(3)))
        await asyncio.sleep(0)  # both have arrived: they are admitted together, next iteration
        await asyncio.sleep(0)
        assert runner.predict.stats().queue_requests == 2

        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        assert runner.predict.stats().cancelled == 1
        model.gate.set()
        np.testing.assert_array_equal(await first, row(2))
        np.testing.assert_array_equal(await other, row(6))

    labserve.background_loop().run(main())

    assert 2.0 not in model.rows
    snap = runner.stats("predict")
    assert (snap.served, snap.cancelled, snap.pending) == (2, 1, 0)


def test_request_withdrawn_before_its_admission_is_cancelled_and_never_runs(gated):
    runner, model = gated

    async def main() -> None:
        first = asyncio.create_task(runner.predict.async_run(row(1)))
        await asyncio.to_thread(model.started.wait, 10)
        request, doomed = runner.predict.submit_on_loop((row(2),))
        runner.predict.withdraw_on_loop(request)  # same loop step: not admitted yet
        assert runner.predict.stats().cancelled == 1
        runner.predict.withdraw_on_loop(request)  # a second withdrawal changes nothing
        _, other = runner.predict.submit_on_loop((row(3),))
        model.gate.set()
        np.testing.assert_array_equal(await first, row(2))
        np.testing.assert_array_equal(await other, row(6))
        # Its caller gave up without cancelling the future: whoever still listens hears why.
        assert isinstance(doomed.exception(), labserve.CancelledRequestError)

    labserve.background_loop().run(main())

    assert 2.0 not in model.rows
    snap = runner.stats("predict")
    assert (snap.served, snap.cancelled, snap.pending) == (2, 1, 0)


def test_caller_cancelled_while_its_batch_runs_gets_no_result(gated, wait_until):
    runner, model = gated

    async def main() -> None:
        running = asyncio.create_task(runner.predict.async_run(row(1)))
        await asyncio.to_thread(model.started.wait, 10)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await wait_until(lambda: runner.stats("predict").cancelled == 1)
        model.gate.set()
        np.testing.assert_array_equal(await runner.predict.async_run(row(4)), row(8))

    asyncio.run(main())

    snap = runner.stats("predict")
    assert (snap.served, snap.cancelled, snap.pending) == (1, 1, 0)
    assert snap.batches == 2


class Slow(labserve.Runnable):
    @labserve.method(batchable=True)
    def predict(self, x: np.ndarray) -> np.ndarray:
        time.sleep(0.02)
        return x * 2


def test_overload_rejects_some_requests_with_503_and_serves_the_rest(make_runner):
    runner = make_runner(
        Slow, strategy="greedy", max_batch_size=4, max_latency_ms=5, on_overload="reject"
    )
    n = 100

    async def main() -> list[Any]:
        calls = (runner.predict.async_run(row(i)) for i in range(n))
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(main())

    served = [(i, y) for i, y in enumerate(results) if isinstance(y, np.ndarray)]
    rejected = [e for e in results if isinstance(e, labserve.OverloadError)]
    assert len(served) + len(rejected) == n, "every outcome is a result or an OverloadError"
    assert served and rejected
    for i, y in served:
        np.testing.assert_array_equal(y, row(2 * i))
    for err in rejected:
        assert err.status == 503
        assert err.retry_after_s > 0
        assert err.waited_ms >= err.max_latency_ms == 5
        assert 'on_overload="wait"' in str(err)
    snap = runner.stats("predict")
    assert (snap.served, snap.rejected, snap.pending) == (len(served), len(rejected), 0)


def test_max_queue_size_refuses_requests_with_queue_full_error(make_runner, wait_until):
    model = Gated()
    runner = make_runner(model, max_queue_size=3)

    async def main() -> list[Any]:
        first = asyncio.create_task(runner.predict.async_run(row(0)))
        await asyncio.to_thread(model.started.wait, 10)
        rest = [asyncio.create_task(runner.predict.async_run(row(i))) for i in range(1, 7)]
        await wait_until(lambda: sum(t.done() for t in rest) == 3)
        model.gate.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        model.gate.set()

    refused = [e for e in results if isinstance(e, labserve.QueueFullError)]
    assert len(refused) == 3
    assert all(e.status == 503 and e.max_queue_size == 3 for e in refused)
    assert "max_queue_size=3" in str(refused[0])
    for i, y in enumerate(results[:4]):
        np.testing.assert_array_equal(y, row(2 * i))
    snap = runner.stats("predict")
    assert (snap.admitted, snap.served, snap.refused, snap.pending) == (4, 4, 3, 0)


class Flaky(labserve.Runnable):
    """Slow enough to overload, and fails any batch holding a NaN."""

    @labserve.method(batchable=True)
    def predict(self, x: np.ndarray) -> np.ndarray:
        time.sleep(0.001)
        if np.isnan(x).any():
            raise FloatingPointError("NaN in input")
        return x * 2


def test_every_admitted_request_gets_exactly_one_outcome(make_runner):
    runner = make_runner(
        Flaky, strategy="adaptive", max_batch_size=16, max_latency_ms=4, max_queue_size=40
    )
    n = 1500
    rng = random.Random(7)

    async def main() -> list[Any]:
        tasks: list[asyncio.Task[Any]] = []
        for _burst in range(n // 100):
            burst = [
                asyncio.create_task(
                    runner.predict.async_run(row(np.nan if rng.random() < 0.02 else i))
                )
                for i in range(len(tasks), len(tasks) + 100)
            ]
            tasks += burst
            await asyncio.sleep(0)  # each task of the burst has submitted its request
            for task in rng.sample(burst, 10):
                task.cancel()
            await asyncio.sleep(0.005)  # bursts, so the queue fills and drains
        # A lost request would hang gather: fail instead (a safety net, not a timing claim).
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)

    results = asyncio.run(main())

    kinds = {"result": 0, "overload": 0, "model": 0, "full": 0, "cancelled": 0}
    for r in results:
        if isinstance(r, np.ndarray):
            kinds["result"] += 1
        elif isinstance(r, labserve.OverloadError):
            kinds["overload"] += 1
        elif isinstance(r, labserve.ModelError):
            kinds["model"] += 1
        elif isinstance(r, labserve.QueueFullError):
            kinds["full"] += 1
        elif isinstance(r, asyncio.CancelledError):
            kinds["cancelled"] += 1
        else:
            pytest.fail(f"unexpected outcome {r!r}")
    snap = runner.stats("predict")
    assert snap.pending == 0
    assert snap.queue_requests == snap.in_flight_batches == 0
    assert snap.admitted == snap.served + snap.rejected + snap.failed + snap.cancelled
    assert snap.admitted + snap.refused == n
    # A caller may give up after its request got an outcome: it sees CancelledError while
    # the runner counts what really happened; withdrawn requests are counted cancelled.
    assert snap.served >= kinds["result"]
    assert snap.rejected >= kinds["overload"]
    assert snap.failed >= kinds["model"]
    assert snap.refused >= kinds["full"]
    assert 0 < snap.cancelled <= kinds["cancelled"]
    assert kinds["result"] > 0 and kinds["model"] > 0 and kinds["full"] > 0


def test_a_refused_request_whose_caller_gives_up_leaves_the_queue_intact(make_runner, wait_until):
    model = Gated()
    runner = make_runner(model, max_queue_size=1)

    async def main() -> None:
        first = asyncio.create_task(runner.predict.async_run(row(1)))
        await asyncio.to_thread(model.started.wait, 10)
        queued = asyncio.create_task(runner.predict.async_run(row(2)))
        await wait_until(lambda: runner.stats("predict").queue_requests == 1)
        refused = asyncio.create_task(runner.predict.async_run(row(3)))
        await asyncio.sleep(0)  # submitted: the full queue refuses it
        refused.cancel()  # and its caller gives up at the same moment
        with pytest.raises(asyncio.CancelledError):
            await refused
        await wait_until(lambda: runner.stats("predict").refused == 1)
        model.gate.set()
        np.testing.assert_array_equal(await first, row(2))
        # Safety net: a queue whose counts were corrupted never serves the queued request.
        np.testing.assert_array_equal(await asyncio.wait_for(queued, 10), row(4))

    try:
        asyncio.run(main())
    finally:
        model.gate.set()

    snap = runner.stats("predict")
    assert (snap.admitted, snap.refused) == (2, 1)
    assert (snap.served, snap.cancelled, snap.pending, snap.queue_requests) == (2, 0, 0, 0)
