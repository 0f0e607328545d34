"""The exactly-once promises over the real paths virtual time cannot reach.

``run``, ``async_run`` from another event loop, the simple HTTP route and the v2 route
(through tritonclient), on the real background loop, with the issue's case: two callers 50 ms
apart under every strategy while the model hangs, ``request_timeout_ms=200``. Each caller
hears RequestTimeoutError (504 over HTTP) once; the model's late return changes nothing.
Bounds are generous (the hang lasts 30 s; answers are expected within 10 s, a caller left
waiting for the model is caught by the 20 s wait): nothing here measures speed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import threading
import time

import numpy as np
import pytest

import labserve

httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

STRATEGIES = ["off", "fixed", "greedy", "adaptive"]
BOUND_S = 10.0  # answered by then, though the model hangs for 30 s (waits are 2 x this < 30)


class Hangs(labserve.Runnable):
    def __init__(self) -> None:
        self.gate = threading.Event()

    @labserve.method(batchable=True, batch_dim=0, max_batch_size=2, max_latency_ms=1000)
    def predict(self, x):
        self.gate.wait(30)
        return x


@pytest.fixture(params=STRATEGIES)
def hung(request):
    model = Hangs()
    runner = labserve.Runner(
        model, name=f"hung-{request.param}", strategy=request.param, request_timeout_ms=200
    )
    runner.predict.start()
    yield runner
    model.gate.set()
    runner.stop()


def two_callers(call):
    """Call ``call(i)`` for two callers 50 ms apart; (outcome or error, seconds) of each."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = []
        for i in range(2):
            started = time.monotonic()
            futures.append((pool.submit(call, i), started))
            time.sleep(0.05)
        results = []
        for future, started in futures:
            try:
                outcome = future.result(timeout=BOUND_S * 2)
            except Exception as exc:
                outcome = exc
            results.append((outcome, time.monotonic() - started))
    return results


def assert_timed_out(results, expected=labserve.RequestTimeoutError):
    for outcome, took_s in results:
        assert isinstance(outcome, expected), repr(outcome)
        assert took_s < BOUND_S


def test_run(hung):
    assert_timed_out(two_callers(lambda i: hung.predict.run(np.array([float(i)]))))
    snap = hung.stats("predict")
    assert snap.timeout == 2 and snap.served == 0


def test_async_run_from_another_loop(hung):
    def call(i):
        return asyncio.run(hung.predict.async_run(np.array([float(i)])))

    assert_timed_out(two_callers(call))
    assert hung.stats("predict").timeout == 2


class HTTPStatus(Exception):
    def __init__(self, status, body):
        super().__init__(status)
        self.status, self.body = status, body


def test_simple_route(hung):
    server = labserve.serve(hung)
    try:

        def call(i):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=BOUND_S * 2)
            try:
                body = json.dumps([float(i)])
                headers = {"Content-Type": "application/json"}
                conn.request("POST", f"/runners/{hung.name}/predict", body, headers)
                reply = conn.getresponse()
                raise HTTPStatus(reply.status, json.loads(reply.read()))
            finally:
                conn.close()

        results = two_callers(call)
        for outcome, took_s in results:
            assert isinstance(outcome, HTTPStatus) and outcome.status == 504, repr(outcome)
            assert outcome.body["error"] == "RequestTimeoutError"
            assert took_s < BOUND_S
    finally:
        server.stop()
    assert hung.stats("predict").timeout == 2


def test_v2_route_through_tritonclient(hung):
    server = labserve.serve(hung)
    try:

        def call(i):
            # One client per caller: a tritonclient client is not for two threads at once.
            client = httpclient.InferenceServerClient(
                url=server.url.removeprefix("http://"), network_timeout=BOUND_S * 2
            )
            try:
                x = np.array([float(i)], dtype=np.float64)
                inp = httpclient.InferInput("input__0", list(x.shape), "FP64")
                inp.set_data_from_numpy(x)
                return client.infer(hung.name, [inp])
            finally:
                client.close()

        results = two_callers(call)
        for outcome, took_s in results:
            assert isinstance(outcome, InferenceServerException), repr(outcome)
            assert "request_timeout_ms" in str(outcome)
            assert took_s < BOUND_S
    finally:
        server.stop()
    assert hung.stats("predict").timeout == 2
