"""The runner on the real runtime: background loop thread, worker threads, real asyncio."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

import labserve

N_CONCURRENT = 200


def row(i: int, width: int = 4) -> np.ndarray:
    """One request: a single item whose values all equal ``i``."""
    return np.full((1, width), float(i))


class Affine(labserve.Runnable):
    """A batchable model with a row-independent transform; it records each batch it ran."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, ...]] = []
        self.threads: set[str] = set()

    @labserve.method(batchable=True, batch_dim=0, max_batch_size=32, max_latency_ms=10)
    def predict(self, x: np.ndarray) -> np.ndarray:
        self.batches.append(x.shape)
        self.threads.add(threading.current_thread().name)
        time.sleep(0.002)  # lets the next batch form while this one runs
        return x * 2 + 1


def test_concurrent_async_runs_form_batches_and_each_caller_gets_its_own_rows(make_runner):
    runner = make_runner(Affine, name="affine", on_overload="wait")

    async def main() -> list[np.ndarray]:
        calls = (runner.predict.async_run(row(i)) for i in range(N_CONCURRENT))
        return await asyncio.gather(*calls)

    results = asyncio.run(main())

    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i + 1))
    snap = runner.stats("predict")
    assert snap.served == N_CONCURRENT
    assert sum(n * count for n, count in snap.batch_size_counts.items()) == N_CONCURRENT
    assert max(snap.batch_size_counts) <= 32
    assert N_CONCURRENT / snap.batches >= 8
    assert snap.mean_batch_size >= 8
    assert snap.pending == 0


class Costly(labserve.Runnable):
    """The issue's model: 2 ms + 0.1 ms per row, with the decorator's caps only."""

    @labserve.method(batchable=True, batch_dim=0, max_batch_size=32, max_latency_ms=10)
    def predict(self, x: np.ndarray) -> np.ndarray:
        time.sleep(0.002 + 0.0001 * len(x))
        return x * 2 + 1


def test_a_burst_of_200_callers_is_served_whole_under_the_defaults(make_runner):
    # No on_overload, no max_queue_size: nobody is refused for having waited (the burst is
    # more than 10 ms of work, which the old 'reject' default refused two thirds of).
    runner = make_runner(Costly, name="costly")

    async def main() -> list[np.ndarray]:
        return await asyncio.gather(*(runner.predict.async_run(row(i)) for i in range(200)))

    results = asyncio.run(main())
    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i + 1))
    snap = runner.stats("predict")
    assert (snap.served, snap.rejected, snap.refused) == (200, 0, 0)
    assert snap.mean_batch_size >= 8


def run_with_one_odd_shape(runner: labserve.Runner) -> tuple[list[Any], Any]:
    """Send N_CONCURRENT rows and one (1, 3) request among them; (the rows' results, its own)."""
    odd_index = N_CONCURRENT // 2

    async def main() -> list[Any]:
        calls = [runner.predict.async_run(row(i)) for i in range(N_CONCURRENT)]
        calls.insert(odd_index, runner.predict.async_run(np.full((1, 3), -1.0)))
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(main())
    odd = results.pop(odd_index)
    return results, odd


def test_request_of_another_shape_runs_in_its_own_batch_without_input_spec(make_runner):
    runner = make_runner(Affine, on_overload="wait")
    results, odd = run_with_one_odd_shape(runner)

    np.testing.assert_array_equal(odd, np.full((1, 3), -1.0))
    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i + 1))
    odd_batches = [shape for shape in runner.instance.batches if shape[1:] == (3,)]
    assert odd_batches == [(1, 3)]
    assert runner.stats("predict").served == N_CONCURRENT + 1


class DeclaredAffine(labserve.Runnable):
    @labserve.method(
        batchable=True,
        max_batch_size=32,
        max_latency_ms=10,
        input_spec=labserve.TensorSpec("float64", (4,)),
    )
    def predict(self, x: np.ndarray) -> np.ndarray:
        time.sleep(0.002)
        return x * 2 + 1


def test_request_of_another_shape_fails_alone_with_input_spec(make_runner):
    runner = make_runner(DeclaredAffine, on_overload="wait")
    results, odd = run_with_one_odd_shape(runner)

    assert isinstance(odd, labserve.InputError)
    assert odd.status == 400
    assert "float64[1, 3]" in str(odd)
    assert "float64[N, 4]" in str(odd)
    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i + 1))
    snap = runner.stats("predict")
    assert snap.admitted == snap.served == N_CONCURRENT


