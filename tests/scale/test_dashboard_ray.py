"""The dashboard on a Ray application: two real replicas, merged, each one's own, live caps.

One application for the whole module (deploying costs seconds here): the tests run in
order on it, each leaving it as the next expects (caps they set are set again).
"""

from __future__ import annotations

import asyncio
import functools
import html
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from labserve.widgets import Dashboard

import labserve
import labserve.ray
from labserve.lab.demo import SleepModel

X = np.ones((1, 4))


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """Poll ``check()`` until it is truthy (the replicas report every 0.25 s)."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout_s} s waiting for {check}")
        time.sleep(0.05)
    return value


@pytest.fixture(scope="module")
def app(ray_cluster) -> Iterator[labserve.ray.RayApp]:
    deployed = labserve.ray.deploy(
        functools.partial(SleepModel, a_ms=5.0, b_ms=0.2),
        name="board",
        num_replicas=2,
        max_batch_size=16,
        max_latency_ms=10,
    )
    yield deployed
    deployed.stop()


@pytest.fixture(scope="module")
def dash(app, ray_cluster) -> Iterator[Dashboard]:
    d = Dashboard(app.method_sources(proxy_url=ray_cluster.url()), example=X, hz=10)
    yield d
    d.close()


def test_a_ray_app_gives_one_source_per_batchable_method(app, ray_cluster):
    [src] = labserve.method_sources(app)
    assert isinstance(src, labserve.MethodSource) and src.name == "board.predict"
    assert src.resettable and src.alive
    assert src.proxy_url == app.url()  # Serve's default port unless told


def test_a_blocking_call_works_from_a_thread_that_runs_an_event_loop(app):
    # A notebook cell: ipykernel's main thread runs an asyncio loop, where Ray refuses .result().
    async def in_a_cell() -> Any:
        return app.predict(2 * X)

    assert asyncio.run(in_a_cell()).ravel().tolist() == [8.0]


def test_load_through_the_proxy_reaches_both_replicas_and_shows_each(dash, app):
    dash.controls["pattern"].value = "closed loop"
    dash.controls["concurrency"].value = "32"
    dash.controls["duration"].value = "5"
    dash.controls["start"].value = True
    assert dash.errors["load"].value == ""

    def both_served_and_batched() -> bool:
        # The first requests through the proxy may each be served alone: wait, while the
        # load runs, for both replicas to have served and for a batch of more than one.
        view = dash.pump.view
        return (
            view is not None
            and len(view.replicas) == 2
            and all(s.served > 0 for s in view.replicas.values())
            and any(s.max_batch_size_seen > 1 for s in view.replicas.values())
        )

    wait_for(both_served_and_batched)
    view = dash.pump.view
    assert view.snapshot.served >= sum(s.served for s in view.replicas.values()) - 64
    wait_for(lambda: "2 of 2 replicas reporting" in dash.replicas.value)
    assert dash.replicas.layout.display is None  # shown
    wait_for(lambda: not dash.controls["start"].value)  # the run ended
    assert dash.pump.last_error is None, repr(dash.pump.last_error)


def test_a_cap_moved_in_the_dashboard_reaches_every_replica(dash, app):
    dash.controls["max_batch_size"].value = 8
    assert app.configs()["predict"].max_batch_size == 8
    for _ in range(8):  # a batch on each replica puts the change in force there (and idle ones)
        app.predict(X)

    def every_replica_has_it() -> bool:
        view = dash.pump.view
        return view is not None and all(
            s.config.max_batch_size == 8 for s in view.replicas.values()
        )

    wait_for(every_replica_has_it)
    assert dash.controls["max_batch_size_text"].value == "8"
    wait_for(
        lambda: dash.replicas.value.count("<td style='padding:0 8px;text-align:right'>8<") >= 2
    )
    # A bad value is refused before it reaches any replica.
    dash.controls["max_batch_size_text"].value = "0"
    assert "max_batch_size must be an integer >= 1" in html.unescape(
        dash.errors["max_batch_size"].value
    )
    assert app.configs()["predict"].max_batch_size == 8


def test_a_change_made_elsewhere_shows_in_the_controls(dash, app):
    app.configure("predict", max_latency_ms=20)
    wait_for(lambda: dash.controls["max_latency_ms"].value == 20)


def test_reset_starts_every_replica_over(dash, app):
    assert dash.controls["reset"].description == "reset statistics"
    dash.controls["reset"].click()
    assert dash.errors["config"].value == ""

    def zeroed() -> bool:
        view = dash.pump.view
        return view is not None and len(view.replicas) == 2 and view.snapshot.served == 0

    wait_for(zeroed)
    app.predict(X)
    wait_for(lambda: dash.pump.view is not None and dash.pump.view.snapshot.served == 1)
    assert dash.pump.last_error is None, repr(dash.pump.last_error)  # none while it reset


def test_the_proxy_url_as_a_source_shows_the_replicas_too(app, ray_cluster):
    [src] = labserve.method_sources(ray_cluster.url(), token=app.token)
    assert isinstance(src, labserve.HttpSource)

    def two_replicas() -> labserve.SourceView | None:
        view = src.view()
        return view if len(view.replicas) == 2 else None

    view = wait_for(two_replicas)
    assert view.snapshot.served == sum(s.served for s in view.replicas.values())
    assert src.configure(max_batch_size=16).max_batch_size == 16  # PATCH through the proxy
    assert app.configs()["predict"].max_batch_size == 16
