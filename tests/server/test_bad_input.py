"""Client input that used to give a 500 (or a wrong 200) gets a 4xx JSON error naming it.

And a model's own failures (a plain method that raises, a result the wire cannot carry)
are JSON errors with the model's words, not a bare "Internal Server Error".
"""

import json
import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import labserve
from labserve.server import serve


class Model(labserve.Runnable):
    @labserve.method(batchable=True, max_latency_ms=1)
    def predict(self, x):
        return x * 2

    @labserve.method(batchable=True, max_latency_ms=1)
    def nan(self, x):
        return np.where(x > 0, np.nan, np.inf) * np.ones_like(x, dtype=float)

    @labserve.method(batchable=True, max_latency_ms=1)
    def complex(self, x):
        return x * 1j

    @labserve.method()
    def plain(self, x):
        raise ValueError("the plain model's own words")


@pytest.fixture(scope="module")
def served():
    runner = labserve.Runner(Model, name="m")
    server = serve(runner, max_body_bytes=1024 * 1024)
    yield server
    server.stop()
    runner.stop()


def post(server, path, body, content_type="application/json", headers=None):
    req = urllib.request.Request(
        server.url + path,
        data=body,
        method="POST",
        headers={"Content-Type": content_type, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers, err.read()


def strict_json(body):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(body, parse_constant=refuse)


def error_of(reply):
    status, headers, body = reply
    assert headers["Content-Type"] == "application/json", (status, body)
    return status, strict_json(body)


def v2(inputs, **extra):
    return json.dumps({"inputs": inputs, **extra}).encode()


def npy_header(shape, dtype="<f8"):
    header = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


X = {"name": "x", "datatype": "FP64", "shape": [1, 1], "data": [1.0]}


@pytest.mark.parametrize(
    ("path", "body", "content_type", "words"),
    [
        ("/runners/m/predict", b"[" * 100_000 + b"]" * 100_000, "application/json", "nested"),
        ("/runners/m/predict", npy_header((2**40,)), "application/x-npy", "declares"),
        (
            "/runners/m/predict",
            npy_header((2**31, 2**31)) + b"x" * 64,
            "application/x-npy",
            "declares",
        ),
        ("/v2/models/m.predict/infer", b'{"inputs":' * 50_000, "application/json", "nested"),
        (
            "/v2/models/m.predict/infer",
            v2([{"name": "x", "datatype": "INT8", "shape": [1], "data": [1000]}]),
            "application/json",
            "out of range for INT8",
        ),
        (
            "/v2/models/m.predict/infer",
            v2([{"name": "x", "datatype": "UINT64", "shape": [1], "data": [-1]}]),
            "application/json",
            "out of range for UINT64",
        ),
        (
            "/v2/models/m.predict/infer",
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],'
            b' "parameters": {"binary_data_size": Infinity}}]}',
            "application/json",
            "binary_data_size must be an integer",
        ),
        (
            "/v2/models/m.predict/infer",
            v2([X], outputs="x"),
            "application/json",
            "outputs must be a list",
        ),
        ("/v2/models/m.predict/infer", v2([X], outputs=[3]), "application/json", "outputs[0]"),
        (
            "/v2/models/m.predict/infer",
            v2([X], parameters=[1]),
            "application/json",
            "parameters must be",
        ),
        (
            "/v2/models/m.predict/infer",
            v2([{"name": "x", "datatype": "FP32", "shape": [1]}]),
            "application/json",
            'neither "data"',
        ),
        (
            "/v2/models/m.predict/infer",
            v2(
                [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [2],
                        "parameters": {"binary_data_size": 8},
                    }
                ]
            ),
            "application/json",
            "binary_data_size is 8 but only 0 bytes",
        ),
        ("/v2/models/m.predict/infer", v2([X, X]), "application/json", "cannot take 2 inputs"),
    ],
)
def test_client_input_is_a_4xx_json_error_naming_the_problem(
    served, path, body, content_type, words, caplog
):
    with caplog.at_level(logging.DEBUG):
        status, error = error_of(post(served, path, body, content_type))
    assert 400 <= status < 500 and words in error["detail"], error
    assert_logged_once_briefly(caplog)


def assert_logged_once_briefly(caplog):
    """One INFO line on the labserve.server logger; no traceback, nothing louder."""
    records = [r for r in caplog.records if r.name.startswith(("labserve", "tornado", "asyncio"))]
    assert [(r.name, r.levelno) for r in records] == [("labserve.server", logging.INFO)]
    assert records[0].exc_info is None


