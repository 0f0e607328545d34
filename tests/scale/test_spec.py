"""What deploy() resolves on the driver: names, methods and the caps' consequences."""

from __future__ import annotations

import pytest

import labserve
from labserve.config.batching import BatchingConfig
from labserve.ray.replica import Replica
from labserve.ray.spec import RESERVED, max_ongoing_requests, resolve


def test_a_method_named_like_the_replicas_own_attributes_is_refused():
    public = {n for n in vars(Replica) if not n.startswith("_")}
    assert public <= RESERVED

    class Clash(labserve.Runnable):
        @labserve.method(batchable=True)
        def push(self, x):
            return x

    with pytest.raises(TypeError, match="'push', which Ray replicas use"):
        resolve(Clash, name=None, config=None, batching={})


def test_max_ongoing_requests_leaves_room_for_full_batches_within_the_queue():
    assert max_ongoing_requests({"p": BatchingConfig(max_batch_size=8)}) == 256
    big = BatchingConfig(max_batch_size=128, max_concurrent_batches=2)
    assert max_ongoing_requests({"p": big}) == 1024
    small_queue = BatchingConfig(max_batch_size=64, max_queue_size=10)
    assert max_ongoing_requests({"p": small_queue}) == 74  # the queue, plus one running batch
    assert max_ongoing_requests({"a": big, "b": small_queue}) == 1098


def test_a_runner_deploys_its_live_config():
    class Model(labserve.Runnable):
        @labserve.method(batchable=True, max_batch_size=16)
        def predict(self, x):
            return x

    runner = labserve.Runner(Model, name="tuned")
    try:
        runner.configure("predict", max_batch_size=48, strategy="fixed")
        name, _, configs, methods = resolve(runner.predict, name=None, config=None, batching={})
    finally:
        runner.stop()
    assert (name, methods) == ("tuned", ("predict",))
    assert (configs["predict"].max_batch_size, configs["predict"].strategy) == (48, "fixed")
