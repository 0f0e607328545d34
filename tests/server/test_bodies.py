"""Bodies a newcomer sends: GET /config's shape back to PATCH, a 1-D row, arrays by name.

Real sockets (urllib), a real runner; each reply's status and words checked.
"""

import json
import re
import urllib.error
import urllib.request

import numpy as np
import pytest

import labserve
from labserve.server import serve


class Model(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=16, max_latency_ms=2)
    def rows(self, x):
        return np.asarray(x.sum(axis=1, keepdims=True))  # rows of features

    @labserve.method(
        batchable=True, max_latency_ms=2, input_spec=labserve.TensorSpec("float32", (4,))
    )
    def declared(self, x):
        return x

    @labserve.method(batchable=True, max_latency_ms=2)
    def scale(self, x):
        return x * 2  # takes any shape: a 1-D body is rows of one value

    @labserve.method(batchable=True, max_latency_ms=2)
    def pair(self, a, b, c=None):
        return a - b if c is None else a - b + c

    @labserve.method(batchable=True, max_latency_ms=2)
    def mapping(self, inputs):
        return inputs["left"] + inputs["right"]


@pytest.fixture(scope="module")
def served():
    runner = labserve.Runner(Model, name="m")
    server = serve(runner)
    yield server
    server.stop()
    runner.stop()


def call(server, path, body=None, method=None, token=False):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {server.token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def test_patch_config_takes_back_what_get_config_returns(served):
    status, configs = call(served, "/config")
    assert status == 200 and configs["m"]["rows"]["max_batch_size"] == 16
    configs["m"]["rows"]["max_batch_size"] = 4  # the whole body back, one value changed
    status, reply = call(served, "/config", configs, "PATCH", token=True)
    assert status == 200, reply
    assert reply["m"]["rows"]["max_batch_size"] == 4
    assert reply["m"]["scale"] == configs["m"]["scale"]  # the rest as it was
    assert call(served, "/config")[1] == reply


def test_patch_config_checks_every_change_before_applying_any(served):
    before = call(served, "/config")[1]
    body = {"m": {"scale": {"max_latency_ms": 7}, "rows": {"max_batch_size": 0}}}
    status, reply = call(served, "/config", body, "PATCH", token=True)
    assert status == 422 and "max_batch_size must be an integer >= 1" in reply["detail"]
    assert call(served, "/config")[1] == before  # scale's change was not applied either


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"m": {"nope": {"max_batch_size": 2}}}, 404, "no batchable method 'm.nope'"),
        ({"other": {"rows": {"max_batch_size": 2}}}, 404, "served: m.rows"),
        ({"m": {"rows": 3}}, 400, "must be an object of settings"),
        ({"m": [1]}, 400, "must be an object of methods' settings"),
        ({}, 400, "names no method"),
        ({"m": {"rows": {"max_bach_size": 2}}}, 422, "max_bach_size"),
    ],
)
def test_a_patch_that_misses_says_what_there_is(served, body, status, words):
    got, reply = call(served, "/config", body, "PATCH", token=True)
    assert (got, words in reply["detail"]) == (status, True), reply


def test_a_setting_sent_alone_is_told_the_shapes_and_the_flat_one_it_names_works(served):
    status, reply = call(served, "/config", {"max_latency_ms": 3}, "PATCH", token=True)
    assert status == 400, reply
    flat = re.search(r"flat, (\{.*?\}), or GET /config's shape, (\{.*\})$", reply["detail"])
    assert flat, reply["detail"]
    body = json.loads(flat[1])
    assert body["max_latency_ms"] == 3 and json.loads(flat[2]) == {
        "m": {body["method"]: {"max_latency_ms": 3}}
    }
    status, reply = call(served, "/config", body, "PATCH", token=True)
    assert status == 200 and reply["m"][body["method"]]["max_latency_ms"] == 3


def test_the_flat_patch_needs_no_runner_when_one_is_served(served):
    status, reply = call(
        served, "/config", {"method": "scale", "max_latency_ms": 3}, "PATCH", token=True
    )
    assert status == 200 and reply["m"]["scale"]["max_latency_ms"] == 3


def test_a_1d_body_to_a_method_of_rows_is_a_400_naming_the_shape(served):
    status, reply = call(served, "/runners/m/rows", [1, 2, 3, 4], "POST")
    assert (status, reply["error"]) == (400, "InputError"), reply
    assert "1-D body (int64[4])" in reply["detail"] and "[[...]]" in reply["detail"]
    assert call(served, "/runners/m/rows", [[1, 2, 3, 4]], "POST") == (200, [[10]])


def test_a_1d_body_to_a_declared_2d_method_is_a_400_naming_both_shapes(served):
    status, reply = call(served, "/runners/m/declared", [1, 2, 3, 4], "POST")
    assert (status, reply["error"]) == (400, "InputError")
    assert "sent int64[4], expected float32[N, 4]" in reply["detail"]


def test_a_1d_body_a_method_takes_is_served(served):
    assert call(served, "/runners/m/scale", [1, 2, 3], "POST") == (200, [2, 4, 6])


def test_named_arrays_are_the_methods_parameters_by_name(served):
    # Sent in another order than the parameters': matched by name, not by position.
    assert call(served, "/runners/m/pair", {"b": [[1]], "a": [[5]]}, "POST") == (200, [[4]])
    got = call(served, "/runners/m/pair", {"c": [[10]], "a": [[5]], "b": [[1]]}, "POST")
    assert got == (200, [[14]])
    status, reply = call(served, "/runners/m/pair", {"a": [[5]], "c": [[1]]}, "POST")
    assert status == 400 and "takes its inputs in the order a, b, c" in reply["detail"]
    assert "but not b" in reply["detail"]


def test_an_object_of_other_names_is_the_one_argument(served):
    body = {"left": [[1, 2]], "right": [[3, 4]]}
    assert call(served, "/runners/m/mapping", body, "POST") == (200, [[4, 6]])


def test_too_many_inputs_in_process_fail_alone_at_admission():
    runner = labserve.Runner(Model, name="solo")  # "m" (served above) would be replaced
    try:
        with pytest.raises(labserve.InputError, match=r"solo\.scale cannot take 2 inputs"):
            runner.scale.run(np.ones((1, 1)), np.ones((1, 1)))
        assert runner.stats("scale").admitted == 0  # refused before the queue
        assert runner.scale.run(np.ones((1, 1))).tolist() == [[2.0]]
    finally:
        runner.stop()


def test_an_object_of_other_names_a_method_fails_on_is_a_400_naming_its_parameters(served):
    # Found by schemathesis: such an object is the one argument, and x * 2 fails on a dict.
    status, reply = call(served, "/runners/m/scale", {"y": [[1]]}, "POST")
    assert (status, reply["error"]) == (400, "InputError"), reply
    assert "object named 'y', which are not its parameters (x)" in reply["detail"]
