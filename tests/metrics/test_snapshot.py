import dataclasses
import json

import numpy as np
import pytest

from labserve.batching.containers import Codec
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig


@pytest.fixture
def make_queue():
    def make(**settings):
        settings.setdefault("strategy", "greedy")
        return BatchQueue("predict", Codec("predict"), BatchingConfig(**settings), runner="scorer")

    return make


def serve_all(q, now):
    """Fire and finish everything queued, 2 ms per batch; returns the time at the end."""
    while not q.idle:
        for batch in q.poll(now).fire:
            out = batch.stack(q.codec)[0] * 2
            now += 0.002
            q.complete(batch, q.codec.split(out, batch.counts), now)
            q.release(batch, now, ok=True)
    return now


def test_snapshot_is_frozen(make_queue):
    snap = make_queue().snapshot(0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.served = 5  # type: ignore[misc]


def test_snapshot_does_not_change_as_the_queue_moves_on(make_queue):
    q = make_queue(max_batch_size=4)
    for _ in range(5):
        q.admit((np.ones((1, 3)),), now=0.0)
    now = serve_all(q, 0.0)
    snap = q.snapshot(now)
    before = snap.as_dict()
    for _ in range(7):
        q.admit((np.ones((2, 3)),), now=now)
    q.configure(q.config.replace(max_batch_size=16))
    serve_all(q, now)
    assert snap.as_dict() == before
    assert snap.served == 5
    assert snap.batch_size_counts == {4: 1, 1: 1}


def test_mutating_a_snapshots_dicts_does_not_reach_the_queue(make_queue):
    q = make_queue(max_batch_size=4)
    q.admit((np.ones((1, 3)),), now=0.0)
    serve_all(q, 0.0)
    snap = q.snapshot(1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.config.max_batch_size = 999  # type: ignore[misc]
    snap.fire_reasons["idle"] = 999
    fresh = q.snapshot(1.0)
    assert fresh.config.max_batch_size == 4
    assert fresh.fire_reasons == {"idle": 1}


def test_as_dict_of_an_empty_queue_is_strict_json(make_queue):
    d = make_queue().snapshot(0.0).as_dict()
    text = json.dumps(d, allow_nan=False)
    back = json.loads(text)
    assert back["latency_ms_window"] == {"p50": None, "p95": None, "p99": None, "p999": None}
    assert back["mean_batch_size"] is None
    assert back["pending"] == 0


def test_as_dict_after_traffic_is_strict_json(make_queue):
    q = make_queue(max_batch_size=4)
    for _ in range(9):
        q.admit((np.ones((1, 3)),), now=0.0)
    now = serve_all(q, 0.0)
    back = json.loads(json.dumps(q.snapshot(now).as_dict(), allow_nan=False))
    assert back["served"] == 9
    assert back["batch_size_counts"] == {"1": 1, "4": 2}
    assert back["recent_batches"][0]["items"] == 4
    assert back["config"]["strategy"] == "greedy"
    assert back["cost_fit"]["samples"] == 3


def test_pending_counts_admitted_requests_without_an_outcome(make_queue):
    q = make_queue(max_batch_size=2)
    for _ in range(3):
        q.admit((np.ones((1, 3)),), now=0.0)
    assert len(q.poll(0.0).fire) == 1
    snap = q.snapshot(0.0)
    assert (snap.admitted, snap.pending, snap.queue_requests, snap.in_flight_batches) == (
        3,
        3,
        1,
        1,
    )


def test_str_is_one_readable_line(make_queue):
    q = make_queue()
    q.admit((np.ones((1, 3)),), now=0.0)
    serve_all(q, 0.0)
    text = str(q.snapshot(1.0))
    assert text.startswith("scorer.predict: 1 served")
    assert "\n" not in text


def test_the_cost_fit_says_which_batch_sizes_it_saw(make_queue):
    q = make_queue(max_batch_size=8)
    assert q.snapshot(0.0).cost_fit[3:5] == (0, 0)  # nothing seen yet
    now = 0.0
    for n in (2, 6, 3):
        q.admit((np.ones((n, 3)),), now=now)
        now = serve_all(q, now)
    fit = q.snapshot(now).cost_fit
    assert (fit.samples, fit.min_items, fit.max_items) == (3, 2, 6)
