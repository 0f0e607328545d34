import ast
import re

import pytest
import yaml

import labserve
from labserve import BatchingConfig, export_config, load_config_file
from labserve.cli import main


class Scorer(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=16, max_latency_ms=4)
    def predict(self, x):
        return x

    @labserve.method(batchable=False)
    def info(self):
        return "scorer"


@pytest.fixture
def runner():
    runner = labserve.Runner(Scorer, name="scorer")
    yield runner
    runner.stop()


def test_labserve_yaml_round_trips_through_the_config_file_loader(runner, tmp_path):
    runner.configure("predict", strategy="fixed", max_batch_size=48, isolate_errors=True)
    path = tmp_path / "labserve.yaml"
    path.write_text(export_config(runner.predict))
    loaded = load_config_file(path)
    assert loaded.global_batching.settings() == {}
    assert BatchingConfig(**loaded.for_runner("scorer").settings()) == runner.predict.config
    # And a new runner reading the file gets the exported settings.
    with labserve.Runner(Scorer, name="scorer", config=path) as again:
        assert again.predict.config == runner.predict.config


def test_a_config_without_a_runner_exports_the_global_section(tmp_path):
    cfg = BatchingConfig(enabled=False, max_latency_ms=2.5)
    path = tmp_path / "global.yaml"
    path.write_text(export_config(cfg))
    loaded = load_config_file(path)
    assert loaded.runners == {}
    assert BatchingConfig(**loaded.global_batching.settings()) == cfg


def test_the_yaml_says_what_bentoml_ignores():
    text = export_config(BatchingConfig(), runner="scorer")
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert any("strategy" in c and "labserve-only" in c for c in comments)
    assert yaml.safe_load(text)["runners"]["scorer"]["batching"]["max_batch_size"] == 32


def test_ray_snippet_carries_the_caps_and_parses_as_python(runner):
    runner.configure("predict", max_latency_ms=7.5)
    text = export_config(runner.predict, "ray")
    assert "@serve.batch(max_batch_size=16, batch_wait_timeout_s=0.0075)" in text
    assert "async def predict(self" in text
    ast.parse(text)
    differs = [line for line in text.splitlines() if line.startswith("# Differs:")]
    assert len(differs) == 1
    assert "first request of a batch" in differs[0]
    assert "'adaptive' strategy has no Ray equivalent" in differs[0]


def test_ray_snippet_with_fixed_strategy_and_concurrency():
    cfg = BatchingConfig(strategy="fixed", max_concurrent_batches=3)
    text = export_config(cfg, "ray", method="embed")
    assert "max_concurrent_batches=3" in text
    assert "the strategy matches" in text
    assert "async def embed(" in text


def test_ray_snippet_with_batching_off_batches_one():
    text = export_config(BatchingConfig(strategy="off", max_batch_size=64), "ray")
    assert "@serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)" in text
    assert "batching is off" in text


def test_triton_fragment_carries_the_caps(runner):
    text = export_config(runner.predict, "triton")
    assert "# Triton config.pbtxt fragment for scorer.predict." in text
    assert re.search(r"^max_batch_size: 16$", text, re.M)
    assert re.search(r"^  max_queue_delay_microseconds: 4000$", text, re.M)
    assert re.search(r"^    max_queue_size: 10000$", text, re.M)
    assert text.count("{") == text.count("}")
    assert "'adaptive' strategy has no Triton equivalent" in text


def test_triton_fragment_with_batching_off_has_no_dynamic_batching():
    text = export_config(BatchingConfig(enabled=False, max_batch_size=8), "triton")
    assert "dynamic_batching" not in text.replace("no dynamic_batching block", "")
    assert "max_batch_size: 8" in text


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda r: export_config(r.predict, "onnx"), ValueError, "'labserve', 'ray', 'triton'"),
        (lambda r: export_config(r.info), TypeError, "scorer.info is not batchable"),
        (lambda r: export_config({"max_batch_size": 8}), TypeError, "got dict"),
        (lambda r: export_config(BatchingConfig(), runner="batching"), ValueError, "global"),
        (lambda r: export_config(BatchingConfig(), "ray", method="a b"), ValueError, "'a b'"),
    ],
)
def test_bad_input_is_a_typed_error(runner, call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call(runner)


def test_cli_exports_a_config_file_section_with_overrides(tmp_path, capsys):
    path = tmp_path / "labserve.yaml"
    path.write_text(
        "runners:\n"
        "  batching: {max_batch_size: 64}\n"
        "  scorer:\n"
        "    batching: {strategy: fixed, max_latency_ms: 3}\n"
    )
    argv = ["export", "triton", "--config", str(path), "--runner", "scorer"]
    assert main([*argv, "--max-latency-ms", "2"]) == 0
    out = capsys.readouterr().out
    assert "max_batch_size: 64" in out
    assert "max_queue_delay_microseconds: 2000" in out
    assert "the strategy matches" in out


def test_cli_export_rejects_a_bad_value_in_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["export", "ray", "--max-batch-size", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "max_batch_size must be an integer >= 1, got 0" in err
    assert "Traceback" not in err


def test_the_request_timeout_maps_to_each_systems_nearest_setting():
    cfg = BatchingConfig(strategy="fixed", request_timeout_ms=2500)
    triton = export_config(cfg, "triton")
    assert "default_timeout_microseconds: 2500000" in triton and "timeout_action: REJECT" in triton
    assert "request_timeout_s=2.5" in export_config(cfg, "ray")
    assert "request_timeout_ms: 2500.0" in export_config(cfg)
    assert "timeout" not in export_config(cfg.replace(request_timeout_ms=0), "triton")


def test_a_latency_target_is_named_with_each_systems_nearest_setting():
    cfg = BatchingConfig(latency_slo_ms=15, slo_percentile=95)
    labserve_yaml = export_config(cfg)
    assert "latency_slo_ms: 15.0" in labserve_yaml
    assert "whole-latency budget" in labserve_yaml and "max_latency_ms: 15" in labserve_yaml
    assert "no latency target" in export_config(cfg, "ray")
    assert "no latency target" in export_config(cfg.replace(strategy="fixed"), "triton")
    assert "latency_slo" not in export_config(BatchingConfig(), "ray")


# -- the token settings (a method with a ragged axis) -------------------------------------

TOKENS = BatchingConfig(
    strategy="fixed", max_batch_size=64, max_batch_tokens=2048, length_buckets=[16, 32, 64]
)


def test_the_labserve_yaml_carries_the_token_settings_and_reads_back(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(export_config(TOKENS, "labserve", runner="lm"))
    config = labserve.load_config_file(path)
    assert config.for_runner("lm").settings()["length_buckets"] == (16, 32, 64)
    assert config.for_runner("lm").settings()["max_batch_tokens"] == 2048


def test_ray_counts_tokens_with_batch_size_fn_and_says_how_it_differs():
    text = export_config(TOKENS, "ray")
    assert "max_batch_size=2048" in text and "batch_size_fn=_tokens" in text
    assert "no length buckets (#49844)" in text
    compile(text, "ray_snippet", "exec")  # the snippet is valid Python


def test_triton_and_tf_serving_name_their_nearest_settings():
    triton = export_config(TOKENS, "triton")
    assert "Triton has no token budget" in triton and "allow_ragged_batch" in triton
    tf = export_config(TOKENS, "tfserving")
    assert "pad_variable_length_inputs: true" in tf
    assert "batch_timeout_micros { value: 10000 }" in tf
    assert "no token budget" in tf
    off = export_config(TOKENS.replace(padding=False), "tfserving")
    assert "pad_variable_length_inputs: false" in off
