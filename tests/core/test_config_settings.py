"""The one mechanism both configs are declared and checked with (labserve.config.settings)."""

import dataclasses
import importlib.util
import pickle

import pytest

import labserve
from labserve.base.errors import ConfigError
from labserve.config.batching import BatchingConfig
from labserve.config.generation import GenerationConfig
from labserve.config.settings import BOOLEAN, Settings, integer_at_least, setting


@dataclasses.dataclass(frozen=True)
class _Knobs(Settings):
    size: int = setting(4, integer_at_least(1))
    on: bool = setting(True, BOOLEAN)


def test_a_config_declared_with_settings_is_checked_when_built():
    with pytest.raises(ConfigError, match=r"^size must be an integer >= 1, got 0$"):
        _Knobs(size=0)
    assert _Knobs.names() == ("size", "on")
    assert _Knobs(size=2).as_dict() == {"size": 2, "on": True}


def test_replace_checks_the_changes_and_leaves_the_old_config():
    old = _Knobs()
    new = old.replace(size=8)
    assert (old.size, new.size, new.on) == (4, 8, True)
    with pytest.raises(ConfigError, match="on must be true or false, got 1"):
        old.replace(on=1)


@pytest.mark.parametrize("config", [BatchingConfig(), GenerationConfig()], ids=type)
def test_both_configs_refuse_an_unknown_key_alike_naming_the_known_ones(config):
    with pytest.raises(ConfigError) as info:
        config.replace(max_nothing=3)
    known = ", ".join(type(config).names())
    assert str(info.value) == f"max_nothing must be a known setting (one of: {known}), got 3"


@pytest.mark.parametrize(
    ("config", "key"),
    [(BatchingConfig(), "max_queue_size"), (GenerationConfig(), "max_queue_size")],
    ids=["batching", "generation"],
)
def test_both_configs_word_one_rule_alike(config, key):
    with pytest.raises(ConfigError) as info:
        config.replace(**{key: 0})
    assert str(info.value) == f"{key} must be an integer >= 1, got 0"


def test_a_change_from_a_file_names_the_file_and_the_section():
    with pytest.raises(ConfigError) as info:
        GenerationConfig().with_changes(
            {"max_num_seqs": 0}, path="runners.lm.generation.", source="lab.yaml"
        )
    assert (
        str(info.value)
        == "lab.yaml: runners.lm.generation.max_num_seqs must be an integer >= 1, got 0"
    )
    assert info.value.key == "runners.lm.generation.max_num_seqs"


def test_a_generation_millisecond_setting_says_its_unit():
    with pytest.raises(ConfigError, match="must be a finite number of milliseconds >= 0, got -1"):
        GenerationConfig(ttft_slo_ms=-1)
    assert GenerationConfig(ttft_slo_ms=5).ttft_slo_ms == 5.0  # kept as a float


def test_a_batching_change_to_none_leaves_the_setting_a_generation_one_is_refused():
    # Batching settings come in layers, where None means "not set"; generation's do not.
    assert BatchingConfig(max_batch_size=8).replace(max_batch_size=None).max_batch_size == 8
    with pytest.raises(ConfigError, match="max_num_seqs must be an integer >= 1, got None"):
        GenerationConfig().replace(max_num_seqs=None)


def test_a_replaced_config_equals_and_pickles_like_a_built_one():
    replaced = GenerationConfig().replace(max_num_seqs=8, request_timeout_ms=5)
    built = GenerationConfig(max_num_seqs=8, request_timeout_ms=5.0)
    assert replaced == built and hash(replaced) == hash(built)
    assert pickle.loads(pickle.dumps(replaced)) == built
    assert replaced.request_timeout_s == 0.005


def test_the_generation_config_has_one_home():
    # No re-export under generation/: one import path per concept (issue 31's naming rule).

    assert importlib.util.find_spec("labserve.generation.config") is None
    assert labserve.GenerationConfig is GenerationConfig
