"""Failure paths found in review: every caller is answered, whatever the model or stop() does."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

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
        except BaseException as e:
            print("caller", i, "got", type(e).__name__, e)
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
        await asyncio.sleep(0.01)
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
class Slow(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=1, max_latency_ms=5)
    def predict(self, x):
        time.sleep(1.0)
        return x * 2


def test_stop_timeout_with_running_sync_batch_answers_every_caller():
    b = labserve.BackgroundLoop(name="review-stop")
    r = labserve.Runner(Slow, loop=b, on_overload="wait")
    fs = [in_thread(r.predict.run, np.full((1, 2), float(i))) for i in range(2)]
    time.sleep(0.2)
    t0 = time.monotonic()
    b.stop(timeout=0.3)
    print("stop took", time.monotonic() - t0)
    hung = unanswered(fs)
    time.sleep(0.5)
    loops = [t.name for t in threading.enumerate() if t.name == "review-stop"]
    print("loop threads after stop:", loops, "bg.running", b.running)
    b.stop(timeout=1)
    assert not hung, f"callers {hung} never answered after stop() gave up waiting"
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
class Quick(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=5)
    def predict(self, x):
        time.sleep(0.2)
        return x * 2


def test_aclose_awaited_on_a_foreign_loop_returns(bg):
    r = labserve.Runner(Quick, loop=bg)
    f = in_thread(r.predict.run, np.ones((1, 2)))
    time.sleep(0.05)
    done = in_thread(lambda: asyncio.run(r.aclose()))
    try:
        done.result(WAIT)
    except concurrent.futures.TimeoutError:
        pytest.fail("await runner.aclose() on a non-labserve loop never returns")
    f.result(WAIT)


# 8. async model via wait of loop stop: queued requests when loop stops -----------------
class AsyncSlow(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=1, max_latency_ms=5)
    async def predict(self, x):
        await asyncio.sleep(1.0)
        return x * 2


def test_stop_timeout_with_async_batches_answers_every_caller():
    b = labserve.BackgroundLoop(name="review-stop2")
    r = labserve.Runner(AsyncSlow, loop=b, on_overload="wait")
    fs = [in_thread(r.predict.run, np.full((1, 2), float(i))) for i in range(3)]
    time.sleep(0.2)
    b.stop(timeout=0.3)
    hung = unanswered(fs)
    assert not hung, f"callers {hung} never answered after stop() gave up waiting"
