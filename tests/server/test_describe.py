"""What the server says it serves: ``GET /`` for a person, ``/openapi.json`` for tools.

Real sockets: the example curl of ``GET /`` is run as printed, the OpenAPI document is
checked against the route table, and schemathesis fuzzes every route it describes.
"""

import json
import shlex
import shutil
import subprocess
import urllib.request

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import labserve
from labserve.server import serve
from labserve.server.core import TABLE

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402 (after the importorskip)


class Model(labserve.Runnable):
    # Overflow is the model's business (inf is sent as null): under pytest's warnings as
    # errors, numpy's RuntimeWarning would otherwise be the model raising.
    @labserve.method(batchable=True, max_latency_ms=1)
    @np.errstate(all="ignore")
    def predict(self, x):
        return x * 2

    @labserve.method(
        batchable=True, max_latency_ms=1, input_spec=labserve.TensorSpec("float64", (3,))
    )
    @np.errstate(all="ignore")
    def strict(self, x):
        return x.sum(axis=1, keepdims=True)

    @labserve.method(batchable=True, max_latency_ms=1)
    @np.errstate(all="ignore")
    def rows(self, x):
        return x.sum(axis=1, keepdims=True)

    @labserve.method(batchable=True, max_latency_ms=1)
    def pair(self, a, b):
        return a  # b's shape may not broadcast with a's: that would be this model's 500


@pytest.fixture(scope="module")
def served():
    runner = labserve.Runner(Model, name="m")
    server = serve(runner, max_body_bytes=64 * 1024)
    yield server
    server.stop()
    runner.stop()


def get_json(server, path):
    with urllib.request.urlopen(server.url + path, timeout=10) as reply:
        assert reply.headers["Content-Type"] == "application/json"
        return json.loads(reply.read())


def test_the_index_names_every_method_its_routes_and_an_example_that_works(served):
    index = get_json(served, "/")
    methods = index["runners"]["m"]
    assert set(methods) == {"predict", "strict", "rows", "pair"}
    assert methods["strict"]["route"] == "/runners/m/strict"
    assert methods["strict"]["v2_models"] == ["m.strict"]
    assert methods["pair"]["parameters"] == ["a", "b"]
    routes = {(r["method"], r["path"]) for r in index["routes"]}
    assert ("PATCH", "/config") in routes and ("POST", "/v2/models/{model}/infer") in routes
    assert index["openapi"] == "/openapi.json"
    if shutil.which("curl") is None:
        pytest.skip("no curl to run the examples with")
    for name, method in methods.items():
        argv = [*shlex.split(method["example"]), "-s", "-w", "\n%{http_code}"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
        body, status = out.stdout.rsplit("\n", 1)
        assert status == "200", (name, method["example"], body)


def test_the_openapi_document_describes_every_route_the_server_matches(served):
    doc = get_json(served, "/openapi.json")
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {route.template for route in TABLE}
    for route in TABLE:
        assert set(doc["paths"][route.template]) == {v.lower() for v in route.verbs}
    infer = doc["paths"]["/runners/{runner}/{method}"]["post"]
    assert set(infer["requestBody"]["content"]) == {"application/json", "application/x-npy"}
    runner = next(p for p in infer["parameters"] if p["name"] == "runner")
    assert runner["schema"]["enum"] == ["m"]
    assert doc["paths"]["/config"]["patch"]["security"] == [{"token": []}]


def test_no_route_answers_a_500_to_what_its_schema_allows(served):
    # Each operation of the document, a short Hypothesis run of the cases schemathesis draws
    # from it (its pytest fixture loader does not run on this pytest: the loop is ours).
    schema = schemathesis.openapi.from_url(served.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    described = {f"{verb} {route.template}" for route in TABLE for verb in route.verbs}
    # schemathesis leaves out the document's own route.
    assert {op.label for op in operations} == described - {"GET /openapi.json"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
        def no_500(case):
            # With the token, so that PATCH /config is exercised past the 401 too.
            case.call_and_validate(
                headers={"Authorization": f"Bearer {served.token}"}, checks=[not_a_server_error]
            )

        no_500()


def test_a_runner_with_both_kinds_describes_each_with_an_example_that_works():
    from labserve.lab.demo import TinyLM

    class Both(TinyLM):
        @labserve.method(batchable=True, max_latency_ms=1)
        def score(self, x):
            return x.sum(axis=1, keepdims=True)

    runner = labserve.Runner(Both, name="both")
    server = serve(runner)
    try:
        methods = get_json(server, "/")["runners"]["both"]
        assert methods["score"]["route"] == "/runners/both/score"
        generate = methods["generate"]
        assert generate["generative"] and generate["model"] == "both"
        assert generate["routes"] == ["/v1/completions", "/v1/chat/completions"]
        if shutil.which("curl") is not None:
            for name, method in methods.items():
                argv = [*shlex.split(method["example"]), "-s", "-w", "\n%{http_code}"]
                out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
                body, status = out.stdout.rsplit("\n", 1)
                assert status == "200", (name, method["example"], body)
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=generate["openai_base_url"], api_key="unused")
        done = client.completions.create(model=generate["model"], prompt="Hi", max_tokens=3)
        assert done.usage.completion_tokens == 3
    finally:
        server.stop()
        runner.stop()
