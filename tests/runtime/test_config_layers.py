import numpy as np
import pytest

import labserve


class Layered(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=7, strategy="fixed")
    def predict(self, x: np.ndarray) -> np.ndarray:
        return x

    @labserve.method(batchable=True)
    def embed(self, x: np.ndarray) -> np.ndarray:
        return x


def write(tmp_path, text):
    path = tmp_path / "labserve.yaml"
    path.write_text(text)
    return path


def test_each_layer_wins_over_the_ones_below_it(tmp_path):
    path = write(
        tmp_path,
        """
runners:
  batching: {max_batch_size: 100, max_latency_ms: 50, on_overload: wait, max_queue_size: 77}
  layered:
    batching: {max_latency_ms: 3, max_concurrent_batches: 2}
""",
    )
    runner = labserve.Runner(
        Layered,
        config=path,
        max_concurrent_batches=3,
        method_configs={"embed": {"strategy": "off"}},
    )
    predict, embed = runner.predict.config, runner.embed.config
    # The file's global section: below the decorator, above the defaults.
    assert (predict.max_batch_size, embed.max_batch_size) == (8, 100)
    assert predict.on_overload == embed.on_overload == "wait"
    assert predict.max_queue_size == 77
    # The runner's section: above the decorator.
    assert predict.max_latency_ms == embed.max_latency_ms == 3
    # Runner arguments above the runner's section; method_configs for one method.
    assert predict.max_concurrent_batches == embed.max_concurrent_batches == 3
    assert (predict.strategy, embed.strategy) == ("fixed", "off")
    # A live change above everything, and only for its method.
    runner.configure("predict", max_latency_ms=1)
    assert (runner.predict.config.max_latency_ms, runner.embed.config.max_latency_ms) == (1, 3)
    runner.stop()


def test_enabled_false_in_the_file_turns_batching_off(tmp_path):
    path = write(tmp_path, "runners:\n  layered:\n    batching: {enabled: false}\n")
    runner = labserve.Runner(Layered, config=path)
    assert runner.predict.config.effective_strategy == "off"
    runner.stop()


def test_the_file_is_read_from_labserve_config(tmp_path, monkeypatch):
    path = write(tmp_path, "runners:\n  batching: {max_batch_size: 5}\n")
    monkeypatch.setenv("LABSERVE_CONFIG", str(path))
    runner = labserve.Runner(Layered)
    assert runner.embed.config.max_batch_size == 5
    runner.stop()


def test_a_bad_file_names_the_file_the_key_and_the_rule(tmp_path):
    path = write(tmp_path, "runners:\n  layered:\n    batching: {max_batch_size: 0}\n")
    with pytest.raises(labserve.ConfigError) as info:
        labserve.Runner(Layered, config=path)
    message = str(info.value)
    assert str(path) in message
    assert "runners.layered.batching.max_batch_size must be an integer >= 1, got 0" in message


def test_bad_runner_arguments_are_refused_with_the_rule():
    with pytest.raises(labserve.ConfigError, match="strategy must be one of"):
        labserve.Runner(Layered, strategy="fastest")
    with pytest.raises(ValueError, match="method_configs names 'nope'"):
        labserve.Runner(Layered, method_configs={"nope": {}})
