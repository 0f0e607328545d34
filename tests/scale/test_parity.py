"""One HTTP core: the tornado server and Ray's proxy answer the same requests the same way.

Each request goes to both over real sockets; status, JSON body and the headers a client
reads (Content-Type, Retry-After, CORS) must agree, and the status must be the one the
case expects (so that both being wrong the same way fails too). ``/stats`` and
``/metrics`` are the two routes whose bodies differ by design (Ray's merge replicas).
"""

# ruff: noqa: E501 (the cases read as a table, one a line)

from __future__ import annotations

import json
import sys

import pytest
import ray.cloudpickle

import labserve
import labserve.ray
from labserve.server import serve

LIMIT = 4096
TOKEN = "sesame"
ALLOWED = "https://app.example"
JSON_TYPE = {"Content-Type": "application/json"}
AUTH = {**JSON_TYPE, "Authorization": f"Bearer {TOKEN}"}


class Parity(labserve.Runnable):
    @labserve.method(
        batchable=True,
        max_batch_size=16,
        max_latency_ms=5,
        input_spec=labserve.TensorSpec("float64", (3,)),
        output_spec=labserve.TensorSpec("float64", (1,)),
    )
    def predict(self, x):
        return x.sum(axis=1, keepdims=True)

    @labserve.method(batchable=True, max_latency_ms=5)
    def pair(self, a, b):
        return a - b

    @labserve.method(batchable=True, max_latency_ms=5)
    def rows(self, x):
        return x.sum(axis=1, keepdims=True)  # rows of features: a 1-D body has none


def tensor(data, shape, name="input__0"):
    return {"name": name, "datatype": "FP64", "shape": shape, "data": data}


def v2(*inputs):
    return json.dumps({"inputs": list(inputs)}).encode()


CASES = [
    # (name, method, path, body, headers, expected status)
    ("simple", "POST", "/runners/par/predict", b"[[1, 2, 3]]", JSON_TYPE, 200),
    ("wrong shape", "POST", "/runners/par/predict", b"[[1, 2]]", JSON_TYPE, 400),
    ("by name", "POST", "/runners/par/pair", b'{"b": [[2]], "a": [[5]]}', JSON_TYPE, 200),
    ("a name missing", "POST", "/runners/par/pair", b'{"b": [[2]]}', JSON_TYPE, 400),
    ("1-D body", "POST", "/runners/par/rows", b"[1, 2, 3, 4]", JSON_TYPE, 400),
    ("bad JSON", "POST", "/runners/par/predict", b"[[1", JSON_TYPE, 400),
    ("not numbers", "POST", "/runners/par/rows", b'[["a"]]', JSON_TYPE, 400),
    ("no runner", "POST", "/runners/nope/predict", b"[[1]]", JSON_TYPE, 404),
    ("no method", "POST", "/runners/par/nope", b"[[1]]", JSON_TYPE, 404),
    ("GET on infer", "GET", "/runners/par/predict", b"", {}, 405),
    ("no route", "GET", "/nowhere", b"", {}, 404),
    ("text/plain", "POST", "/runners/par/predict", b"[[1, 2, 3]]", {"Content-Type": "text/plain"}, 415),
    ("oversized", "POST", "/runners/par/predict", b"[" * (LIMIT + 1), JSON_TYPE, 413),
    ("foreign Host", "POST", "/runners/par/predict", b"[[1, 2, 3]]", {**JSON_TYPE, "Host": "evil.example"}, 403),
    ("foreign Origin", "GET", "/healthz", b"", {"Origin": "http://evil.example"}, 403),
    ("allowed Origin", "POST", "/runners/par/predict", b"[[1, 2, 3]]", {**JSON_TYPE, "Origin": ALLOWED}, 200),
    ("preflight", "OPTIONS", "/runners/par/predict", b"", {"Origin": ALLOWED}, 204),
    ("healthz", "GET", "/healthz", b"", {}, 200),
    ("index", "GET", "/", b"", {}, 200),
    ("openapi", "GET", "/openapi.json", b"", {}, 200),
    ("config", "GET", "/config", b"", {}, 200),
    ("v2 server", "GET", "/v2", b"", {}, 200),
    ("v2 live", "GET", "/v2/health/live", b"", {}, 200),
    ("v2 ready", "GET", "/v2/health/ready", b"", {}, 200),
    ("v2 metadata", "GET", "/v2/models/par.predict", b"", {}, 200),
    ("v2 versioned", "GET", "/v2/models/par.predict/versions/1", b"", {}, 200),
    ("v2 model ready", "GET", "/v2/models/par.predict/ready", b"", {}, 200),
    ("v2 no model", "GET", "/v2/models/nope", b"", {}, 404),
    ("v2 infer", "POST", "/v2/models/par.predict/infer", v2(tensor([1, 2, 3], [1, 3])), JSON_TYPE, 200),
    ("v2 two inputs", "POST", "/v2/models/par.rows/infer", v2(tensor([1], [1, 1]), tensor([1], [1, 1], "b")), JSON_TYPE, 400),
    ("v2 bad tensor", "POST", "/v2/models/par.predict/infer", v2(tensor([1, 2], [1, 3])), JSON_TYPE, 400),
    ("v2 oversized", "POST", "/v2/models/par.predict/infer", b"{" * (LIMIT + 1), JSON_TYPE, 413),
    ("v1 models", "GET", "/v1/models", b"", {}, 200),
    ("v1 no model", "POST", "/v1/completions", b'{"model": "par", "prompt": "a"}', JSON_TYPE, 404),
    ("v1 unsupported", "POST", "/v1/chat/completions", b'{"model": "par", "messages": [], "n": 2}', JSON_TYPE, 400),
    ("v1 text/plain", "POST", "/v1/completions", b"{}", {"Content-Type": "text/plain"}, 415),
    ("PATCH no token", "PATCH", "/config", b'{"par": {"predict": {"max_latency_ms": 6}}}', JSON_TYPE, 401),
    ("PATCH bad value", "PATCH", "/config", b'{"par": {"predict": {"max_batch_size": 0}}}', AUTH, 422),
    ("PATCH unknown key", "PATCH", "/config", b'{"par": {"predict": {"nope": 1}}}', AUTH, 422),
    ("PATCH no method", "PATCH", "/config", b'{"par": {"nope": {"max_latency_ms": 6}}}', AUTH, 404),
    ("PATCH", "PATCH", "/config", b'{"par": {"predict": {"max_latency_ms": 6}}}', AUTH, 200),
    ("PATCH flat", "PATCH", "/config", b'{"method": "pair", "max_batch_size": 8}', AUTH, 200),
]  # fmt: skip

