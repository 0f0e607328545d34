"""Property-based fuzzing of the decoders and both HTTP routes: never a 500, never a hang.

Whatever a client sends — arbitrary JSON, ``.npy`` headers, v2 bodies, binary framings —
the answer is a 2xx or a JSON 4xx. The decoders either decode or raise InputError.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import labserve
from labserve.wire.codec import decode
from labserve.wire.inference import decode_request

FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same examples every run: a failure repeats
    database=None,  # and nothing written to .hypothesis/
)


class Echo(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=1, on_overload="wait")
    def predict(self, x):
        return x


@pytest.fixture(scope="module")
def server():
    runner = labserve.Runner(Echo, name="echo")
    srv = labserve.serve(runner, max_body_bytes=256 * 1024)
    yield srv
    srv.stop()
    runner.stop()


@pytest.fixture(scope="module")
def conn(server):
    """One keep-alive connection for the module (a new one if the server closed it)."""
    holder = {"c": http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)}
    holder["port"] = server.port
    yield holder
    holder["c"].close()


def send(conn, path, body, headers):
    """POST and return (status, content type, body); a hang is a socket timeout (a failure)."""
    for attempt in (0, 1):
        try:
            conn["c"].request("POST", path, body=body, headers=headers)
            reply = conn["c"].getresponse()
            return reply.status, reply.getheader("Content-Type", ""), reply.read()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if attempt:
                raise
            conn["c"].close()
            conn["c"] = http.client.HTTPConnection("127.0.0.1", conn["port"], timeout=10)
    raise AssertionError("unreachable")


def answered_well(status, content_type, body):
    assert status < 500, (status, body[:500])
    if status >= 400:
        assert content_type == "application/json", (status, content_type, body[:200])
        error = json.loads(body)
        assert set(error) == {"error", "detail"} and error["detail"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=30,
)
numbers = st.one_of(
    st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans()
)
rows = st.lists(st.lists(numbers, min_size=0, max_size=3), min_size=0, max_size=3)


def npy_bytes(descr, fortran, shape, tail):
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + tail


npy_bodies = st.one_of(
    st.builds(
        npy_bytes,
        st.sampled_from(["<f8", "<i4", "|u1", "|b1", "<c16", "|O", "<U3", "|V4", "<f2", "zz"]),
        st.booleans(),
        st.lists(st.integers(-3, 2**40), max_size=4).map(tuple) | st.integers(),
        st.binary(max_size=96),
    ),
    st.binary(max_size=64).map(lambda b: b"\x93NUMPY" + b),
    st.binary(max_size=64),
)
datatypes = st.sampled_from(["FP32", "FP64", "INT8", "UINT64", "BOOL", "FP16", "BYTES", 3, None])
shapes = st.one_of(st.lists(st.integers(-2, 5), max_size=3), json_values)
v2_inputs = st.fixed_dictionaries(
    {"name": st.text(max_size=4) | st.integers(), "datatype": datatypes, "shape": shapes},
    optional={
        "data": st.one_of(json_values, st.lists(numbers, max_size=6)),
        "parameters": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "binary_data_size": st.one_of(
                        st.integers(-4, 64), st.floats(), st.text(max_size=3), st.booleans()
                    )
                },
            ),
            json_values,
        ),
    },
)
v2_requests = st.fixed_dictionaries(
    {"inputs": st.one_of(st.lists(v2_inputs, max_size=3), json_values)},
    optional={
        "outputs": st.one_of(
            st.lists(st.fixed_dictionaries({"name": st.text(max_size=9)}), max_size=2),
            json_values,
        ),
        "parameters": st.one_of(st.just({"binary_data_output": True}), json_values),
        "id": json_values,
    },
)


@FUZZ
@given(body=st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=64)))
def test_the_json_decoder_decodes_or_says_why(body):
    try:
        decode(body, "application/json")
    except labserve.InputError:
        pass


@FUZZ
@given(body=npy_bodies)
def test_the_npy_decoder_decodes_or_says_why(body):
    try:
        arr, _ = decode(body, "application/x-npy")
    except labserve.InputError:
        return
    assert isinstance(arr, np.ndarray) and arr.nbytes <= len(body)


@FUZZ
@given(
    request=v2_requests, tail=st.binary(max_size=32), header_length=st.none() | st.integers(-1, 400)
)
def test_the_v2_decoder_decodes_or_says_why(request, tail, header_length):
    head = json.dumps(request).encode()
    length = None if header_length is None else str(header_length)
    try:
        decode_request(head + tail, length)
    except labserve.InputError:
        pass


@FUZZ
@given(
    body=st.one_of(
        json_values.map(lambda v: json.dumps(v).encode()),
        rows.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=48),
    )
)
def test_the_simple_route_answers_any_json_with_2xx_or_a_json_4xx(server, conn, body):
    answered_well(*send(conn, "/runners/echo/predict", body, {"Content-Type": "application/json"}))


@FUZZ
@given(body=npy_bodies)
def test_the_simple_route_answers_any_npy_with_2xx_or_a_json_4xx(server, conn, body):
    answered_well(*send(conn, "/runners/echo/predict", body, {"Content-Type": "application/x-npy"}))


@FUZZ
@given(
    request=v2_requests,
    tail=st.binary(max_size=32),
    framing=st.sampled_from(["json", "exact", "short", "long", "junk"]),
)
def test_the_v2_route_answers_any_body_and_framing_with_2xx_or_a_json_4xx(
    server, conn, request, tail, framing
):
    head = json.dumps(request).encode()
    headers = {"Content-Type": "application/json"}
    if framing != "json":
        headers["Content-Type"] = "application/octet-stream"
        headers["Inference-Header-Content-Length"] = {
            "exact": str(len(head)),
            "short": str(max(0, len(head) - 3)),
            "long": str(len(head) + len(tail) + 5),
            "junk": "1e3",
        }[framing]
    body = head + (tail if framing != "json" else b"")
    answered_well(*send(conn, "/v2/models/echo/infer", body, headers))


def test_the_server_still_serves_after_the_fuzz(server, conn):
    status, _, body = send(
        conn, "/runners/echo/predict", b"[[1.5, 2]]", {"Content-Type": "application/json"}
    )
    assert status == 200 and json.loads(body) == [[1.5, 2.0]]


header_text = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\r\n"),
    max_size=12,
)


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PATCH", "PUT", "OPTIONS", "DELETE", "BREW", ""]),
    path=st.sampled_from(["/runners/echo/predict", "/v2/models/echo/infer", "/config", "/stats"])
    | header_text.map(lambda t: "/" + t),
    headers=st.dictionaries(
        st.sampled_from(
            [
                "Host",
                "Origin",
                "Content-Type",
                "Content-Length",
                "Transfer-Encoding",
                "Authorization",
                "Inference-Header-Content-Length",
                "X-Other",
            ]
        ),
        header_text,
        max_size=5,
    ),
    body=st.binary(max_size=24),
)
def test_any_request_line_and_headers_get_an_answer_below_500_or_a_close(
    server, method, path, headers, body
):
    head = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    if "Host" not in headers:
        head.append(f"Host: 127.0.0.1:{server.port}")
    raw = ("\r\n".join([*head, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)  # a body shorter than announced ends here
        reply = b""
        while chunk := sock.recv(65536):  # a hang is a socket timeout: a failure
            reply += chunk
    if reply:  # tornado closes without a word on a request it cannot parse
        status = int(reply.split(b" ", 2)[1])
        assert status < 500, reply[:300]
