"""The dashboard watching a labserve server by URL: a real server on a real socket."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from labserve.widgets import Dashboard

import labserve
from labserve.lab.demo import SleepModel

X = np.ones((1, 4))


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    """Poll a condition the pump or the load will make true (not a timing assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@pytest.fixture
def served() -> Iterator[tuple[labserve.Runner, labserve.Server]]:
    runner = labserve.Runner(SleepModel(a_ms=0.5, b_ms=0.01), name="sleep")
    server = labserve.serve(runner)
    yield runner, server
    server.stop()
    runner.stop(timeout=10)


@pytest.fixture
def dash(served) -> Iterator[Dashboard]:
    _runner, server = served
    d = Dashboard(server.url, example=X, hz=20, token=server.token)
    yield d
    d.close()


def test_the_controls_reach_the_server_over_http(dash, served):
    runner, _ = served
    assert list(dash.methods) == ["sleep.predict"]
    assert isinstance(dash.method, labserve.HttpSource)
    dash.controls["max_batch_size"].value = 4
    assert runner.predict.config.max_batch_size == 4
    dash.controls["strategy"].value = "fixed"
    assert runner.predict.config.strategy == "fixed"
    runner.configure("predict", max_latency_ms=50)  # from elsewhere: the controls follow
    wait_for(lambda: dash.controls["max_latency_ms"].value == 50)
    assert "max_batch_size: 4" in dash.controls["export"].value


def test_a_refusal_from_the_server_is_shown_and_changes_nothing(dash, served):
    runner, _ = served
    before = runner.predict.config
    dash.controls["max_batch_size_text"].value = "0"
    shown = html.unescape(dash.errors["max_batch_size"].value)
    assert "422 ConfigError" in shown and "max_batch_size must be an integer >= 1" in shown
    assert runner.predict.config == before
    assert dash.controls["max_batch_size_text"].value == f"{before.max_batch_size}"


def test_load_over_http_streams_into_the_charts(dash, served):
    runner, _ = served
    dash.controls["rate"].value = "300"
    dash.controls["duration"].value = "1"
    dash.controls["start"].value = True
    assert dash.errors["load"].value == ""
    wait_for(lambda: not dash.controls["start"].value)
    wait_for(lambda: dash.pump.snapshot is not None and dash.pump.snapshot.served > 100)
    assert runner.predict.stats().served >= dash.pump.snapshot.served  # the server's counts
    wait_for(lambda: "req/s served" in dash.status.value)
    sizes = [x for x in dash.charts.ticks.data["batch_max"] if math.isfinite(x)]
    assert sizes and max(sizes) <= runner.predict.config.max_batch_size
    assert dash.pump.last_error is None, repr(dash.pump.last_error)
    assert dash.replicas.layout.display == "none"  # one process: no replica table


def test_the_reset_button_clears_the_charts_of_a_remote_server(dash, served):
    runner, _ = served
    assert dash.controls["reset"].description == "clear charts"
    runner.predict.run(X)
    wait_for(lambda: len(dash.charts.ticks.data["t"]) > 3)
    dash.controls["reset"].click()
    assert dash.errors["config"].value == ""
    assert runner.predict.stats().served == 1  # the server's counts are its own


def test_a_server_that_stops_answering_shows_in_the_status_line(served):
    _runner, server = served
    d = Dashboard(server.url, example=X, hz=20)
    try:
        server.stop()
        wait_for(lambda: "RemoteError" in d.status.value)
        assert d.pump.running  # it keeps trying: a restarted server is seen again
    finally:
        d.close()
