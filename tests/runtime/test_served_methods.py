"""Both kinds of served method behind one Protocol (ServedMethod): what the config path uses."""

from __future__ import annotations

import numpy as np
import pytest

import labserve
from labserve.base.errors import ConfigError
from labserve.generation.batch import SeqBatch


class Mixed(labserve.Runnable):
    """A plain method, a batchable one and a generative one, declared in that order."""

    vocab_size = 256

    @labserve.method()
    def describe(self, x: np.ndarray) -> np.ndarray:
        return x

    @labserve.method(generative=True, max_num_seqs=4)
    def generate(self, batch: SeqBatch) -> np.ndarray:
        return np.array([len(t) % 256 for _, t, _, ok in batch if ok], dtype=np.int64)

    @labserve.method(batchable=True, max_batch_size=8)
    def predict(self, x: np.ndarray) -> np.ndarray:
        return x * 2


@pytest.fixture
def mixed():
    runner = labserve.Runner(Mixed, name="mixed")
    yield runner
    runner.stop()


def test_the_configurable_methods_are_the_batchable_ones_then_the_generative_ones(mixed):
    assert list(mixed.configurable()) == ["predict", "generate"]
    assert mixed.configurable()["generate"] is mixed.generate


def test_runner_configure_reaches_either_kind_and_returns_its_config(mixed):
    assert mixed.configure("predict", max_batch_size=16) == mixed.predict.config
    assert mixed.predict.config.max_batch_size == 16
    assert mixed.configure("generate", max_num_seqs=2) == mixed.generate.config
    assert mixed.generate.config.max_num_seqs == 2


def test_runner_configure_refuses_a_method_it_lacks_and_a_plain_one(mixed):
    with pytest.raises(ConfigError, match="it has: describe, predict, generate"):
        mixed.configure("nope", max_batch_size=2)
    with pytest.raises(TypeError, match="not batchable"):
        mixed.configure("describe", max_batch_size=2)


def test_each_kind_shows_its_config_and_figures_the_same_way(mixed):
    for name, method in mixed.configurable().items():
        assert method.name == name
        assert list(method.config.as_dict()) == list(type(method.config).names())
        snapshot = method.stats()
        assert (snapshot.runner, snapshot.method) == ("mixed", name)
        assert snapshot.as_dict()["method"] == name
        method.reset_stats()
