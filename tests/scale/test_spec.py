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


def test_max_ongoing_requests_of_a_generative_method_leaves_room_for_every_running_sequence():
    from labserve.config.generation import GenerationConfig
    from labserve.ray.spec import generation_ongoing

    assert generation_ongoing({"g": GenerationConfig(max_num_seqs=32)}) == 32 + 256
    assert generation_ongoing({"g": GenerationConfig(max_num_seqs=128)}) == 128 + 512
    assert generation_ongoing({"g": GenerationConfig(max_num_seqs=8, max_queue_size=20)}) == 28


def test_deploy_settings_split_as_a_runners_do():
    from labserve.ray.spec import split_settings

    batching, generating = split_settings(
        {"max_batch_size": 8, "max_num_seqs": 4, "max_queue_size": 50}
    )
    assert batching == {"max_batch_size": 8, "max_queue_size": 50}
    assert generating == {"max_num_seqs": 4, "max_queue_size": 50}


def test_a_generative_runnable_resolves_its_generation_config_from_the_layers(tmp_path):
    from labserve.lab.demo import TinyLM
    from labserve.ray.spec import generation_configs

    file = tmp_path / "c.yaml"
    file.write_text("runners:\n  lm:\n    generation: {max_num_seqs: 6, block_size: 8}\n")
    got = generation_configs(TinyLM, name="lm", config=file, settings={"max_num_seqs": 3})
    assert (got["generate"].max_num_seqs, got["generate"].block_size) == (3, 8)
