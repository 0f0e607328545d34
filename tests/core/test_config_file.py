import textwrap

import pytest

from labserve.base.errors import ConfigError
from labserve.config.batching import BatchingConfig
from labserve.config.file import ENV_VAR, ConfigFile, load_config_file

BENTO_SHAPED = """
runners:
  batching:
    enabled: true
    max_batch_size: 64
    max_latency_ms: 20
  scorer:
    batching:
      strategy: fixed
      max_latency_ms: 5
      on_overload: wait
      max_queue_size: 100
      max_concurrent_batches: 2
      isolate_errors: true
  ranker:
    batching:
      enabled: false
"""


@pytest.fixture
def write_config(tmp_path):
    def write(text, name="labserve.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return write


def test_bentoml_shaped_file_gives_global_and_per_runner_sections(write_config):
    cfg = load_config_file(write_config(BENTO_SHAPED))
    assert cfg.global_batching.settings() == {
        "enabled": True,
        "max_batch_size": 64,
        "max_latency_ms": 20.0,
    }
    assert cfg.for_runner("scorer").settings() == {
        "strategy": "fixed",
        "max_latency_ms": 5.0,
        "on_overload": "wait",
        "max_queue_size": 100,
        "max_concurrent_batches": 2,
        "isolate_errors": True,
    }
    assert cfg.for_runner("ranker").settings() == {"enabled": False}
    assert cfg.for_runner("absent").settings() == {}


def test_file_sections_layer_into_a_batching_config(write_config):
    cfg = load_config_file(write_config(BENTO_SHAPED))
    merged = BatchingConfig.from_layers(cfg.global_batching, cfg.for_runner("scorer"))
    assert (merged.max_batch_size, merged.max_latency_ms, merged.strategy) == (64, 5.0, "fixed")
    ranker = BatchingConfig.from_layers(cfg.global_batching, cfg.for_runner("ranker"))
    assert ranker.effective_strategy == "off"


def test_the_source_is_remembered(write_config):
    path = write_config(BENTO_SHAPED)
    assert load_config_file(path).source == str(path)


@pytest.mark.parametrize(
    ("text", "key_path", "value", "rule"),
    [
        (
            "runners: {scorer: {batching: {max_batch_size: 0}}}",
            "runners.scorer.batching.max_batch_size",
            "0",
            "an integer >= 1",
        ),
        (
            "runners: {batching: {max_latency_ms: fast}}",
            "runners.batching.max_latency_ms",
            "'fast'",
            "a finite number >= 0",
        ),
        (
            "runners: {batching: {max_latency_ms: -3}}",
            "runners.batching.max_latency_ms",
            "-3",
            "a finite number >= 0",
        ),
        (
            "runners: {scorer: {batching: {strategy: eager}}}",
            "runners.scorer.batching.strategy",
            "'eager'",
            "one of 'off', 'fixed', 'greedy', 'adaptive'",
        ),
        (
            "runners: {scorer: {batching: {max_batch: 4}}}",
            "runners.scorer.batching.max_batch",
            "4",
            "a known setting",
        ),
        (
            "runners: {batching: {enabled: maybe}}",
            "runners.batching.enabled",
            "'maybe'",
            "true or false",
        ),
        (
            "runners: {scorer: {batching: {max_concurrent_batches: true}}}",
            "runners.scorer.batching.max_concurrent_batches",
            "True",
            "an integer >= 1",
        ),
        (
            "runners: {scorer: {resources: {cpu: 2}}}",
            "runners.scorer.resources",
            "{'cpu': 2}",
            "a known key",
        ),
        (
            "runners: {scorer: {batching: [1, 2]}}",
            "runners.scorer.batching",
            "[1, 2]",
            "a mapping",
        ),
        ("models: {}", "models", "{}", "a known section"),
    ],
)
def test_a_bad_file_names_file_key_path_value_and_rule(write_config, text, key_path, value, rule):
    path = write_config(text)
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key_path} must be {rule}")
    assert message.endswith(f"got {value}")
    assert info.value.key == key_path
    assert info.value.source == str(path)


def test_a_top_level_that_is_not_a_mapping_is_an_error(write_config):
    path = write_config("- just\n- a list\n")
    with pytest.raises(ConfigError, match="a mapping") as info:
        load_config_file(path)
    assert str(path) in str(info.value)


def test_invalid_yaml_names_the_file(write_config):
    path = write_config("runners: {batching: [unclosed\n")
    with pytest.raises(ConfigError, match="valid YAML") as info:
        load_config_file(path)
    assert str(path) in str(info.value)


def test_an_empty_file_is_an_empty_config(write_config):
    cfg = load_config_file(write_config(""))
    assert cfg.global_batching.settings() == {}
    assert cfg.runners == {}


def test_a_missing_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError, match="a readable file") as info:
        load_config_file(path)
    assert str(path) in str(info.value)


def test_env_var_names_the_file_when_no_path_is_given(write_config, monkeypatch):
    path = write_config("runners: {scorer: {batching: {max_batch_size: 3}}}")
    monkeypatch.setenv(ENV_VAR, str(path))
    cfg = load_config_file()
    assert cfg.source == str(path)
    assert cfg.for_runner("scorer").settings() == {"max_batch_size": 3}


def test_an_explicit_path_wins_over_the_env_var(write_config, monkeypatch):
    env_path = write_config("runners: {batching: {max_batch_size: 3}}", name="env.yaml")
    arg_path = write_config("runners: {batching: {max_batch_size: 7}}", name="arg.yaml")
    monkeypatch.setenv(ENV_VAR, str(env_path))
    assert load_config_file(arg_path).global_batching.settings() == {"max_batch_size": 7}


def test_env_var_pointing_at_a_bad_file_reports_that_file(write_config, monkeypatch):
    path = write_config("runners: {batching: {max_queue_size: 0}}")
    monkeypatch.setenv(ENV_VAR, str(path))
    with pytest.raises(ConfigError, match=r"runners\.batching\.max_queue_size") as info:
        load_config_file()
    assert str(path) in str(info.value)


def test_no_path_and_no_env_var_is_an_empty_config(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert load_config_file() == ConfigFile()
