import ast
import re

import pytest
import yaml

import labserve
from labserve import BatchingConfig, export_config, load_config_file
from labserve.cli import main
from labserve.config.generation import GenerationConfig
from labserve.lab.engines import ENGINE_FORMATS


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


# -- a generative method's knobs to the engines' flags ---------------------------------------


def _flags(text):
    """{flag: value} of a command line written one flag per line (value '' for a switch)."""
    out = {}
    for line in text.splitlines():
        line = line.strip().rstrip("\\").strip()
        if line.startswith("--"):
            flag, _, value = line.partition(" ")
            out[flag] = value
    return out


def _differs(text):
    return [line for line in text.splitlines() if line.startswith("# Differs:")]


TUNED = GenerationConfig(
    max_num_seqs=48,
    max_num_batched_tokens=768,
    long_prefill_token_threshold=256,
    scheduling_policy="priority",
    num_kv_blocks=900,
    block_size=32,
)


def test_vllm_flags_carry_every_knob_under_its_own_name():
    flags = _flags(export_config(TUNED, "vllm"))
    assert flags == {
        "--max-num-seqs": "48",
        "--max-num-batched-tokens": "768",
        "--enable-chunked-prefill": "",
        "--long-prefill-token-threshold": "256",
        "--scheduling-policy": "priority",
        "--enable-prefix-caching": "",
        "--block-size": "32",
        "--num-gpu-blocks-override": "900",
    }
    off = _flags(export_config(GenerationConfig(enable_chunked_prefill=False), "vllm"))
    assert "--no-enable-chunked-prefill" in off and "--enable-chunked-prefill" not in off
    assert "--num-gpu-blocks-override" not in off  # no KV budget: vLLM sizes its own cache


def test_vllm_says_where_it_counts_differently():
    text = export_config(GenerationConfig(enable_chunked_prefill=False, strategy="static"), "vllm")
    notes = " ".join(_differs(text))
    assert "shorter prompts pass" in notes  # its order with chunking off
    assert "always batches continuously" in notes  # no static strategy
    assert "gpu-memory-utilization" in notes


def test_sglang_flags_count_prompt_tokens_and_the_kv_pool_in_tokens():
    text = export_config(TUNED, "sglang")
    flags = _flags(text)
    assert flags["--max-running-requests"] == "48"
    assert flags["--max-prefill-tokens"] == "768"
    assert flags["--chunked-prefill-size"] == "256"  # the per-prompt chunk cap is the nearest
    assert flags["--max-total-tokens"] == str(900 * 32)
    assert flags["--page-size"] == "32"
    assert "--schedule-policy" not in flags  # no priority order there: said, not guessed
    notes = " ".join(_differs(text))
    assert "prompt tokens only" in notes and "priority" in notes
    off = _flags(export_config(GenerationConfig(enable_chunked_prefill=False), "sglang"))
    assert off["--chunked-prefill-size"] == "-1"


def test_prefix_caching_and_lpm_export_to_vllm_and_sglang_with_what_differs():
    lpm = GenerationConfig(scheduling_policy="lpm")
    vllm = export_config(lpm, "vllm")
    assert _flags(vllm)["--scheduling-policy"] == "fcfs"  # vLLM has no lpm: said, not guessed
    assert "longest-prefix-match" in " ".join(_differs(vllm))
    assert "when the block is scheduled" in " ".join(_differs(vllm))
    sglang = export_config(lpm, "sglang")
    assert _flags(sglang)["--schedule-policy"] == "lpm" and "--disable-radix-cache" not in sglang
    assert "page-size granularity" in " ".join(_differs(sglang))
    off = GenerationConfig(enable_prefix_caching=False)
    assert "--no-enable-prefix-caching" in _flags(export_config(off, "vllm"))
    assert "--disable-radix-cache" in _flags(export_config(off, "sglang"))


def test_tgi_counts_waiting_requests_in_its_concurrency_cap():
    text = export_config(TUNED.replace(max_queue_size=200), "tgi")
    flags = _flags(text)
    assert flags["--max-concurrent-requests"] == str(48 + 200)
    assert flags["--max-batch-size"] == "48"
    assert flags["--max-batch-prefill-tokens"] == "768"
    assert flags["--max-batch-total-tokens"] == str(900 * 32)
    notes = " ".join(_differs(text))
    assert "does not preempt" in notes and "no launcher flag for chunked prefill" in notes
    unlimited = _flags(export_config(GenerationConfig(), "tgi"))
    assert "--max-batch-total-tokens" not in unlimited


