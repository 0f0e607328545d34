"""Snapshot sources: a runner here, and a labserve server by URL on a real socket."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

import labserve
from labserve.lab.demo import SleepModel

X = np.ones((1, 4))


@pytest.fixture
def runner() -> Iterator[labserve.Runner]:
    r = labserve.Runner(SleepModel(a_ms=0.5, b_ms=0.01), name="sleep")
    yield r
    r.stop(timeout=10)


@pytest.fixture
def server(runner: labserve.Runner) -> Iterator[labserve.Server]:
    s = labserve.serve(runner)
    yield s
    s.stop()


def test_every_kind_of_target_gives_sources(runner, server):
    for target in (runner, runner.predict, [runner], server):
        [src] = labserve.method_sources(target)
        assert isinstance(src, labserve.RunnerSource) and isinstance(src, labserve.MethodSource)
        assert src.name == "sleep.predict" and src.resettable
    [remote] = labserve.method_sources(server.url, token=server.token)
    assert isinstance(remote, labserve.HttpSource) and isinstance(remote, labserve.MethodSource)
    assert remote.name == "sleep.predict" and not remote.resettable
    assert labserve.method_sources([remote, runner])[0] is remote
    with pytest.raises(TypeError, match="got int"):
        labserve.method_sources(3)
    with pytest.raises(ValueError, match="http://host:port"):
        labserve.method_sources("localhost:80")


def test_a_url_source_sees_what_the_runner_sees(runner, server):
    [src] = labserve.method_sources(server.url + "/", token=server.token)
    for _ in range(7):
        runner.predict.run(X)
    view = src.view()
    here = runner.predict.stats()
    assert view.snapshot.served == here.served == 7
    assert view.snapshot.batch_size_counts == here.batch_size_counts
    assert view.snapshot.recent_batches[-1].items == 1
    assert view.config == runner.predict.config
    assert view.replicas == {}  # one process: no per-replica view


def test_a_url_source_changes_the_config_and_a_refusal_changes_nothing(runner, server):
    [src] = labserve.method_sources(server.url, token=server.token)
    config = src.configure(max_batch_size=8, strategy="fixed")
    assert config == runner.predict.config and config.max_batch_size == 8
    assert src.config.strategy == "fixed"  # the config asked, before any batch
    with pytest.raises(labserve.RemoteError) as refused:
        src.configure(max_batch_size=0)
    assert refused.value.remote_status == 422 and refused.value.error == "ConfigError"
    assert "max_batch_size must be an integer >= 1" in str(refused.value)
    assert runner.predict.config.max_batch_size == 8
    [no_token] = labserve.method_sources(server.url)
    with pytest.raises(labserve.RemoteError) as unauthorized:
        no_token.configure(max_batch_size=2)
    assert unauthorized.value.remote_status == 401
    with pytest.raises(TypeError, match="reset"):
        src.reset_stats()


def test_a_url_that_does_not_answer_is_a_typed_error(server):
    url = server.url
    server.stop()
    with pytest.raises(labserve.RemoteError, match="did not answer"):
        labserve.method_sources(url)


def test_load_through_a_url_source_reaches_the_runner(runner, server):
    [src] = labserve.method_sources(server.url, token=server.token)
    run = src.start_load(example=X, concurrency=4, duration_s=0.5)
    result = run.result(timeout=30)
    summary = result.summary()
    assert summary["requests"] > 0 and summary["failed_pct"] == summary["rejected_pct"] == 0
    assert runner.predict.stats().served == summary["requests"] == summary["server_served"]


def test_a_snapshot_survives_json(runner):
    for _ in range(3):
        runner.predict.run(X)
    snap = runner.predict.stats()
    back = labserve.snapshot_from_dict(snap.as_dict())
    assert back.as_dict() == snap.as_dict()
    assert isinstance(back.config, labserve.BatchingConfig)
    assert math.isnan(
        labserve.snapshot_from_dict({**snap.as_dict(), "mean_batch_size": None}).mean_batch_size
    )
    with pytest.raises(labserve.RemoteError, match="not a snapshot"):
        labserve.snapshot_from_dict({"runner": "sleep"})
