"""A model call that never returns: every caller still hears, exactly once, and stop() says why."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import numpy as np
import pytest

import labserve

WAIT = 5.0


class Hangs(labserve.Runnable):
    """Hangs on the first batch until the test opens the gate; doubles afterwards."""

    def __init__(self):
        self.started = threading.Event()
        self.gate = threading.Event()
        self.calls = 0

    @labserve.method(batchable=True, max_batch_size=4, max_latency_ms=1, strategy="greedy")
    def predict(self, x):
        self.calls += 1
        if self.calls == 1:
            self.started.set()
            self.gate.wait(30)
        return x * 2


@pytest.fixture
def bg():
    loop = labserve.BackgroundLoop(name="hung-loop")
    yield loop
    loop.stop(timeout=2)


def call(pool, runner, value):
    return pool.submit(runner.predict.run, np.full((1, 2), float(value)))


def test_a_hung_model_times_its_callers_out_and_refuses_new_ones_until_it_returns(bg):
    model = Hangs()
    runner = labserve.Runner(model, loop=bg, request_timeout_ms=200, on_overload="wait")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        first = call(pool, runner, 1)
        assert model.started.wait(WAIT)
        queued = call(pool, runner, 2)  # waits behind the hung batch
        with pytest.raises(labserve.RequestTimeoutError, match="request_timeout_ms=200"):
            first.result(WAIT)
        with pytest.raises(labserve.RequestTimeoutError):
            queued.result(WAIT)
        snap = runner.stats("predict")
        assert snap.stuck_batches == 1 and not snap.ready and snap.timeout == 2
        with pytest.raises(labserve.ModelStuckError):
            runner.predict.run(np.ones((1, 2)))  # refused at once, not queued behind it
        model.gate.set()
        # The slot frees when the call returns; the method serves again.
        for _ in range(50):
            if runner.stats("predict").ready:
                break
            model.started.wait(0.05)
        np.testing.assert_array_equal(call(pool, runner, 3).result(WAIT), np.full((1, 2), 6.0))
        snap = runner.stats("predict")
        assert snap.pending == 0 and snap.timeout == 2 and snap.served == 1
    runner.stop()


def test_stop_with_a_hung_model_answers_everyone_then_names_the_stuck_method(bg):
    model = Hangs()
    runner = labserve.Runner(model, name="slow", loop=bg, request_timeout_ms=0, on_overload="wait")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = call(pool, runner, 1)
        assert model.started.wait(WAIT)
        queued = [call(pool, runner, v) for v in (2, 3)]
        with pytest.raises(labserve.StopTimeoutError, match=r"slow\.predict") as info:
            runner.stop(timeout=0.3)
        assert isinstance(info.value, TimeoutError)
        for future in (running, *queued):
            with pytest.raises(labserve.RunnerStoppedError):
                future.result(WAIT)
        model.gate.set()


class BlocksTheLoop(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=4, max_latency_ms=1, strategy="greedy")
    async def predict(self, x):
        threading.Event().wait(0.25)  # a blocking call inside async def: the loop stalls
        return x * 2


def test_an_async_model_that_blocks_the_loop_is_named_once(bg, caplog):
    runner = labserve.Runner(BlocksTheLoop, name="blocky", loop=bg)
    with caplog.at_level("WARNING", logger="labserve.runtime"):
        for _ in range(2):
            np.testing.assert_array_equal(runner.predict.run(np.ones((1, 2))), np.full((1, 2), 2))
    warnings = [r for r in caplog.records if r.name == "labserve.runtime"]
    assert len(warnings) == 1
    assert "blocky.predict" in warnings[0].getMessage()
    assert "blocked labserve's event loop" in warnings[0].getMessage()
    runner.stop()


class Awaits(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=4, max_latency_ms=1, strategy="greedy")
    async def predict(self, x):
        await asyncio.sleep(0.25)  # waits without blocking: no warning
        return x * 2


def test_an_async_model_that_awaits_is_not_reported(bg, caplog):
    runner = labserve.Runner(Awaits, loop=bg)
    with caplog.at_level("WARNING", logger="labserve.runtime"):
        runner.predict.run(np.ones((1, 2)))
    assert [r for r in caplog.records if r.name == "labserve.runtime"] == []
    runner.stop()


def test_the_server_reports_a_stuck_method_not_ready(bg):
    import json
    import urllib.error
    import urllib.request

    model = Hangs()
    runner = labserve.Runner(model, name="hung", loop=bg, request_timeout_ms=100)
    server = labserve.serve(runner)
    try:

        def get(path):
            try:
                with urllib.request.urlopen(server.url + path, timeout=WAIT) as reply:
                    return reply.status, json.loads(reply.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        assert get("/v2/models/hung/ready") == (200, {"name": "hung", "ready": True})
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = call(pool, runner, 1)
            assert model.started.wait(WAIT)
            with pytest.raises(labserve.RequestTimeoutError):
                first.result(WAIT)
            assert get("/v2/models/hung/ready") == (503, {"name": "hung", "ready": False})
            assert get("/v2/health/ready") == (503, {"ready": False})
            status, health = get("/healthz")
            assert status == 200 and health["status"] == "degraded"
            assert list(health["not_ready"]) == ["hung.predict"]
            assert get("/health") == (status, health)  # what vLLM's clients check
            model.gate.set()
    finally:
        server.stop()
        runner.stop()