def test_configure_mid_run_changes_the_next_batch_cap(make_runner):
    runner = make_runner(Affine, on_overload="wait")
    n = 2 * N_CONCURRENT

    async def main() -> tuple[float, list[np.ndarray]]:
        tasks = [asyncio.create_task(runner.predict.async_run(row(i))) for i in range(n)]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)  # the load is running
        config = runner.configure("predict", max_batch_size=4)
        assert config.max_batch_size == 4
        applied_at = runner.stats("predict").time_s
        return applied_at, await asyncio.gather(*tasks)

    applied_at, results = asyncio.run(main())

    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i + 1))
    snap = runner.stats("predict")
    assert snap.config.max_batch_size == 4
    assert runner.predict.config.max_batch_size == 4
    assert snap.max_batch_size_seen > 4, "batches before the change were larger"
    later = [b for b in snap.recent_batches if b.start_s > applied_at]
    assert later, "batches formed after configure() returned"
    assert max(b.items for b in later) <= 4


def test_configure_with_a_bad_value_changes_nothing(make_runner):
    runner = make_runner(Affine)
    runner.predict.run(row(1))

    with pytest.raises(labserve.ConfigError, match="max_batch_size must be an integer >= 1, got 0"):
        runner.configure("predict", max_batch_size=0)
    with pytest.raises(ValueError, match="max_latency_ms"):
        runner.configure("predict", max_batch_size=8, max_latency_ms=-1)

    assert runner.stats("predict").config.max_batch_size == 32
    assert runner.predict.config.max_batch_size == 32
    np.testing.assert_array_equal(runner.predict.run(row(3)), row(7))


def test_run_from_several_plain_threads(make_runner):
    runner = make_runner(Affine, on_overload="wait")
    n_threads, per_thread = 8, 25
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def client(t: int) -> None:
        try:
            for k in range(per_thread):
                i = t * per_thread + k
                results[i] = runner.predict.run(row(i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sorted(results) == list(range(n_threads * per_thread))
    for i, y in results.items():
        np.testing.assert_array_equal(y, row(2 * i + 1))
    snap = runner.stats("predict")
    assert snap.served == n_threads * per_thread
    assert all(name.startswith("labserve-worker") for name in runner.instance.threads)


def test_run_from_labserves_loop_thread_raises_loop_thread_error(make_runner):
    runner = make_runner(Affine)

    async def call_run_on_loop() -> Any:
        return runner.predict.run(row(1))

    with pytest.raises(labserve.LoopThreadError, match="async_run"):
        labserve.background_loop().run(call_run_on_loop())
    np.testing.assert_array_equal(runner.predict.run(row(1)), row(3))


def test_async_run_awaited_on_labserves_own_loop(make_runner):
    runner = make_runner(Affine, on_overload="wait")
    n = 50

    async def main() -> tuple[str, list[np.ndarray]]:
        results = await asyncio.gather(*(runner.predict.async_run(row(i)) for i in range(n)))
        return threading.current_thread().name, results

    thread_name, results = labserve.background_loop().run(main())

    assert thread_name == "labserve-loop"
    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i + 1))
    snap = runner.stats("predict")
    assert snap.served == n
    assert snap.batches < n, "requests queued while a batch ran were batched together"


class AsyncAffine(labserve.Runnable):
    def __init__(self) -> None:
        self.batches: list[int] = []
        self.threads: set[str] = set()

    @labserve.method(batchable=True, max_batch_size=32, max_latency_ms=10)
    async def predict(self, x: np.ndarray) -> np.ndarray:
        self.threads.add(threading.current_thread().name)
        await asyncio.sleep(0.002)
        self.batches.append(len(x))
        return x * 2 + 1


def test_async_model_methods_are_awaited_on_the_loop_and_batched(make_runner):
    runner = make_runner(AsyncAffine, on_overload="wait")
    n = 100

    async def main() -> list[np.ndarray]:
        return await asyncio.gather(*(runner.predict.async_run(row(i)) for i in range(n)))

    results = asyncio.run(main())

    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i + 1))
    np.testing.assert_array_equal(runner.predict.run(row(5)), row(11))
    assert runner.instance.threads == {"labserve-loop"}
    assert sum(runner.instance.batches) == n + 1
    assert max(runner.instance.batches) > 1
    assert runner.stats("predict").served == n + 1


