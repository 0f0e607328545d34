"""Ragged JSON rows over real HTTP: a padded method takes them, any other says why not."""

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

import labserve
from labserve.server import serve


class Model(labserve.Runnable):
    @labserve.method(
        batchable=True,
        max_latency_ms=1,
        max_batch_tokens=64,
        pad=labserve.Padding(axis=1, output_axis={"running": 1}),
    )
    def encode(self, ids, lengths):
        mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        kept = np.where(mask, ids, 0)
        return {"running": np.cumsum(kept, axis=1), "total": kept.sum(axis=1)}

    @labserve.method(batchable=True, max_latency_ms=1)
    def plain(self, x):
        return x


@pytest.fixture(scope="module")
def served():
    runner = labserve.Runner(Model, name="m")
    server = serve(runner)
    yield server
    server.stop()
    runner.stop()


def post(server, path, body, method="POST", headers=None):
    req = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_ragged_json_rows_are_padded_and_each_row_comes_back_its_own_length(served):
    status, body = post(served, "/runners/m/encode", [[1, 2, 3], [4], [5, 6]])
    assert status == 200
    assert body["running"] == [[1, 3, 6], [4], [5, 11]]
    assert body["total"] == [6, 4, 11]


def test_rectangular_rows_still_come_back_as_one_array(served):
    status, body = post(served, "/runners/m/encode", [[1, 1], [2, 2]])
    assert status == 200
    assert body == {"running": [[1, 2], [2, 4]], "total": [2, 4]}


def test_a_method_without_a_ragged_axis_refuses_ragged_rows_naming_pad(served):
    status, body = post(served, "/runners/m/plain", [[1, 2, 3], [4]])
    assert status == 400
    assert "rows of different lengths [3, 1]" in body["detail"]
    assert "pad=" in body["detail"]


def test_ragged_rows_whose_other_axes_differ_are_a_400(served):
    status, body = post(served, "/runners/m/encode", [[[1, 2]], [[1, 2, 3], [4, 5, 6]]])
    assert status == 400
    assert "does not match row 0" in body["detail"]


def test_a_row_over_the_token_budget_is_a_400_naming_its_length_and_the_budget(served):
    status, body = post(served, "/runners/m/encode", [[1] * 65])
    assert status == 400 and body["error"] == "TokenBudgetError"
    assert "length 65" in body["detail"] and "max_batch_tokens=64" in body["detail"]


def test_patch_config_turns_buckets_the_budget_and_padding_live(served):
    auth = {"Authorization": f"Bearer {served.token}"}
    change = {"runner": "m", "method": "encode", "length_buckets": [4, 16], "padding": False}
    status, body = post(served, "/config", change, "PATCH", auth)
    assert status == 200
    assert body["m"]["encode"]["length_buckets"] == [4, 16]
    assert body["m"]["encode"]["padding"] is False
    bad = {"runner": "m", "method": "encode", "length_buckets": [16, 4]}
    status, body = post(served, "/config", bad, "PATCH", auth)
    assert status == 422 and "increasing integers" in body["detail"]
    post(served, "/config", {"runner": "m", "method": "encode", "padding": True}, "PATCH", auth)


def test_stats_and_metrics_show_tokens_and_padding(served):
    post(served, "/runners/m/encode", [[1, 2, 3, 4], [5]])
    with urllib.request.urlopen(served.url + "/stats", timeout=30) as reply:
        stats = json.loads(reply.read())["m"]["encode"]
    assert stats["tokens_total"] >= 8 and stats["padding_tokens_total"] >= 3
    assert 0 < stats["padding_fraction"] < 1
    with urllib.request.urlopen(served.url + "/metrics", timeout=30) as reply:
        metrics = reply.read().decode()
    assert 'labserve_padding_ratio{method="encode",runner="m"}' in metrics
