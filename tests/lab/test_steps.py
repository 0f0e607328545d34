"""profile_steps: a generative model's step cost over sequences, new tokens and context."""

import numpy as np
import pytest

from labserve.generation.batch import SeqBatch
from labserve.lab.steps import StepPoint, profile_steps
from labserve.lab.tinylm import TinyLM
from labserve.sim.generation import StepCost

TRUE = StepCost(fixed_ms=2.0, per_seq_ms=0.3, per_batched_token_ms=0.05, per_context_token_ms=1e-4)


class VirtualStepModel:
    """A generative model whose step advances a virtual clock by TRUE's price of the step.

    It keeps a cache length per sequence, as a real model does, and checks that every step
    starts where that sequence's cache ends (so a missing rollback would fail the step).
    """

    vocab_size = 50

    def __init__(self):
        self.now = 0.0
        self.cached: dict[int, int] = {}

    def clock(self):
        return self.now

    def generate(self, batch: SeqBatch) -> np.ndarray:
        context = 0
        for seq_id, tokens, start, _ in batch:
            assert self.cached.get(seq_id, 0) == start, "the step must start at the cache's end"
            assert tokens.max() < self.vocab_size
            self.cached[seq_id] = start + len(tokens)
            context += len(tokens) * start + len(tokens) * (len(tokens) + 1) // 2
        self.now += TRUE.seconds(len(batch), batch.num_tokens, context)
        return np.zeros((batch.num_sampling, self.vocab_size))

    def rollback_step(self, batch: SeqBatch) -> None:
        for seq_id, start in zip(batch.seq_ids, batch.starts, strict=True):
            self.cached[seq_id] = start

    def free_sequences(self, seq_ids) -> None:
        for seq_id in seq_ids:
            self.cached.pop(seq_id, None)


def test_the_fit_recovers_each_term_of_the_step_cost():
    model = VirtualStepModel()
    prof = profile_steps(model, repeats=2, timer=model.clock)
    assert prof.fit.fixed_ms == pytest.approx(TRUE.fixed_ms)
    assert prof.fit.per_seq_ms == pytest.approx(TRUE.per_seq_ms)
    assert prof.fit.per_batched_token_ms == pytest.approx(TRUE.per_batched_token_ms)
    assert prof.fit.per_context_token_ms == pytest.approx(TRUE.per_context_token_ms)
    assert model.cached == {}  # every shape's sequences were freed
    for p in prof.points:
        assert prof.predicted_s(p) == pytest.approx(p.median_s)
    assert "ms x context tokens" in prof.table()


def test_a_point_counts_context_as_the_simulator_prices_it():
    # Two sequences computing 3 tokens after 5 cached: each token reads 6, 7 and 8 tokens.
    p = StepPoint(num_seqs=2, new_tokens=3, start=5, median_s=0.0, spread_s=0.0)
    assert p.num_batched_tokens == 6
    assert p.num_context_tokens == 2 * (6 + 7 + 8)


def test_only_the_timed_step_is_timed_not_the_context_prefill():
    model = VirtualStepModel()
    prof = profile_steps(model, shapes=[(4, 1, 500)], repeats=1, warmup=0, timer=model.clock)
    (point,) = prof.points
    assert point.median_s == pytest.approx(TRUE.seconds(4, 4, 4 * 501))


def test_tinylm_is_profiled_and_left_holding_nothing():
    lm = TinyLM(d_model=32, n_layers=1, d_ff=64, max_model_len=64)
    prof = profile_steps(lm, shapes=[(1, 1, 8), (3, 4, 0), (2, 2, 16)], repeats=1, warmup=0)
    assert [(p.num_seqs, p.new_tokens, p.start) for p in prof.points] == [
        (1, 1, 8),
        (3, 4, 0),
        (2, 2, 16),
    ]
    assert all(p.median_s > 0 for p in prof.points)
    assert lm.num_cached_sequences == 0


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"shapes": [(0, 1, 0)]}, "shapes must be"),
        ({"shapes": []}, "shapes must be"),
        ({"shapes": [(1, 1, -1)]}, "shapes must be"),
        ({"repeats": 0}, "repeats must be >= 1"),
        ({"method": "nope"}, "no method 'nope'"),
    ],
)
def test_bad_arguments_are_refused(kw, words):
    with pytest.raises((ValueError, TypeError), match=words):
        profile_steps(VirtualStepModel(), **kw)


def test_shapes_past_the_models_context_are_refused_before_any_step():
    lm = TinyLM(d_model=32, n_layers=1, d_ff=64, max_model_len=64)
    with pytest.raises(ValueError, match="needs 80 tokens of context, over the model's"):
        profile_steps(lm, shapes=[(1, 1, 8), (1, 16, 64)])
    assert lm.num_cached_sequences == 0


def test_a_model_without_the_hooks_is_refused():
    class NoHooks:
        def generate(self, batch):
            return np.zeros((0, 1))

    with pytest.raises(TypeError, match="free_sequences"):
        profile_steps(NoHooks())


def test_the_shipped_tinylm_step_cost_is_the_recorded_profiles_fit():
    import dataclasses
    import json
    import pathlib

    from labserve.lab.demo import TINYLM_STEP_COST

    recorded = pathlib.Path(__file__).parents[2] / "benchmarks/generation/tinylm_step_cost.json"
    fit = json.loads(recorded.read_text())["fit"]
    shipped = {k: v for k, v in dataclasses.asdict(TINYLM_STEP_COST).items() if k in fit}
    assert shipped == pytest.approx(fit, rel=1e-3)