class Plain(labserve.Runnable):
    @labserve.method
    def describe(self, text: str, suffix: str = "!") -> tuple[str, str]:
        return text.upper() + suffix, threading.current_thread().name

    @labserve.method(batchable=False)
    async def adescribe(self, text: str) -> tuple[str, str]:
        await asyncio.sleep(0)
        return text.upper(), threading.current_thread().name


def test_plain_sync_method_is_a_plain_call(make_runner):
    runner = make_runner(Plain)

    assert not runner.describe.batchable
    assert runner.describe.run("hi", "?") == ("HI?", threading.current_thread().name)

    async def main() -> tuple[str, str]:
        return await runner.describe.async_run("hey")

    text, thread_name = asyncio.run(main())
    assert text == "HEY!"
    assert thread_name != threading.current_thread().name  # not on the caller's loop thread
    with pytest.raises(TypeError, match="not batchable"):
        runner.configure("describe", max_batch_size=4)
    with pytest.raises(TypeError, match="not batchable"):
        runner.stats("describe")


def test_plain_async_method_is_awaited(make_runner):
    runner = make_runner(Plain)

    async def main() -> tuple[tuple[str, str], str]:
        return await runner.adescribe.async_run("hey"), threading.current_thread().name

    (text, thread_name), caller_thread = asyncio.run(main())
    assert text == "HEY"
    assert thread_name == caller_thread  # awaited on the caller's own loop

    assert runner.adescribe.run("hi") == ("HI", "labserve-loop")


class Transposed(labserve.Runnable):
    """Input items along axis 0, output items along axis 1."""

    @labserve.method(batchable=True, batch_dim=(0, 1), max_batch_size=16, max_latency_ms=10)
    def predict(self, x: np.ndarray) -> np.ndarray:
        time.sleep(0.002)
        return np.stack([x[:, 0], x.sum(axis=1)])


def test_batch_dim_pair_splits_outputs_along_the_output_axis(make_runner):
    runner = make_runner(Transposed, on_overload="wait")
    sizes = [1, 3, 1, 2, 5, 1, 4] * 5

    async def main() -> list[np.ndarray]:
        calls = (runner.predict.async_run(np.full((k, 3), float(i))) for i, k in enumerate(sizes))
        return await asyncio.gather(*calls)

    results = asyncio.run(main())

    for i, (k, y) in enumerate(zip(sizes, results, strict=True)):
        np.testing.assert_array_equal(y, np.array([[i] * k, [3 * i] * k], dtype=float))
    snap = runner.stats("predict")
    assert sum(n * count for n, count in snap.batch_size_counts.items()) == sum(sizes)
    assert snap.max_batch_size_seen <= 16


class Containers(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=16, max_latency_ms=10)
    def score(self, features: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(0.002)
        return features["a"].sum(axis=1) + features["b"], features["b"] * 10

    @labserve.method(batchable=True, max_batch_size=16, max_latency_ms=10)
    def pair(self, left: np.ndarray, right: list[str]) -> dict[str, Any]:
        time.sleep(0.002)
        return {"sum": left + 1, "text": [s.upper() for s in right]}


def test_dict_inputs_and_tuple_outputs_end_to_end(make_runner):
    runner = make_runner(Containers, on_overload="wait")
    n = 60

    async def main() -> list[tuple[np.ndarray, np.ndarray]]:
        calls = (
            runner.score.async_run({"a": np.full((1, 2), float(i)), "b": np.array([float(i)])})
            for i in range(n)
        )
        return await asyncio.gather(*calls)

    results = asyncio.run(main())

    for i, (total, scaled) in enumerate(results):
        np.testing.assert_array_equal(total, [3.0 * i])
        np.testing.assert_array_equal(scaled, [10.0 * i])
    assert runner.stats("score").max_batch_size_seen > 1


def test_several_arguments_with_lists_and_dict_outputs_end_to_end(make_runner):
    runner = make_runner(Containers, on_overload="wait")
    n = 60

    async def main() -> list[dict[str, Any]]:
        calls = (
            runner.pair.async_run(np.full((2, 1), float(i)), [f"a{i}", f"b{i}"]) for i in range(n)
        )
        return await asyncio.gather(*calls)

    results = asyncio.run(main())

    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["sum"], np.full((2, 1), i + 1.0))
        assert out["text"] == [f"A{i}", f"B{i}"]
    assert runner.stats("pair").max_batch_size_seen > 2


