"""Failure paths found in review: every caller is answered, whatever the model or stop() does."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import numpy as np
import pytest

import labserve

WAIT = 3.0


def in_thread(fn, *args):
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def body():
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:
            fut.set_exception(exc)

    threading.Thread(target=body, daemon=True).start()
    return fut


def unanswered(futures):
    """Indices of the callers not answered within WAIT; any answer, even an error, counts."""
    hung = []
    for i, f in enumerate(futures):
        try:
            f.result(WAIT)
        except concurrent.futures.TimeoutError:
            hung.append(i)
        except BaseException:
            pass  # an error is an answer
    return hung


@pytest.fixture
def bg():
    b = labserve.BackgroundLoop(name="review-loop")
    yield b
    b.stop(timeout=2)


# 1. sync model raises a BaseException ------------------------------------------------
class SyncBase(labserve.Runnable):
    def __init__(self):
        self.calls = 0

    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=5)
    def predict(self, x):
        self.calls += 1
        if self.calls == 1:
            raise KeyboardInterrupt("boom")
        return x * 2


def test_sync_model_baseexception_answers_callers_and_frees_slot(bg):
    r = labserve.Runner(SyncBase, loop=bg, on_overload="wait")
    f1 = in_thread(r.predict.run, np.ones((1, 2)))
    if unanswered([f1]):
        pytest.fail(
            "caller of batch whose model raised KeyboardInterrupt never answered; "
            f"in_flight={r.stats('predict').in_flight_batches}"
        )
    f2 = in_thread(r.predict.run, np.ones((1, 2)))
    np.testing.assert_array_equal(f2.result(WAIT), np.full((1, 2), 2.0))


# 2. async model raises SystemExit: the loop thread must survive -------------------------
class AsyncExit(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=5)
    async def predict(self, x):
        raise SystemExit(3)


def test_async_model_systemexit_does_not_kill_loop(bg):
    r = labserve.Runner(AsyncExit, loop=bg)
    f = in_thread(r.predict.run, np.ones((1, 2)))
    if unanswered([f]):
        pytest.fail(f"caller hangs; loop thread alive={bg.running}")
    assert bg.running, "loop thread died"


# 3. async isolate_errors: a half raising CancelledError (e.g. loop stopping) ----------
class AsyncIsolate(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=50, isolate_errors=True)
    async def predict(self, x):
        await asyncio.sleep(0)  # an async model: it yields to the loop
        if len(x) > 1:
            raise ValueError("whole batch fails")
        if x[0, 0] == 1.0:
            raise asyncio.CancelledError()  # what a loop-stop cancellation looks like here
        return x * 2


def test_async_isolate_cancelled_half_leaves_no_caller_hanging(bg):
    r = labserve.Runner(AsyncIsolate, loop=bg, strategy="fixed")
    fs = [in_thread(r.predict.run, np.full((1, 2), float(i))) for i in range(2)]
    hung = unanswered(fs)
    assert not hung, f"callers {hung} never answered; pending={r.stats('predict').pending}"


# 4. sync isolate_errors: half raising KeyboardInterrupt ----------------------------------
class SyncIsolate(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=50, isolate_errors=True)
    def predict(self, x):
        if len(x) > 1:
            raise ValueError("whole batch fails")
        if x[0, 0] == 1.0:
            raise KeyboardInterrupt()
        return x * 2


def test_sync_isolate_baseexception_leaves_no_caller_hanging(bg):
    r = labserve.Runner(SyncIsolate, loop=bg, strategy="fixed")
    fs = [in_thread(r.predict.run, np.full((1, 2), float(i))) for i in range(2)]
    hung = unanswered(fs)
    assert not hung, f"callers {hung} never answered; pending={r.stats('predict').pending}"


# 5. bg.stop() times out while a sync batch runs -----------------------------------------
class Gated(labserve.Runnable):
    """A model that runs until the test opens its gate; ``worker`` is the thread it ran on."""

    def __init__(self):
        self.started = threading.Event()
        self.gate = threading.Event()
        self.worker: threading.Thread | None = None

    @labserve.method(batchable=True, max_batch_size=1, max_latency_ms=5)
    def predict(self, x):
        self.worker = threading.current_thread()
        self.started.set()
        self.gate.wait(WAIT)
        return x * 2


def test_stop_timeout_with_running_sync_batch_answers_every_caller():
    b = labserve.BackgroundLoop(name="review-stop")
    model = Gated()
    r = labserve.Runner(model, loop=b, on_overload="wait")
    fs = [in_thread(r.predict.run, np.full((1, 2), float(i))) for i in range(2)]
    assert model.started.wait(WAIT)
    b.stop(timeout=0.3)  # gives up waiting: the first batch is still in the model
    hung = unanswered(fs)
    model.gate.set()  # the batch finishes after the loop stopped
    assert model.worker is not None
    model.worker.join(WAIT)  # it delivered what it could, and its thread ended
    loops = [t.name for t in threading.enumerate() if t.name == "review-stop"]
    b.stop(timeout=1)
    assert not hung, f"callers {hung} never answered after stop() gave up waiting"
    assert not model.worker.is_alive()
    assert not loops, "a finished batch restarted the stopped loop"


# 6. an exception whose __str__ raises (message built under the lock in queue.fail) ----
class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("no str")


class SyncBadStr(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=5)
    def predict(self, x):
        raise BadStr()


def test_model_exception_with_bad_str_still_answers(bg):
    r = labserve.Runner(SyncBadStr, loop=bg)
    f = in_thread(r.predict.run, np.ones((1, 2)))
    if unanswered([f]):
        pytest.fail("caller hangs when the model's exception has a broken __str__")


# 7. Runner.aclose() awaited on another loop (a notebook cell's loop) ------------------
def test_aclose_awaited_on_a_foreign_loop_returns(bg):
    model = Gated()
    r = labserve.Runner(model, loop=bg)
    f = in_thread(r.predict.run, np.ones((1, 2)))
    assert model.started.wait(WAIT)
    done = in_thread(lambda: asyncio.run(r.aclose()))
    model.gate.set()  # aclose() waits for the running batch, then returns
    try:
        done.result(WAIT)
    except concurrent.futures.TimeoutError:
        pytest.fail("await runner.aclose() on a non-labserve loop never returns")
    f.result(WAIT)


# 8. async model via wait of loop stop: queued requests when loop stops -----------------
class AsyncHung(labserve.Runnable):
    """An async model that never finishes on its own."""

    def __init__(self):
        self.started = threading.Event()

    @labserve.method(batchable=True, max_batch_size=1, max_latency_ms=5)
    async def predict(self, x):
        self.started.set()
        await asyncio.Event().wait()  # never set: only the loop's stop ends it
        return x * 2


def test_stop_timeout_with_async_batches_answers_every_caller():
    b = labserve.BackgroundLoop(name="review-stop2")
    model = AsyncHung()
    r = labserve.Runner(model, loop=b, on_overload="wait")
    fs = [in_thread(r.predict.run, np.full((1, 2), float(i))) for i in range(3)]
    assert model.started.wait(WAIT)
    b.stop(timeout=0.3)
    hung = unanswered(fs)
    assert not hung, f"callers {hung} never answered after stop() gave up waiting"
