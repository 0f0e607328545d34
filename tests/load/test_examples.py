"""load_test with a set of examples, and the error messages of requests that failed."""

from __future__ import annotations

import numpy as np
import pytest

import labserve
from labserve.load.arrivals import ConstantArrivals

pytestmark = pytest.mark.filterwarnings("ignore::labserve.LoadWarning")  # a busy machine


class Picky(labserve.Runnable):
    """Fails the rows whose first value is negative; records the first values it saw."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    @labserve.method(batchable=True, max_batch_size=1, max_latency_ms=1)
    def predict(self, x: np.ndarray) -> np.ndarray:
        self.seen += [float(v) for v in x[:, 0]]
        if (x[:, 0] < 0).any():
            raise ValueError(f"negative input {x[0, 0]:g}")
        return x.sum(axis=1, keepdims=True)


@pytest.fixture
def picky():
    model = Picky()
    runner = labserve.Runner(model, name="picky")
    yield runner, model
    runner.stop()


def test_a_sequence_of_examples_is_sent_in_turn(picky):
    runner, model = picky
    examples = [np.full((1, 4), v) for v in (1.0, 2.0, 3.0)]
    result = labserve.load_test(runner.predict, examples=examples, duration_s=0.1,
                                arrivals=ConstantArrivals(60))  # fmt: skip
    assert len(result.arrival_s) == 6
    assert model.seen == [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]


def test_a_function_of_the_index_over_http_and_the_failures_say_why(picky):
    runner, model = picky
    server = labserve.serve(runner)
    try:
        result = labserve.load_test(
            f"{server.url}/runners/picky/predict",
            examples=lambda k: np.full((1, 4), -1.0 if k % 3 == 2 else float(k)),
            duration_s=0.1,
            arrivals=ConstantArrivals(60),
        )
    finally:
        server.stop()
    assert sorted(model.seen) == sorted([0.0, 1.0, -1.0, 3.0, 4.0, -1.0])
    summary = result.summary()
    assert summary["failed_pct"] == pytest.approx(100 * 2 / 6)
    (message, count), *_ = summary["errors"].items()
    assert count == 2 and message.startswith("HTTP 500 ModelError")
    assert "negative input -1" in message
    assert "2 x HTTP 500 ModelError" in result.table()


def test_in_process_failures_are_counted_by_message(picky):
    runner, _ = picky
    examples = [np.ones((1, 4)), -np.ones((1, 4))]
    result = labserve.load_test(runner.predict, examples=examples, duration_s=0.1,
                                arrivals=ConstantArrivals(40))  # fmt: skip
    errors = result.summary()["errors"]
    assert list(errors.values()) == [2]
    assert next(iter(errors)).startswith("ModelError: ") and "negative input -1" in next(
        iter(errors)
    )


def test_examples_are_checked_before_the_run(picky):
    runner, _ = picky
    with pytest.raises(TypeError, match="examples= alone"):
        labserve.load_test(runner.predict, example=np.ones((1, 4)), examples=[np.ones((1, 4))],
                           duration_s=0.1, arrivals=ConstantArrivals(10))  # fmt: skip
    with pytest.raises(ValueError, match="at least one example"):
        labserve.load_test(runner.predict, examples=[], duration_s=0.1,
                           arrivals=ConstantArrivals(10))  # fmt: skip
    with pytest.raises(TypeError, match="a sequence of examples or a function"):
        labserve.load_test(runner.predict, examples=np.ones((2, 4)), duration_s=0.1,
                           arrivals=ConstantArrivals(10))  # fmt: skip
