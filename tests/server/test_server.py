import concurrent.futures
import contextlib
import io
import json
import os
import threading
import time
import urllib.error
import urllib.request
import warnings

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import labserve
from labserve.runtime import session
from labserve.server import Server, serve


class Model(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=16, max_latency_ms=50, on_overload="wait")
    def predict(self, x):
        if np.isnan(x).any():
            raise FloatingPointError("NaN in input")
        return x * 2

    @labserve.method(batchable=True, input_spec=labserve.TensorSpec("float32", (3,)))
    def strict(self, x):
        return x


class Slow(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=1, max_latency_ms=1)
    def predict(self, x):
        time.sleep(0.02)
        return x


def call(server, path, body=None, method=None, headers=None):
    """(status, headers, body bytes) of one real HTTP request."""
    req = urllib.request.Request(server.url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers, err.read()


def post_json(server, path, data):
    return call(
        server, path, json.dumps(data).encode(), headers={"Content-Type": "application/json"}
    )


@pytest.fixture
def served():
    runner = labserve.Runner(Model, name="model")
    server = serve(runner, max_body_bytes=4096)
    yield server
    server.stop()
    runner.stop()


def test_json_and_npy_requests_get_replies_of_their_own_type(served):
    status, headers, body = post_json(served, "/runners/model/predict", [[1, 2], [3, 4]])
    assert (status, headers["Content-Type"]) == (200, "application/json")
    assert json.loads(body) == [[2, 4], [6, 8]]
    buf = io.BytesIO()
    np.save(buf, np.arange(6.0).reshape(3, 2))
    status, headers, body = call(
        served,
        "/runners/model/predict",
        buf.getvalue(),
        headers={"Content-Type": "application/x-npy"},
    )
    assert (status, headers["Content-Type"]) == (200, "application/x-npy")
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), np.arange(6.0).reshape(3, 2) * 2)


def good_request_still_served(server):
    assert post_json(server, "/runners/model/predict", [[1.0]])[0] == 200


@pytest.mark.parametrize(
    ("path", "body", "method", "status", "words"),
    [
        ("/runners/model/predict", b"[[1, 2", "POST", 400, "not valid JSON"),
        ("/runners/model/predict", b'"text"', "POST", 400, "must be a JSON array"),
        ("/runners/model/predict", b'[["a"]]', "POST", 400, "must hold numbers"),
        ("/runners/model/strict", b"[[1, 2]]", "POST", 400, "expected float32[N, 3]"),
        ("/runners/nope/predict", b"[[1]]", "POST", 404, "no runner 'nope'"),
        ("/runners/model/nope", b"[[1]]", "POST", 404, "has no method 'nope'"),
        ("/runners/model/predict", None, "GET", 405, "Method Not Allowed"),
        ("/runners/model/predict", b"[" + b"1," * 3000 + b"1]", "POST", 413, "limit"),
        ("/runners/model/predict", b"[[NaN]]", "POST", 500, "NaN in input"),
    ],
)
def test_bad_input_gets_its_status_and_the_server_keeps_serving(
    served, path, body, method, status, words
):
    got, headers, reply = call(served, path, body, method, {"Content-Type": "application/json"})
    assert got == status
    assert headers["Content-Type"] == "application/json"
    error = json.loads(reply)
    assert set(error) == {"error", "detail"} and words in error["detail"]
    good_request_still_served(served)


@pytest.mark.parametrize(
    ("path", "body", "method", "headers", "error"),
    [
        ("/runners/model/predict", b"[[1, 2", "POST", {}, labserve.InputError),
        ("/runners/nope/predict", b"[[1]]", "POST", {}, labserve.NotFoundError),
        ("/nowhere", None, "GET", {}, labserve.NotFoundError),
        ("/v2/models/nope", None, "GET", {}, labserve.NotFoundError),
        ("/runners/model/predict", None, "GET", {}, labserve.MethodNotAllowedError),
        ("/runners/model/predict", b"[1]" * 2000, "POST", {}, labserve.PayloadTooLargeError),
        ("/config", b"{}", "PATCH", {}, labserve.UnauthorizedError),
        ("/runners/model/predict", b"[[NaN]]", "POST", {}, labserve.ModelError),
    ],
)
def test_every_error_on_the_wire_is_named_by_its_class(served, path, body, method, headers, error):
    headers = {"Content-Type": "application/json", **headers}
    status, _, reply = call(served, path, body, method, headers)
    assert status == error.status
    name = json.loads(reply)["error"]
    # v2 routes put the message after the name, for clients that show only "error".
    assert name == error.__name__ or name.startswith(f"{error.__name__}: ")


def test_overload_is_503_with_retry_after():
    runner = labserve.Runner(Slow, name="slow", on_overload="reject")
    server = serve(runner)
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(
                pool.map(lambda _: post_json(server, "/runners/slow/predict", [[1.0]]), range(8))
            )
    finally:
        server.stop()
        runner.stop()
    overloaded = [r for r in replies if r[0] == 503]
    assert overloaded and len(overloaded) < len(replies)
    _, headers, body = overloaded[0]
    assert int(headers["Retry-After"]) >= 1
    assert json.loads(body)["error"] == "OverloadError"


