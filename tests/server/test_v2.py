import json
import urllib.error
import urllib.request

import numpy as np
import pytest

import labserve

httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException


class Doubler(labserve.Runnable):
    @labserve.method(
        batchable=True,
        input_spec=labserve.TensorSpec("float32", (4,)),
        output_spec=labserve.TensorSpec("float32", (4,)),
    )
    def predict(self, x):
        return x * 2


class Pair(labserve.Runnable):
    @labserve.method(batchable=True)
    def predict(self, a, b):
        return {"sum": a + b, "diff": a - b}


@pytest.fixture
def server():
    runners = [labserve.Runner(Doubler, name="doubler"), labserve.Runner(Pair, name="pair")]
    srv = labserve.serve(runners)
    yield srv
    srv.stop()
    for r in runners:
        r.stop()


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    yield c
    c.close()


def test_health_and_metadata_through_tritonclient(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("doubler") and client.is_model_ready("doubler.predict")
    meta = client.get_model_metadata("doubler")
    assert meta["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "output__0", "datatype": "FP32", "shape": [-1, 4]}]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_json_and_binary_tensors(client, binary):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = httpclient.InferInput("input__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("output__0", binary_data=binary)
    result = client.infer("doubler", [inp], outputs=[out])
    np.testing.assert_array_equal(result.as_numpy("output__0"), x * 2)


def test_infer_with_default_outputs_and_named_dict_outputs(client):
    a = np.array([[5], [7]], dtype=np.int64)
    b = np.array([[1], [2]], dtype=np.int64)
    inputs = []
    for name, arr in (("a", a), ("b", b)):
        inp = httpclient.InferInput(name, list(arr.shape), "INT64")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer("pair", inputs)  # no outputs named: all of them, binary by default
    np.testing.assert_array_equal(result.as_numpy("sum"), a + b)
    np.testing.assert_array_equal(result.as_numpy("diff"), a - b)


def test_a_wrong_shape_is_a_400_that_names_both_shapes(client, server):
    inp = httpclient.InferInput("input__0", [2, 3], "FP32")
    inp.set_data_from_numpy(np.ones((2, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("doubler", [inp])
    assert "400" in str(info.value.status()) and "expected float32[N, 4]" in info.value.message()
    # Unknown model: 404, and the server still answers.
    req = urllib.request.Request(server.url + "/v2/models/nope")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    with err.value:
        assert err.value.code == 404 and "no model 'nope'" in json.loads(err.value.read())["detail"]
    assert client.is_model_ready("doubler")
