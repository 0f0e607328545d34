"""benchmarks/generation/fidelity.py takes its model from --model and its lengths from it."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys
from types import ModuleType

import numpy as np
import pytest

from labserve.config.generation import GenerationConfig
from labserve.lab.demo import SleepModel, TinyLM
from labserve.sim.generation import StepCost

BENCH = pathlib.Path(__file__).parents[2] / "benchmarks" / "generation"


@pytest.fixture
def fidelity(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports its neighbour `models`
    spec = importlib.util.spec_from_file_location("fidelity_bench", BENCH / "fidelity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fidelity_bench", module)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


class TwoTokensPerChar:
    """A stand-in model: its tokenizer makes two tokens of every character."""

    max_model_len = 300

    def encode(self, text: str) -> list[int]:
        return [0, 1] * len(text)


def test_model_spec_names_tinylm_or_a_module_class_and_refuses_anything_else(fidelity):
    models = sys.modules["models"]
    assert models.model_class("tinylm") is TinyLM
    assert models.model_class("labserve.lab.demo:SleepModel") is SleepModel
    with pytest.raises(ValueError, match="'tinylm' or 'module:Class', got 'TinyLM'"):
        models.model_class("TinyLM")
    prefix = (BENCH / "prefix_targets.py").read_text()
    assert "from models import MODEL_HELP, model_class" in prefix  # one definition, shared


def test_prompt_lengths_and_context_come_from_the_model(fidelity):
    assert fidelity.Lengths.of(TinyLM()) == fidelity.Lengths(32, 1024)  # a token per byte
    assert fidelity.Lengths.of(TwoTokensPerChar()) == fidelity.Lengths(64, 300)


def test_the_replay_uses_the_models_prompt_length(fidelity):
    offsets = np.arange(20) * 0.05
    cost = StepCost(1.0, per_batched_token_ms=0.5)  # TTFT follows the prompt's length
    config = GenerationConfig()
    short = fidelity.simulated(config, cost, offsets, 8, fidelity.Lengths(32, 1024))
    long = fidelity.simulated(config, cost, offsets, 8, fidelity.Lengths(256, 1024))
    assert long["ttft"]["p50"] > short["ttft"]["p50"] + 0.5 * (256 - 32) * 0.9
    # Past the model's context every request is refused, as the live method would: no figures.
    refused = fidelity.simulated(config, cost, offsets, 8, fidelity.Lengths(256, 200))
    assert math.isnan(refused["ttft"]["p50"])
