"""Two real replicas on a local Ray: batching in each, live caps, a replica killed mid-load."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import ray
from ray import serve

import labserve
from labserve.lab.demo import SleepModel


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0, every_s: float = 0.1) -> Any:
    """Poll ``check()`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout_s} s waiting for {check}")
        time.sleep(every_s)


def replica_views(app: Any) -> dict[str, dict[str, Any]]:
    """Each replica's own ``predict`` snapshot (as JSON), by replica id."""
    return {rid: view[app.runner]["predict"] for rid, view in app.stats()["replicas"].items()}


def views_when(
    app: Any, ok: Callable[[dict[str, dict[str, Any]]], bool], timeout_s: float = 30.0
) -> dict[str, dict[str, Any]]:
    """The replicas' views once ``ok(views)`` holds (they report every 0.25 s)."""

    def check() -> dict[str, dict[str, Any]] | None:
        views = replica_views(app)
        return views if ok(views) else None

    result: dict[str, dict[str, Any]] = wait_for(check, timeout_s)
    return result


def send_many(app: Any, n: int, workers: int = 32) -> list[Any]:
    """``n`` requests through the handle from ``workers`` threads: each answer, or its error."""

    def one(i: int) -> Any:
        try:
            return app.predict(np.full((1, 3), float(i)))
        except Exception as exc:  # every caller's outcome is checked by the test
            return exc

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, range(n)))


def test_two_replicas_both_form_batches_under_load(deploy):
    app = deploy(
        functools.partial(SleepModel, a_ms=10.0, b_ms=0.5),
        name="batcher",
        num_replicas=2,
        max_batch_size=16,
        max_latency_ms=20,
    )
    answers = send_many(app, 400)
    assert [float(a[0, 0]) for a in answers] == [3.0 * i for i in range(400)]
    views = views_when(app, lambda v: len(v) == 2 and sum(s["served"] for s in v.values()) == 400)
    for view in views.values():
        assert view["served"] > 0
        assert view["max_batch_size_seen"] > 1  # each replica batched, not one by one
        assert view["config"]["max_batch_size"] == 16
    merged = app.stats()["batcher"]["predict"]
    assert merged["served"] == 400
    assert merged["batches"] == sum(v["batches"] for v in views.values())
    sizes = {int(k): c for k, c in merged["batch_size_counts"].items()}
    assert sum(k * c for k, c in sizes.items()) == 400  # every item in exactly one batch


def test_max_ongoing_requests_follows_the_caps(deploy):
    app = deploy(
        functools.partial(SleepModel, a_ms=30.0, b_ms=0.0), name="ongoing", max_batch_size=24
    )
    send_many(app, 96, workers=48)
    view = next(
        iter(views_when(app, lambda v: sum(s["served"] for s in v.values()) == 96).values())
    )
    # Serve's default max_ongoing_requests (5) would never let a batch pass 5.
    assert view["max_batch_size_seen"] > 5


def test_a_live_cap_change_reaches_both_replicas_without_replacing_them(deploy):
    app = deploy(
        functools.partial(SleepModel, a_ms=5.0, b_ms=0.0),
        name="live",
        num_replicas=2,
        max_batch_size=16,
        max_latency_ms=50,
        strategy="fixed",
    )
    before = set(views_when(app, lambda v: len(v) == 2))
    assert app.configure("predict", max_batch_size=4).max_batch_size == 4
    views = views_when(app, lambda v: all(s["config"]["max_batch_size"] == 4 for s in v.values()))
    assert set(views) == before  # reconfigured in place (user_config), not restarted
    send_many(app, 200)
    views = views_when(app, lambda v: sum(s["served"] for s in v.values()) == 200)
    assert {s["max_batch_size_seen"] for s in views.values()} == {4}
    assert app.configs()["predict"].max_batch_size == 4


def test_a_bad_live_change_is_a_config_error_and_changes_nothing(deploy):
    app = deploy(SleepModel, name="strict", max_batch_size=16)
    with pytest.raises(labserve.ConfigError, match="max_batch_size"):
        app.configure("predict", max_batch_size=0)
    assert app.configs()["predict"].max_batch_size == 16


def test_a_replica_killed_mid_load_every_caller_answered_and_config_kept(deploy):
    app = deploy(
        functools.partial(SleepModel, a_ms=5.0, b_ms=0.1),
        name="phoenix",
        num_replicas=2,
        max_batch_size=16,
    )
    app.configure("predict", max_batch_size=8)
    before = set(
        views_when(
            app,
            lambda v: len(v) == 2 and all(s["config"]["max_batch_size"] == 8 for s in v.values()),
        )
    )
    victim = next(
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::phoenix#")
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        load = pool.submit(send_many, app, 600)
        time.sleep(0.5)
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]))
        answers = load.result(timeout=120)
    assert len(answers) == 600
    results = [a for a in answers if not isinstance(a, BaseException)]
    errors = [a for a in answers if isinstance(a, BaseException)]
    assert results, "the surviving replica served nobody"
    for i, answer in enumerate(answers):
        if not isinstance(answer, BaseException):
            assert float(answer[0, 0]) == 3.0 * i
    # Callers of the killed replica get Ray's typed error for a dead actor, nothing hangs.
    assert all(
        isinstance(e, (ray.exceptions.RayActorError, labserve.LabServeError)) for e in errors
    )
    # Serve starts a replacement, which begins with the config in force (Serve hands it the
    # user_config before routing to it); it never reports another.
    views = views_when(app, lambda v: bool(set(v) - before), timeout_s=60)
    new = [views[rid] for rid in set(views) - before]
    assert [s["config"]["max_batch_size"] for s in new] == [8]
    wait_for(lambda: serve.status().applications["phoenix"].status == "RUNNING")
    assert float(app.predict(np.ones((1, 3)))[0, 0]) == 3.0


def test_stats_without_the_board_is_a_typed_error_and_requests_still_served(
    deploy, raw_http, ray_cluster
):
    deploy(SleepModel, name="orphan", max_batch_size=8)
    ray.kill(ray.get_actor("labserve-stats-orphan", namespace="labserve"))
    status, _, body = raw_http(ray_cluster.port, "GET", "/stats")
    assert status == 500 and b"ServerError" in body and b"is gone" in body
    status, _, body = raw_http(
        ray_cluster.port,
        "POST",
        "/runners/orphan/predict",
        b"[[1, 2]]",
        {"Content-Type": "application/json"},
    )
    assert (status, body) == (200, b"[[3]]")