def test_binary_data_size_larger_than_the_bytes_sent_is_refused(served):
    head = v2(
        [{"name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}]
    )
    body = head + np.ones(1, np.float32).tobytes()  # 4 of the 8 bytes
    status, error = error_of(
        post(
            served,
            "/v2/models/m.predict/infer",
            body,
            headers={"Inference-Header-Content-Length": str(len(head))},
        )
    )
    assert status == 400 and "binary_data_size is 8 but only 4 bytes" in error["detail"]


def test_patch_config_refusals_reach_urllib_as_json(served):
    big = json.dumps({"runner": "m", "method": "predict", "pad": "x" * 3_000_000}).encode()
    for headers, status in (
        ({"Content-Type": "application/json"}, 401),  # the token comes first
        ({"Content-Type": "text/plain", "Authorization": f"Bearer {served.token}"}, 415),
        ({"Content-Type": "application/json", "Authorization": f"Bearer {served.token}"}, 413),
    ):
        req = urllib.request.Request(served.url + "/config", big, headers, method="PATCH")
        with pytest.raises(urllib.error.HTTPError) as info, urllib.request.urlopen(req, timeout=30):
            pass
        with info.value as err:
            assert err.code == status and json.loads(err.read())["error"]


def test_a_list_as_the_method_in_patch_config_is_400(served):
    body = json.dumps({"runner": "m", "method": ["predict"], "max_batch_size": 2}).encode()
    req = urllib.request.Request(
        served.url + "/config",
        data=body,
        method="PATCH",
        headers={"Authorization": f"Bearer {served.token}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info, urllib.request.urlopen(req, timeout=10):
        pass
    with info.value as err:
        assert err.code == 400 and '"method" must be' in json.loads(err.read())["detail"]


def test_a_plain_method_that_raises_carries_its_message(served):
    status, error = error_of(post(served, "/runners/m/plain", b"[[1]]"))
    assert (status, error["error"]) == (500, "ModelError")
    assert "ValueError: the plain model's own words" in error["detail"]


def test_nan_and_infinity_in_a_result_are_null_in_standard_json(served):
    status, _, body = post(served, "/runners/m/nan", b"[[1, -1]]")
    assert status == 200 and strict_json(body) == [[None, None]]
    body = v2([{"name": "x", "datatype": "FP64", "shape": [1, 2], "data": [1, -1]}])
    status, _, reply = post(served, "/v2/models/m.nan/infer", body)
    assert status == 200 and strict_json(reply)["outputs"][0]["data"] == [None, None]


def test_a_result_with_no_v2_or_json_form_is_a_json_500_that_says_so(served):
    status, error = error_of(post(served, "/runners/m/complex", b"[[1]]"))
    assert (status, error["error"]) == (500, "OutputError") and "complex128" in error["detail"]
    body = v2([{"name": "x", "datatype": "FP64", "shape": [1, 1], "data": [1]}])
    status, error = error_of(post(served, "/v2/models/m.complex/infer", body))
    assert status == 500 and error["error"].startswith("OutputError")
    assert "no v2 datatype" in error["detail"]


def test_an_oversized_body_reaches_urllib_as_the_json_413(served):
    # urllib sends the whole body before it reads: it used to see a connection reset.
    body = b"[" + b"1," * (3 * 1024 * 1024) + b"1]"
    status, error = error_of(post(served, "/runners/m/predict", body))
    assert (status, error["error"]) == (413, "PayloadTooLargeError")
    assert post(served, "/runners/m/predict", b"[[1]]")[0] == 200


def test_an_oversized_chunked_body_is_the_json_413(served, caplog):
    chunk = b"1," * 32768
    caplog.set_level(logging.DEBUG)
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(
            b"POST /runners/m/predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n"
        )
        for _ in range(2 * 1024 * 1024 // len(chunk)):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sock.sendall(b"0\r\n\r\n")
        reply = sock.makefile("rb").read(4096).decode()
    assert reply.startswith("HTTP/1.1 413"), reply[:200]
    assert '"error": "PayloadTooLargeError"' in reply
    assert_logged_once_briefly(caplog)  # it used to log tornado's "Uncaught exception" traceback


class Gate(labserve.Runnable):
    def __init__(self):
        self.go = threading.Event()

    @labserve.method(batchable=True, max_batch_size=1, max_latency_ms=1, on_overload="wait")
    def predict(self, x):
        self.go.wait(30)
        return x


def test_a_client_that_disconnects_has_its_queued_request_withdrawn():
    model = Gate()
    runner = labserve.Runner(model, name="g")
    server = serve(runner)
    request = (
        b"POST /runners/g/predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 5\r\n\r\n[[1]]"
    )
    try:
        first = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        first.sendall(request)  # runs, and holds the only batch slot
        _wait(lambda: runner.stats("predict").in_flight_batches == 1)
        second = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        second.sendall(request)  # queued behind it
        _wait(lambda: runner.stats("predict").queue_requests == 1)
        second.close()  # the client gives up
        _wait(lambda: runner.stats("predict").cancelled == 1)
        model.go.set()
        assert first.makefile("rb").readline().startswith(b"HTTP/1.1 200")
        first.close()
        stats = runner.stats("predict")
        assert (stats.served, stats.cancelled, stats.batches) == (1, 1, 1)
    finally:
        model.go.set()
        server.stop()
        runner.stop()


def _wait(condition, timeout_s=20.0):
    """Poll ``condition`` until true; a generous bound, not a timing claim."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


class Complex(labserve.Runnable):
    @labserve.method(batchable=True, input_spec=labserve.TensorSpec("complex64", (2,)))
    def predict(self, x):
        return x


def test_metadata_of_a_dtype_with_no_v2_name_is_a_json_500_that_says_so():
    runner = labserve.Runner(Complex, name="c")
    server = serve(runner)
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(server.url + "/v2/models/c", timeout=10)
        with info.value as err:
            assert err.code == 500
            assert "no v2 datatype for numpy complex64" in json.loads(err.read())["detail"]
    finally:
        server.stop()
        runner.stop()