READ_HEADERS = ("content-type", "retry-after", "access-control-allow-origin", "vary")


@pytest.fixture(scope="module")
def both(ray_cluster):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the replicas import no tests
    # Written with a trailing slash: both servers keep origins alike (without it).
    options = {"max_body_bytes": LIMIT, "token": TOKEN, "allow_origin": ALLOWED + "/"}
    app = labserve.ray.deploy(Parity, name="par", **options)
    runner = labserve.Runner(Parity, name="par")
    server = serve(runner, **options)
    yield {"tornado": server.port, "ray": ray_cluster.port}
    server.stop()
    runner.stop()
    app.stop()


def answer(raw_http, port, method, path, body, headers):
    # One Host for both (a loopback name without the port), so GET /'s examples agree.
    status, head, raw = raw_http(port, method, path, body, {"Host": "localhost", **headers})
    data = json.loads(raw) if raw and "json" in head.get("content-type", "") else raw
    return status, {k: head[k] for k in READ_HEADERS if k in head}, data


def test_the_cases_cover_what_the_issue_names():
    names = " ".join(c[0] for c in CASES)
    for kind in ("simple", "v2", "metadata", "bad", "Host", "Origin", "oversized", "token"):
        assert kind in names


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_tornado_and_ray_answer_alike(both, raw_http, method, path, body, headers, status):
    tornado = answer(raw_http, both["tornado"], method, path, body, headers)
    through_ray = answer(raw_http, both["ray"], method, path, body, headers)
    assert tornado[0] == status, tornado
    assert through_ray == tornado


def test_v2_metadata_lists_the_declared_tensors_through_ray(both, raw_http):
    _, _, meta = answer(raw_http, both["ray"], "GET", "/v2/models/par.predict", b"", {})
    assert meta["inputs"] == [{"name": "input__0", "datatype": "FP64", "shape": [-1, 3]}]
    assert meta["outputs"] == [{"name": "output__0", "datatype": "FP64", "shape": [-1, 1]}]


def test_both_servers_refuse_a_bad_allow_origin_alike(ray_cluster):
    runner = labserve.Runner(Parity, name="origins")  # "par" (served above) would be replaced
    try:
        for start in (
            lambda: serve(runner, allow_origin=[None]),
            lambda: labserve.ray.deploy(Parity, name="bad", allow_origin=[None]),
        ):
            with pytest.raises(ValueError, match="allow_origin must be a string or strings"):
                start()
    finally:
        runner.stop()