def test_request_larger_than_the_cap_is_split_and_rejoined(make_runner):
    runner = make_runner(Affine, on_overload="wait", max_batch_size=4)
    big = np.arange(30, dtype=float).reshape(10, 3)

    async def main() -> list[np.ndarray]:
        calls = [runner.predict.async_run(row(i, 3)) for i in range(6)]
        calls.insert(3, runner.predict.async_run(big))
        return await asyncio.gather(*calls)

    results = asyncio.run(main())

    np.testing.assert_array_equal(results.pop(3), big * 2 + 1)
    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i + 1, 3))
    assert max(shape[0] for shape in runner.instance.batches) <= 4
    snap = runner.stats("predict")
    assert snap.served == 7
    assert snap.max_batch_size_seen == 4


class Gated(labserve.Runnable):
    """A model whose calls block until the test opens ``gate``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()

    @labserve.method(batchable=True, strategy="greedy", on_overload="wait")
    def predict(self, x: np.ndarray) -> np.ndarray:
        self.started.set()
        if not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        return x * 2


def test_stop_is_idempotent_and_later_calls_raise_runner_stopped(make_runner):
    runner = make_runner(Affine)
    np.testing.assert_array_equal(runner.predict.run(row(1)), row(3))

    runner.stop()
    runner.stop()

    assert runner.stopped
    with pytest.raises(labserve.RunnerStoppedError) as info:
        runner.predict.run(row(1))
    assert info.value.status == 503

    async def late_call() -> Any:
        return await runner.predict.async_run(row(1))

    with pytest.raises(labserve.RunnerStoppedError):
        asyncio.run(late_call())
    assert runner.stats("predict").served == 1


def test_stop_of_a_runner_never_called_is_a_no_op(make_runner):
    runner = make_runner(Affine)
    runner.stop()
    runner.stop()
    with pytest.raises(labserve.RunnerStoppedError):
        runner.predict.run(row(1))


def test_runner_as_context_manager_stops_on_exit():
    with labserve.Runner(Affine) as runner:
        np.testing.assert_array_equal(runner.predict.run(row(2)), row(5))
    assert runner.stopped
    with pytest.raises(labserve.RunnerStoppedError):
        runner.predict.run(row(2))


def test_stop_drains_the_queued_requests(make_runner, poll_until):
    model = Gated()
    runner = make_runner(model)
    n = 6
    results: dict[int, Any] = {}

    def client(i: int) -> None:
        try:
            results[i] = runner.predict.run(row(i))
        except BaseException as exc:
            results[i] = exc

    clients = [threading.Thread(target=client, args=(0,))]
    clients[0].start()
    assert model.started.wait(10)
    clients += [threading.Thread(target=client, args=(i,)) for i in range(1, n)]
    for thread in clients[1:]:
        thread.start()

    stopper = threading.Thread(target=runner.stop)
    try:
        poll_until(lambda: runner.stats("predict").queue_requests == n - 1)
        stopper.start()
        poll_until(lambda: runner.stopped)
    finally:
        model.gate.set()
    stopper.join(30)
    for thread in clients:
        thread.join(30)

    assert not stopper.is_alive()
    assert sorted(results) == list(range(n))
    for i, y in results.items():
        np.testing.assert_array_equal(y, row(2 * i))
    snap = runner.stats("predict")
    assert (snap.served, snap.pending, snap.queue_requests) == (n, 0, 0)
    assert set(snap.fire_reasons) <= set(labserve.REASONS)
    with pytest.raises(labserve.RunnerStoppedError):
        runner.predict.run(row(1))


def test_aclose_on_the_loop_fires_the_queued_requests_with_reason_drain(make_runner):
    model = Gated()
    runner = make_runner(model)
    n = 5

    async def main() -> list[np.ndarray]:
        tasks = [asyncio.create_task(runner.predict.async_run(row(0)))]
        await asyncio.to_thread(model.started.wait, 10)
        tasks += [asyncio.create_task(runner.predict.async_run(row(i))) for i in range(1, n)]
        closing = asyncio.create_task(runner.aclose())
        await asyncio.sleep(0.01)  # ready callbacks run before timers: the queue is closed now
        with pytest.raises(labserve.RunnerStoppedError):
            await runner.predict.async_run(row(9))
        model.gate.set()
        await closing
        return await asyncio.gather(*tasks)

    try:
        results = labserve.background_loop().run(main(), timeout=30)
    finally:
        model.gate.set()

    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i))
    snap = runner.stats("predict")
    assert snap.fire_reasons.get("drain") == 1
    assert snap.recent_batches[-1].reason == "drain"
    assert snap.recent_batches[-1].requests == n - 1
    assert (snap.served, snap.pending) == (n, 0)


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the hand-offs other threads make to it."""

    handoffs = 0

    def call_soon_threadsafe(self, *args: Any, **kwargs: Any) -> Any:
        CountingLoop.handoffs += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_callers_on_another_loop_are_answered_with_one_handoff_per_batch(make_runner):
    runner = make_runner(Affine, name="handoffs", max_batch_size=64, strategy="greedy")
    CountingLoop.handoffs = 0

    async def main() -> list[np.ndarray]:
        return await asyncio.gather(*(runner.predict.async_run(row(i)) for i in range(200)))

    with asyncio.Runner(loop_factory=CountingLoop) as loop_runner:
        results = loop_runner.run(main())

    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, row(2 * i + 1))
    snap = runner.stats("predict")
    assert snap.served == 200 and snap.batches < 200
    assert CountingLoop.handoffs == snap.batches  # not one per request