def test_stats_and_metrics_read_the_runner(served):
    post_json(served, "/runners/model/predict", [[1.0], [2.0]])
    status, _, body = call(served, "/stats")
    stats = json.loads(body)
    assert status == 200 and stats["model"]["predict"]["served"] == 1
    status, headers, body = call(served, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples = {
        (s.name, s.labels.get("outcome")): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.labels.get("method") == "predict"
    }
    assert samples[("labserve_requests_total", "served")] == 1
    assert call(served, "/healthz")[0] == 200


def test_health_answers_as_healthz_for_clients_built_for_vllm(served):
    # guidellm's start-up check sends GET /health (vLLM, TGI and transformers answer it).
    status, headers, body = call(served, "/health")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    assert headers["Content-Type"] == "application/json"
    assert body == call(served, "/healthz")[2]


def test_patch_config_needs_the_token_validates_and_applies(served):
    change = json.dumps({"runner": "model", "method": "predict", "max_batch_size": 2}).encode()
    assert call(served, "/config", change, "PATCH")[0] == 401
    bad = json.dumps({"runner": "model", "method": "predict", "max_batch_size": 0}).encode()
    auth = {"Authorization": f"Bearer {served.token}", "Content-Type": "application/json"}
    status, _, body = call(served, "/config", bad, "PATCH", auth)
    assert status == 422 and "max_batch_size must be an integer >= 1" in json.loads(body)["detail"]
    assert json.loads(call(served, "/config")[2])["model"]["predict"]["max_batch_size"] == 16
    status, _, body = call(served, "/config", change, "PATCH", auth)
    assert status == 200 and json.loads(body)["model"]["predict"]["max_batch_size"] == 2
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: post_json(served, "/runners/model/predict", [[i]]), range(16)))
    stats = json.loads(call(served, "/stats")[2])["model"]["predict"]
    assert stats["batch_size_counts"] and max(map(int, stats["batch_size_counts"])) <= 2


def test_rerunning_serve_on_a_port_replaces_the_server():
    runner = labserve.Runner(Model, name="model")
    first = serve(runner)
    second = serve(runner, port=first.port)
    try:
        assert second.port == first.port
        assert repr(first).startswith("<labserve.Server stopped")
        assert call(second, "/healthz")[0] == 200
    finally:
        second.stop()
        runner.stop()


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_serve_and_stop_twenty_times_leaks_no_thread_or_socket():
    runner = labserve.Runner(Model, name="model")
    first = serve(runner)
    first.stop()  # the background loop and its first threads exist from here on
    threads, fds = threading.active_count(), open_fds()
    for _ in range(20):
        server = serve(runner)
        assert call(server, "/healthz")[0] == 200
        server.stop()
        server.stop()  # idempotent
    runner.stop()
    assert threading.active_count() <= threads
    assert open_fds() <= fds


def test_a_non_loopback_bind_needs_a_token():
    runner = labserve.Runner(Model, name="model")
    with pytest.raises(ValueError, match="needs token"):
        Server(runner, host="0.0.0.0")
    runner.stop()


def test_http_load_over_the_simple_route_and_v2_form_batches():
    from labserve.load.arrivals import ConstantArrivals
    from labserve.load.generator import load_test

    runner = labserve.Runner(Model, name="model")
    server = serve(runner)
    try:
        with _ignore_lag():
            simple = load_test(
                server.url + "/runners/model/predict",
                example=np.ones((1, 3)),
                duration_s=0.3,
                arrivals=ConstantArrivals(300),
            )
            v2 = load_test(
                server.url + "/v2/models/model.predict/infer",
                example=np.ones((1, 3), np.float32),
                duration_s=0.3,
                concurrency=4,
            )
    finally:
        server.stop()
        runner.stop()
    assert simple.served.all() and len(simple.arrival_s) == 90
    assert v2.served.all() and len(v2.arrival_s) > 0
    assert runner.stats("predict").served == len(simple.arrival_s) + len(v2.arrival_s)


@contextlib.contextmanager
def _ignore_lag():
    from labserve.base.errors import LoadWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LoadWarning)  # a busy machine may lag; tested elsewhere
        yield


def test_serve_takes_servers_own_parameters_declared_once():
    import inspect

    assert inspect.signature(serve).parameters == inspect.signature(Server).parameters
    runner = labserve.Runner(Model, name="model")
    server = serve(runner, max_connections=7, idle_timeout_s=5)
    try:
        assert (server.max_connections, server.idle_timeout_s, server.running) == (7, 5.0, True)
        with pytest.raises(TypeError, match="max_conections"):
            serve(runner, max_conections=7)  # a typo is refused, not ignored
    finally:
        server.stop()
        runner.stop()


def test_a_config_section_for_a_runner_there_is_not_is_refused_naming_file_and_runners(
    tmp_path, monkeypatch
):
    path = tmp_path / "shared.yaml"
    path.write_text(
        "runners:\n  model:\n    batching: {max_batch_size: 4}\n"
        "  other:\n    batching: {max_batch_size: 8}\n"
    )
    runner = labserve.Runner(Model, name="model", config=path)
    try:
        # A section for a runner not served, and none of that name in this kernel: a typo.
        before = session.running()
        with pytest.raises(labserve.ConfigError) as info:
            serve(runner)
        assert str(info.value) == (
            f"{path}: runners.other must be a section for a runner there is"
            " (the runners there are: 'model'), got 'other'"
        )
        assert session.running() == before  # no server started
        # The same file read from $LABSERVE_CONFIG, shared by two servers in this kernel.
        monkeypatch.setenv("LABSERVE_CONFIG", str(path))
        other = labserve.Runner(Model, name="other")
        assert other.predict.config.max_batch_size == 8
        with serve(runner), serve(other) as second:
            assert call(second, "/healthz")[0] == 200
        other.stop()
        with pytest.raises(labserve.ConfigError, match=r"runners.other .*there are: 'model'"):
            serve(labserve.Runner(Model, name="model"))
    finally:
        runner.stop()
