import logging

import numpy as np
import pytest

import labserve
from labserve.base.vocabulary import OUTCOMES
from labserve.lab.demo import SleepModel
from labserve.load.arrivals import ConstantArrivals
from labserve.load.http import HttpTarget

X = np.ones((1, 4), np.float32)
# A busy test machine may delay sends; the warning is tested in test_generator.py.
pytestmark = pytest.mark.filterwarnings("ignore::labserve.LoadWarning")


class Checked(labserve.Runnable):
    """Declares its input, so the v2 metadata names it; records what arrived."""

    def __init__(self):
        self.seen = []

    @labserve.method(batchable=True, input_spec=labserve.TensorSpec("float32", (4,)))
    def predict(self, x):
        self.seen.append((x.dtype.name, x.shape))
        return x * 2


@pytest.fixture
def served():
    runner = labserve.Runner(SleepModel(a_ms=0.5, b_ms=0.0), name="m", on_overload="wait")
    server = labserve.serve(runner)
    yield runner, server
    server.stop()
    runner.stop()


def kinds(result):
    codes, counts = np.unique(result.outcome, return_counts=True)
    return {OUTCOMES[o]: int(c) for o, c in zip(codes, counts, strict=True)}


def test_closed_loop_over_http_sees_the_servers_batching(served, caplog):
    _, server = served
    caplog.set_level(logging.WARNING)
    result = labserve.load_test(
        f"{server.url}/runners/m/predict", example=X, duration_s=0.5, concurrency=8
    )
    n = len(result.arrival_s)
    assert n > 0 and kinds(result) == {"served": n}
    view = result.server
    assert view is not None and (view["runner"], view["method"]) == ("m", "predict")
    assert view["served"] == n  # the server's count of the same interval
    assert view["batches"] > 0 and 1 <= view["max_batch"] <= 8
    assert sum(view["fire_reasons"].values()) == view["batches"]
    s = result.summary()
    assert s["batches"] == view["batches"] and s["server_served"] == n
    assert s["mean_batch"] == pytest.approx(n / view["batches"])
    assert np.isfinite(s["queue_wait_p50_ms"])
    assert not [r for r in caplog.records if r.name == "asyncio"]


def test_open_loop_over_v2_with_binary_tensors_from_the_metadata():
    model = Checked()
    runner = labserve.Runner(model, name="checked", on_overload="wait")
    server = labserve.serve(runner)
    try:
        result = labserve.load_test(
            f"{server.url}/v2/models/checked/infer",
            duration_s=0.3,
            arrivals=ConstantArrivals(100),
            binary=True,
        )
        stats = runner.stats("predict")
    finally:
        server.stop()
        runner.stop()
    n = len(result.arrival_s)
    assert n == 30 and kinds(result) == {"served": n}
    # No example given: one FP32 row of 4 per request, from the model's metadata.
    assert {d for d, _ in model.seen} == {"float32"}
    assert sum(shape[0] for _, shape in model.seen) == n
    assert stats.served == n and result.server["served"] == n
    assert result.send_lag_s is not None and len(result.send_lag_s) == n


def test_a_v2_example_is_cast_to_the_metadatas_datatype_and_checked_against_its_shape():
    model = Checked()
    runner = labserve.Runner(model, name="checked", on_overload="wait")
    server = labserve.serve(runner)
    url = f"{server.url}/v2/models/checked/infer"
    try:
        result = labserve.load_test(
            url, example=np.ones((2, 4), np.float64), duration_s=0.2, concurrency=2
        )
        with pytest.raises(labserve.LoadTargetError, match=r"shape \[1, 3\] does not fit"):
            labserve.load_test(url, example=np.ones((1, 3)), duration_s=0.2, concurrency=1)
        with pytest.raises(labserve.LoadTargetError, match="answered 404"):
            labserve.load_test(f"{server.url}/v2/models/nope/infer", duration_s=0.2, concurrency=1)
    finally:
        server.stop()
        runner.stop()
    assert kinds(result) == {"served": len(result.arrival_s)}
    assert {d for d, _ in model.seen} == {"float32"}
    assert result.items.tolist() == [2] * len(result.arrival_s)


def test_every_http_failure_is_an_outcome_of_its_own_kind(faulty, caplog):
    caplog.set_level(logging.WARNING)
    script = ["200", "503", "500", "404", "504", "drop", "rst", "garbage", "chunked", "close"]
    server = faulty(script)
    result = labserve.load_test(server.url(), example=X, duration_s=0.5, concurrency=3)
    got = kinds(result)
    did = server.done
    assert sum(got.values()) == server.requests == len(result.arrival_s)
    assert got.get("served", 0) == did["200"] + did["chunked"] + did["close"]
    assert got.get("rejected", 0) == did["503"]
    assert got.get("failed", 0) == did["500"]
    assert got.get("client_error", 0) == did["404"]
    assert got.get("timeout", 0) == did["504"]
    assert got.get("reset", 0) == did["drop"] + did["rst"] + did["garbage"]
    assert "cancelled" not in got
    assert result.summary()["outcomes"] == got
    assert not [r for r in caplog.records if r.name == "asyncio"]


