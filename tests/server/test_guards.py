"""What a page in the user's browser, or a DNS-rebinding name, can make the server do: nothing.

Real sockets, exact headers: the Origin check, the Host check, Content-Type per route, and
the token never written to a log.
"""

import json
import logging

import pytest

import labserve
from labserve.server import serve


class Counting(labserve.Runnable):
    def __init__(self):
        self.calls = 0

    @labserve.method(batchable=True, max_latency_ms=1)
    def predict(self, x):
        self.calls += 1
        return x * 2


@pytest.fixture
def model():
    return Counting()


@pytest.fixture
def served(model):
    runner = labserve.Runner(model, name="m")
    server = serve(runner)
    yield server
    server.stop()
    runner.stop()


def error_of(reply):
    status, headers, body = reply
    assert headers["content-type"] == "application/json", (status, body)
    error = json.loads(body)
    assert set(error) == {"error", "detail"}
    return status, error


def test_a_cross_origin_text_plain_post_does_not_run_the_model(served, model, raw_http):
    # What a page on another site can send with fetch() and no preflight.
    reply = raw_http(
        served.port,
        "POST",
        "/runners/m/predict",
        b"[[1.0]]",
        {"Content-Type": "text/plain", "Origin": "http://evil.example"},
    )
    status, error = error_of(reply)
    assert (status, error["error"]) == (403, "OriginError")
    assert "http://evil.example" in error["detail"]
    assert model.calls == 0


def test_a_text_plain_post_from_no_page_is_415_and_does_not_run_the_model(served, model, raw_http):
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        status, error = error_of(
            raw_http(served.port, "POST", "/runners/m/predict", b"[[1]]", headers)
        )
        assert (status, error["error"]) == (415, "UnsupportedMediaTypeError")
        assert "application/json" in error["detail"] and "application/x-npy" in error["detail"]
    assert model.calls == 0


def test_the_v2_route_takes_json_binary_or_no_content_type_and_refuses_others(served, raw_http):
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    ).encode()
    for content_type, status in (
        ("application/json", 200),
        ("application/octet-stream", 200),
        (None, 200),
        ("text/plain", 415),
    ):
        headers = {"Content-Type": content_type} if content_type else {}
        reply = raw_http(served.port, "POST", "/v2/models/m/infer", body, headers)
        assert reply[0] == status, (content_type, reply)


def test_same_origin_and_allowed_origins_are_served_with_cors(model, raw_http):
    runner = labserve.Runner(model, name="m")
    server = serve(runner, allow_origin="https://app.example")
    try:
        body, json_type = b"[[1.0]]", {"Content-Type": "application/json"}
        own = {**json_type, "Origin": f"http://127.0.0.1:{server.port}"}
        assert raw_http(server.port, "POST", "/runners/m/predict", body, own)[0] == 200
        allowed = {**json_type, "Origin": "https://app.example"}
        status, headers, _ = raw_http(server.port, "POST", "/runners/m/predict", body, allowed)
        assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
        preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
        status, headers, _ = raw_http(server.port, "OPTIONS", "/runners/m/predict", b"", preflight)
        assert status == 204 and "Content-Type" in headers["access-control-allow-headers"]
        other = {**json_type, "Origin": "https://other.example"}
        assert raw_http(server.port, "POST", "/runners/m/predict", body, other)[0] == 403
    finally:
        server.stop()
        runner.stop()


@pytest.mark.parametrize("path", ["/healthz", "/stats", "/v2/health/ready", "/runners/m/predict"])
def test_a_dns_rebinding_host_is_refused_on_every_route(served, raw_http, path):
    method = "POST" if path.startswith("/runners") else "GET"
    reply = raw_http(
        served.port,
        method,
        path,
        b"[[1]]",
        {"Host": "rebind.evil.example", "Content-Type": "application/json"},
    )
    status, error = error_of(reply)
    assert (status, error["error"].split(":")[0]) == (403, "HostError")  # v2 adds the message
    assert "rebind.evil.example" in error["detail"]


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:1234", "127.0.0.1", "127.0.0.5:80", "[::1]:8080"]
)
def test_loopback_hosts_are_served(served, raw_http, host):
    assert raw_http(served.port, "GET", "/healthz", b"", {"Host": host})[0] == 200


def test_allow_hosts_opens_a_name_on_purpose(model, raw_http):
    runner = labserve.Runner(model, name="m")
    server = serve(runner, allow_hosts=["lab.example"])
    try:
        assert raw_http(server.port, "GET", "/healthz", b"", {"Host": "Lab.Example:80"})[0] == 200
        assert raw_http(server.port, "GET", "/healthz", b"", {"Host": "evil.example"})[0] == 403
    finally:
        server.stop()
        runner.stop()


def test_a_token_in_the_query_is_never_logged(served, raw_http, caplog):
    secret = served.token
    with caplog.at_level(logging.DEBUG):
        raw_http(
            served.port,
            "PATCH",
            f"/config?token={secret}",
            b"[",
            {"Content-Type": "application/json"},
        )
        raw_http(served.port, "GET", f"/nowhere?a=1&token={secret}")
        raw_http(served.port, "GET", f"/nowhere?tok%65n={secret}")  # decoded as token=
        raw_http(served.port, "GET", f"/runners/m/predict?token={secret}")  # 405, from tornado
        raw_http(
            served.port,
            "POST",
            f"/runners/m/predict?token={secret}",
            b"{",
            {"Content-Type": "application/json"},
        )
    logged = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records)
    assert "/nowhere" in logged  # the errors were logged ...
    assert secret not in logged  # ... without the token


def test_the_new_server_options_are_validated(model):
    runner = labserve.Runner(model, name="m")
    try:
        with pytest.raises(ValueError, match="max_connections must be an integer >= 1"):
            labserve.Server(runner, max_connections=0)
        with pytest.raises(ValueError, match="idle_timeout_s must be a number of seconds > 0"):
            labserve.Server(runner, idle_timeout_s=-1)
        with pytest.raises(ValueError, match="allow_origin must be a string or strings"):
            labserve.Server(runner, allow_origin=[None])
    finally:
        runner.stop()


def test_a_refused_request_declaring_a_huge_body_is_answered_before_the_body(served):
    from labserve.server.exchange import DISCARD_BYTES
    from tests.conftest import raw_request

    huge = 16 * 1024 * 1024 + DISCARD_BYTES + 1  # past serve()'s default limit and the drain
    head = (
        f"PATCH /config HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {huge}\r\nConnection: close\r\n\r\n"
    ).encode()
    status, error = error_of(raw_request(served.port, head))  # no body sent: none is read
    assert (status, error["error"]) == (401, "UnauthorizedError")  # the token comes first