def test_arrivals_of_one_loop_iteration_are_admitted_together_as_of_the_first(make_runner):
    runner = make_runner(Affine, name="stamped", strategy="greedy")
    clock = labserve.SimClock(100.0)
    runner.clock = clock  # before the driver starts: it reads the runner's clock

    async def main() -> tuple[Any, Any]:
        first, f1 = runner.predict.submit_on_loop((row(1),))
        clock.advance(0.004)  # the rest of this loop iteration took 4 ms
        second, f2 = runner.predict.submit_on_loop((row(2),))
        await asyncio.gather(f1, f2)
        return first, second

    first, second = labserve.background_loop().run(main())
    assert first.arrival_s == second.arrival_s == 100.0  # waits count from the first arrival
    assert runner.stats("predict").batch_size_counts == {2: 1}  # admitted together: one batch


class Clashing(labserve.Runnable):
    """Methods named like the runner's own attributes, and one that is not."""

    @labserve.method(batchable=True)
    def predict(self, x: np.ndarray) -> np.ndarray:
        return x

    @labserve.method(batchable=True)
    def configure(self, x: np.ndarray) -> np.ndarray:
        return x

    @labserve.method(batchable=True)
    def clock(self, x: np.ndarray) -> np.ndarray:
        return x


def test_methods_are_attributes_of_the_runner_unless_the_runner_has_the_name(make_runner):
    runner = make_runner(Clashing, name="clashing")
    assert runner.predict is runner.methods["predict"]
    assert callable(runner.configure) and runner.configure.__func__ is labserve.Runner.configure
    assert isinstance(runner.clock, labserve.MonotonicClock)  # the runner's own wins
    assert isinstance(runner.methods["clock"], labserve.RunnerMethod)
    with pytest.raises(AttributeError, match="has no method 'score'"):
        runner.score  # noqa: B018


class _ShiftedClock:
    """A monotonic clock an hour ahead of the loop's: a different time base it can tell apart."""

    def now(self) -> float:
        return time.monotonic() + 3600.0


def test_the_runner_takes_its_clock_and_stamps_its_snapshots_and_batches_with_it(make_runner):
    runner = make_runner(Affine, name="clocked", clock=_ShiftedClock(), strategy="greedy")
    assert np.array_equal(runner.predict.run(row(1)), row(1) * 2 + 1)
    before = time.monotonic()
    snap = runner.predict.stats()
    assert snap.time_s > before + 3000.0
    [batch] = snap.recent_batches
    assert before + 3000.0 < batch.start_s <= snap.time_s
