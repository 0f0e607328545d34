import numpy as np
import pytest

import labserve
from labserve.base.clock import SimClock
from labserve.lab.demo import MemoryBoundModel, SleepModel
from labserve.lab.profiling import profile


def virtual_model(a_s, b_s, clock):
    """A model whose call advances a virtual clock by a + b * rows."""

    def call(x):
        clock.advance(a_s + b_s * len(x))
        return x

    return call


def test_profile_recovers_the_cost_of_a_linear_model():
    clock = SimClock()
    curve = profile(
        virtual_model(0.002, 0.0001, clock),
        example=np.ones((1, 4)),
        sizes=[1, 2, 4, 8, 16],
        repeats=3,
        timer=clock.now,
    )
    assert curve.sizes == (1, 2, 4, 8, 16)
    np.testing.assert_allclose(curve.median_s, [0.002 + 0.0001 * n for n in curve.sizes])
    assert curve.fit.a_ms == pytest.approx(2.0)
    assert curve.fit.b_ms == pytest.approx(0.1)
    # Per-item cost falls with batch size: the lesson's "faster on a batch".
    per_item = curve.per_item_ms()
    assert per_item == sorted(per_item, reverse=True)
    # The curve is a cost simulate() accepts: interpolated inside, the fit outside.
    assert curve(4) == pytest.approx(0.0024)
    assert curve(100) == pytest.approx(0.012)
    result = labserve.simulate([0.0, 0.1], cost=curve, strategy="greedy")
    np.testing.assert_allclose(result.batch_duration_s, [curve(1), curve(1)])


def test_profile_repeats_the_example_along_the_runner_methods_batch_axis():
    seen = []

    class Columns(labserve.Runnable):
        @labserve.method(batchable=True, batch_dim=1)
        def predict(self, x):
            seen.append(x.shape)
            return x

    runner = labserve.Runner(Columns)
    profile(runner.predict, example=np.ones((3, 1)), sizes=[2, 5], repeats=1, warmup=0)
    assert seen == [(3, 2), (3, 5)]
    runner.stop()


def test_profile_refuses_bad_sizes():
    with pytest.raises(ValueError, match="sizes must be integers >= 1"):
        profile(lambda x: x, example=np.ones((1, 1)), sizes=[0, 4])


def test_sleep_model_returns_row_sums_through_a_runner():
    runner = labserve.Runner(SleepModel(a_ms=0.0, b_ms=0.0), name="sleepy")
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(runner.predict.run(x), [[3.0], [12.0]])
    runner.stop()


def test_memory_bound_model_batches_give_each_row_its_own_scores():
    model = MemoryBoundModel(width=64, seed=3)
    rows = model.example(rows=5)
    alone = np.concatenate([model.predict(rows[i : i + 1]) for i in range(5)])
    np.testing.assert_allclose(model.predict(rows), alone, rtol=1e-5, atol=1e-6)
    assert model.predict(rows).shape == (5, 16)
    with pytest.raises(ValueError, match="width must be"):
        MemoryBoundModel(width=4)
