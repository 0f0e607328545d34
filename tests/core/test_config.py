import dataclasses
import math

import pytest

from labserve.base.errors import ConfigError
from labserve.base.vocabulary import STRATEGIES
from labserve.config.batching import BatchingConfig


def test_defaults_are_valid_and_adaptive():
    cfg = BatchingConfig()
    assert cfg.strategy == "adaptive"
    assert cfg.effective_strategy == "adaptive"
    assert cfg.max_concurrent_batches == 1
    assert cfg.on_overload == "wait"  # never shed by surprise; max_queue_size bounds it


def test_validation_message_names_key_rule_and_value():
    with pytest.raises(ConfigError) as info:
        BatchingConfig(max_batch_size=0)
    assert str(info.value) == "max_batch_size must be an integer >= 1, got 0"
    assert info.value.key == "max_batch_size"
    assert info.value.value == 0


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        BatchingConfig(max_queue_size=-5)


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("max_batch_size", 0, "an integer >= 1"),
        ("max_batch_size", 2.0, "an integer >= 1"),
        ("max_batch_size", "8", "an integer >= 1"),
        ("max_queue_size", 0, "an integer >= 1"),
        ("max_concurrent_batches", 0, "an integer >= 1"),
        ("max_latency_ms", -1, "a finite number >= 0"),
        ("max_latency_ms", math.inf, "a finite number >= 0"),
        ("max_latency_ms", math.nan, "a finite number >= 0"),
        ("max_latency_ms", "10", "a finite number >= 0"),
        ("strategy", "FIXED", "one of 'off', 'fixed', 'greedy', 'adaptive'"),
        ("on_overload", "drop", "one of 'reject', 'wait'"),
        ("enabled", 1, "true or false"),
        ("isolate_errors", "yes", "true or false"),
    ],
)
def test_each_setting_rejects_bad_values(key, value, rule):
    with pytest.raises(ConfigError) as info:
        BatchingConfig(**{key: value})
    assert str(info.value) == f"{key} must be {rule}, got {value!r}"


@pytest.mark.parametrize(
    "key", ["max_batch_size", "max_queue_size", "max_concurrent_batches", "max_latency_ms"]
)
def test_bools_are_not_accepted_as_numbers(key):
    with pytest.raises(ConfigError, match=f"{key} must be .*, got True"):
        BatchingConfig(**{key: True})


def test_boundary_values_are_accepted():
    cfg = BatchingConfig(
        max_batch_size=1, max_latency_ms=0, max_queue_size=1, max_concurrent_batches=1
    )
    assert (cfg.max_batch_size, cfg.max_latency_ms) == (1, 0.0)


def test_latency_is_normalised_to_float_and_converted_to_seconds():
    cfg = BatchingConfig(max_latency_ms=25)
    assert isinstance(cfg.max_latency_ms, float)
    assert cfg.max_latency_s == pytest.approx(0.025)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_disabled_batching_is_strategy_off(strategy):
    assert BatchingConfig(strategy=strategy).effective_strategy == strategy
    assert BatchingConfig(strategy=strategy, enabled=False).effective_strategy == "off"


def test_config_is_frozen():
    cfg = BatchingConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_batch_size = 64  # type: ignore[misc]


def test_replace_returns_a_new_validated_object_and_leaves_the_old_one():
    old = BatchingConfig(max_batch_size=8)
    new = old.replace(max_batch_size=64, strategy="fixed")
    assert new is not old
    assert (new.max_batch_size, new.strategy) == (64, "fixed")
    assert (old.max_batch_size, old.strategy) == (8, "adaptive")


def test_replace_with_a_bad_value_raises_and_changes_nothing():
    old = BatchingConfig(max_batch_size=8)
    with pytest.raises(ConfigError, match="max_batch_size must be an integer >= 1, got 0"):
        old.replace(max_batch_size=0)
    assert old.max_batch_size == 8


def test_replace_with_an_unknown_key_names_it():
    with pytest.raises(ConfigError, match="max_batch must be a known setting"):
        BatchingConfig().replace(max_batch=4)


def test_as_dict_round_trips():
    cfg = BatchingConfig(strategy="greedy", max_batch_size=5, on_overload="wait")
    d = cfg.as_dict()
    assert d["strategy"] == "greedy"
    assert BatchingConfig(**d) == cfg


def test_from_layers_lets_later_layers_win():
    cfg = BatchingConfig.from_layers(
        {"max_batch_size": 4, "max_latency_ms": 1},
        {"max_batch_size": 16},
        {},
        {"strategy": "fixed"},
    )
    assert (cfg.max_batch_size, cfg.max_latency_ms, cfg.strategy) == (16, 1.0, "fixed")


def test_from_layers_validates_the_merged_result():
    with pytest.raises(ConfigError, match="max_batch_size"):
        BatchingConfig.from_layers({"max_batch_size": 4}, {"max_batch_size": -1})


def test_a_layer_takes_every_setting_of_the_config_and_checks_it_by_the_same_rule():
    from labserve.config.batching import SETTINGS, BatchingLayer

    defaults = BatchingConfig()
    assert list(SETTINGS) == [f.name for f in dataclasses.fields(BatchingConfig)]
    for name in SETTINGS:
        value = getattr(defaults, name)
        assert BatchingLayer.from_mapping({name: value}).settings() == {name: value}
        with pytest.raises(ConfigError, match=f"layer {name} must be"):
            BatchingLayer.from_mapping({name: object()}, path="layer ")
        with pytest.raises(ConfigError, match=f"^{name} must be"):
            BatchingConfig(**{name: object()})


def test_a_layer_checks_each_value_once_where_it_enters():
    from labserve.config.batching import BatchingLayer

    with pytest.raises(ConfigError, match=r"@labserve.method max_batch_size must be an integer"):
        BatchingLayer.from_mapping({"max_batch_size": 0}, path="@labserve.method ")
    with pytest.raises(ConfigError, match="a known setting"):
        BatchingLayer.from_mapping({"max_batch_sise": 4})
    assert BatchingLayer(max_latency_ms=5).settings() == {"max_latency_ms": 5.0}


def test_a_layer_pickles_as_ray_ships_it_to_replicas():
    import pickle

    from labserve.config.batching import BatchingLayer

    layer = BatchingLayer(max_batch_size=4, path="runners.m.batching.", source="lab.yaml")
    copy = pickle.loads(pickle.dumps(layer))
    assert copy == layer and (copy.path, copy.source) == ("runners.m.batching.", "lab.yaml")