@pytest.mark.parametrize(
    ("cfg", "policy"),
    [
        (GenerationConfig(), "GUARANTEED_NO_EVICT"),
        (GenerationConfig(num_kv_blocks=100), "MAX_UTILIZATION"),
        (GenerationConfig(strategy="static"), "STATIC_BATCH"),
    ],
)
def test_tensorrt_llm_yaml_picks_the_capacity_policy_that_matches(cfg, policy):
    text = export_config(cfg.replace(max_num_seqs=24, max_num_batched_tokens=1024), "tensorrt-llm")
    options = yaml.safe_load(text)
    assert options["max_batch_size"] == 24
    assert options["max_num_tokens"] == 1024
    assert options["enable_chunked_prefill"] is True
    assert options["scheduler_config"] == {"capacity_scheduler_policy": policy}
    assert ("kv_cache_config" in options) == cfg.kv_limited
    assert _differs(text)


def test_goodput_targets_are_named_as_a_benchmark_flag_not_an_engine_one():
    cfg = GenerationConfig(ttft_slo_ms=300, tpot_slo_ms=30)
    for fmt in ENGINE_FORMATS:
        text = export_config(cfg, fmt)
        assert "--goodput ttft:300 tpot:30" in text, fmt
        assert "300" not in "".join(line for line in text.splitlines() if not line.startswith("#"))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: export_config(GenerationConfig(), "triton"), "not 'triton'"),
        (lambda: export_config(BatchingConfig(), "vllm"), "takes a generative method's"),
    ],
)
def test_a_format_for_the_other_kind_of_config_is_refused(call, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        call()


def test_cli_exports_generation_flags(capsys):
    argv = ["export", "sglang", "--max-num-seqs", "16", "--no-enable-chunked-prefill"]
    assert main(argv) == 0
    flags = _flags(capsys.readouterr().out)
    assert flags["--max-running-requests"] == "16"
    assert flags["--chunked-prefill-size"] == "-1"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["export", "ray", "--max-num-seqs", "4"], "--max-num-seqs is a generation setting"),
        (["export", "vllm", "--max-batch-size", "4"], "--max-num-seqs, --max-num-batched-tokens"),
        (["export", "vllm", "--config", "x.yaml"], "needs --runner"),
        (["export", "tgi", "--max-num-batched-tokens", "0"], "max_num_batched_tokens must be"),
    ],
)
def test_cli_refuses_settings_of_the_other_kind_in_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_cli_reads_a_runners_generation_section_then_the_flags(tmp_path, capsys):
    path = tmp_path / "labserve.yaml"
    path.write_text(
        "runners:\n  tinylm:\n    generation: {max_num_seqs: 64, max_num_batched_tokens: 1024}\n"
    )
    argv = ["export", "tgi", "--config", str(path), "--runner", "tinylm"]
    assert main([*argv, "--max-num-batched-tokens", "512"]) == 0
    flags = _flags(capsys.readouterr().out)
    assert flags["--max-batch-size"] == "64"  # from the file
    assert flags["--max-batch-prefill-tokens"] == "512"  # the flag wins


def test_cli_names_the_file_and_key_of_a_bad_generation_value(tmp_path, capsys):
    path = tmp_path / "labserve.yaml"
    path.write_text("runners:\n  tinylm:\n    generation: {max_num_seqs: 0}\n")
    with pytest.raises(SystemExit):
        main(["export", "vllm", "--config", str(path), "--runner", "tinylm"])
    err = capsys.readouterr().err
    assert str(path) in err and "runners.tinylm.generation.max_num_seqs" in err


def test_a_generative_runner_method_exports_its_live_config():
    from labserve.lab.demo import TinyLM

    with labserve.Runner(TinyLM(d_model=32, n_layers=1, d_ff=64), name="lm") as lm:
        lm.generate.configure(max_num_seqs=7, max_num_batched_tokens=96)
        flags = _flags(export_config(lm.generate, "vllm"))
    assert flags["--max-num-seqs"] == "7"
    assert flags["--max-num-batched-tokens"] == "96"