def test_a_reply_without_length_runs_to_the_close(faulty):
    server = faulty(["unframed"])
    result = labserve.load_test(server.url(), example=X, duration_s=0.2, concurrency=2)
    assert kinds(result) == {"served": server.requests}


def test_a_server_that_never_answers_times_out_and_the_run_still_ends(faulty):
    server = faulty(["hang"])
    result = labserve.load_test(
        server.url(), example=X, duration_s=0.2, arrivals=ConstantArrivals(50), timeout_s=0.3
    )
    assert kinds(result) == {"timeout": 10}
    assert not np.any(result.served)


def test_nothing_listening_is_a_connect_error(refused_url):
    result = labserve.load_test(
        refused_url, example=X, duration_s=0.2, arrivals=ConstantArrivals(50)
    )
    assert kinds(result) == {"connect_error": 10}
    assert result.server is None
    assert result.summary()["outcomes"] == {"connect_error": 10}


def test_the_token_goes_with_every_request(faulty):
    server = faulty(["200"])
    labserve.load_test(server.url(), example=X, duration_s=0.1, concurrency=1, token="s3cret")
    assert server.authorizations and set(server.authorizations) == {"Bearer s3cret"}


def test_a_server_off_loopback_needs_the_token():
    runner = labserve.Runner(Checked(), name="checked", on_overload="wait")
    server = labserve.serve(runner, host="0.0.0.0", token="tok")
    url = f"http://127.0.0.1:{server.port}/v2/models/checked/infer"
    try:
        with pytest.raises(labserve.LoadTargetError, match="unauthorized"):
            labserve.load_test(url, duration_s=0.1, concurrency=1)
        result = labserve.load_test(url, duration_s=0.2, concurrency=2, token="tok")
    finally:
        server.stop()
        runner.stop()
    assert kinds(result) == {"served": len(result.arrival_s)}
    assert result.server is not None and result.server["served"] == len(result.arrival_s)


def test_a_url_says_what_it_targets():
    t = HttpTarget.parse("http://h:9/pre/v2/models/r.m/versions/3/infer")
    assert (t.kind, t.base, t.runner, t.method, t.model, t.version) == (
        "v2",
        "http://h:9/pre",
        "r",
        "m",
        "r.m",
        "3",
    )
    assert t.metadata_url == "http://h:9/pre/v2/models/r.m/versions/3"
    t = HttpTarget.parse("https://h/runners/a/b?x=1")
    assert (t.kind, t.runner, t.method, t.port, t.tls, t.path) == (
        "simple",
        "a",
        "b",
        443,
        True,
        "/runners/a/b?x=1",
    )
    assert t.host_header == "h"
    assert HttpTarget.parse("http://h:8000/predict").kind == "other"
    with pytest.raises(labserve.LoadTargetError, match="http://"):
        HttpTarget.parse("ftp://h/x")


def test_http_options_are_refused_for_a_runner():
    runner = labserve.Runner(SleepModel(a_ms=0.0, b_ms=0.0), name="r")
    try:
        with pytest.raises(TypeError, match="HTTP targets only"):
            labserve.load_test(runner.predict, example=X, duration_s=0.1, concurrency=1, token="t")
    finally:
        runner.stop()
    with pytest.raises(TypeError, match="needs example="):
        labserve.load_test("http://127.0.0.1:1/runners/a/b", duration_s=0.1, concurrency=1)


def test_a_pool_too_small_for_the_rate_says_so_in_the_warning():
    runner = labserve.Runner(SleepModel(a_ms=20.0, b_ms=0.0), name="slow", on_overload="wait")
    server = labserve.serve(runner)
    try:
        with pytest.warns(labserve.LoadWarning, match=r"found all 1 connections \(the limit\)"):
            result = labserve.load_test(
                f"{server.url}/runners/slow/predict",
                example=X,
                duration_s=0.2,
                arrivals=ConstantArrivals(200),
                connections=1,
            )
    finally:
        server.stop()
        runner.stop()
    # One connection, 20 ms a request: most requests wait for it, and the lag shows the wait.
    assert kinds(result) == {"served": 40}
    assert result.send_lag_s is not None and result.send_lag_s.max() > 0.1
    # 40 requests in series at >= 20 ms each: the last went out after >= 0.78 s, not at 0.2 s,
    # and the served rate is over that time (one connection serves at most 50 req/s).
    assert result.sent_until_s >= 39 * 0.020
    summary = result.summary()
    assert summary["offered_rps"] == pytest.approx(200)
    assert summary["served_rps"] == pytest.approx(40 / result.sent_until_s)
    assert summary["served_rps"] <= 50
