import time
import warnings

import numpy as np
import pytest

import labserve
from labserve.base.errors import LoadWarning
from labserve.base.vocabulary import OUTCOMES
from labserve.lab.demo import SleepModel
from labserve.load.arrivals import ConstantArrivals
from labserve.load.generator import load_test
from labserve.load.run import _warn_if_behind, schedule_kept


@pytest.fixture
def runner():
    r = labserve.Runner(SleepModel(a_ms=0.0, b_ms=0.0), name="gen", on_overload="wait")
    yield r
    r.stop()


def test_open_loop_sends_on_schedule_and_records_every_request(runner):
    with warnings.catch_warnings():
        # A busy test machine may delay sends; that warning has its own test below.
        warnings.simplefilter("ignore", LoadWarning)
        result = load_test(
            runner.predict, example=np.ones((1, 2)), duration_s=0.5, arrivals=ConstantArrivals(200)
        )
    n = len(result.arrival_s)
    np.testing.assert_allclose(result.arrival_s, np.arange(n) / 200)  # the intended times
    assert n == 100
    assert [OUTCOMES[o] for o in set(result.outcome.tolist())] == ["served"]
    assert np.all(result.arrival_s <= result.start_s)
    assert np.all(result.start_s <= result.finish_s)
    assert result.batch_items.sum() == n  # every request's single row went through a batch
    assert result.send_lag_s is not None and len(result.send_lag_s) == n
    assert result.summary()["offered_rps"] == pytest.approx(200)


def test_closed_loop_keeps_at_most_its_clients_in_flight(runner):
    clients = 3
    result = load_test(runner.predict, example=np.ones((1, 2)), duration_s=0.3, concurrency=3)
    assert result.served.all()
    # At each request's send, count the requests sent earlier and not yet finished.
    for a in result.arrival_s:
        in_flight = np.sum((result.arrival_s <= a) & (result.finish_s > a))
        assert in_flight <= clients
    assert result.batch_items.max() <= clients


def test_overload_outcomes_are_recorded_as_rejected():
    slow = labserve.Runner(
        SleepModel(a_ms=5.0, b_ms=0.0), name="slow", max_latency_ms=1, on_overload="reject"
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LoadWarning)
            result = load_test(
                slow.predict,
                example=np.ones((1, 2)),
                duration_s=0.2,
                arrivals=ConstantArrivals(2000),
            )
    finally:
        slow.stop()
    kinds = {OUTCOMES[o] for o in result.outcome.tolist()}
    # Shed at its deadline (rejected) or, predicted, at admission (refused): never 'failed'.
    assert "served" in kinds and kinds - {"served"} and kinds <= {"served", "rejected", "refused"}
    assert 0 < result.summary()["rejected_pct"] < 100
    served = result.served
    assert np.all(np.isfinite(result.finish_s[served]))


def test_bad_arguments_are_refused(runner):
    x = np.ones((1, 2))
    with pytest.raises(TypeError, match="exactly one of"):
        load_test(runner.predict, example=x, duration_s=1)
    with pytest.raises(TypeError, match="exactly one of"):
        load_test(
            runner.predict, example=x, duration_s=1, arrivals=ConstantArrivals(1), concurrency=1
        )
    with pytest.raises(ValueError, match="duration_s must be"):
        load_test(runner.predict, example=x, duration_s=0, concurrency=1)
    with pytest.raises(ValueError, match="concurrency must be"):
        load_test(runner.predict, example=x, duration_s=1, concurrency=0)


def test_falling_behind_schedule_is_said_not_hidden():
    with pytest.warns(LoadWarning, match="could not keep 100 req/s"):
        _warn_if_behind(np.array([0.0] * 98 + [0.02, 0.03]), 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_behind(np.array([0.0, 0.001, 0.002]), 100)


def test_one_pause_at_a_low_rate_keeps_the_schedule_a_growing_lag_does_not():
    # At 4 req/s (250 ms apart) one send 94 ms late delays nothing after it.
    kept, said = schedule_kept(np.array([0.001] * 8 + [0.094]), 4)
    assert kept and said.startswith("1 of 9 sends more than 25 ms late"), said
    # Three of nine late is the generator, not a pause.
    assert not schedule_kept(np.array([0.001] * 6 + [0.094] * 3), 4)[0]
    # A generator that cannot keep 1,000 req/s falls 1 ms further behind each send.
    assert not schedule_kept(np.arange(200) * 0.001, 1000)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_behind(np.array([0.001] * 8 + [0.094]), 4)


def test_start_load_returns_at_once_and_stop_ends_the_sending_early(runner):
    run = labserve.start_load(
        runner.predict, example=np.ones((1, 2)), duration_s=60, arrivals=ConstantArrivals(200)
    )
    assert run.running
    for _ in range(500):  # wait for some sends (the loop runs them), at most 5 s
        if run.sent >= 20:
            break
        time.sleep(0.01)
    run.stop()
    run.stop()  # idempotent
    with warnings.catch_warnings():  # a busy machine may delay sends; tested on its own above
        warnings.simplefilter("ignore", LoadWarning)
        result = run.result(timeout=10)
    assert not run.running
    n = len(result.arrival_s)
    assert 20 <= n < 12_000  # far fewer than 60 s at 200 req/s
    assert n == run.sent
    assert [OUTCOMES[o] for o in set(result.outcome.tolist())] == ["served"]  # all answered
    assert result.duration_s < 60  # rates are over the span actually run


def test_stopping_a_closed_loop_run(runner):
    run = labserve.start_load(runner.predict, example=np.ones((1, 2)), duration_s=60, concurrency=2)
    run.stop()
    result = run.result(timeout=10)
    assert len(result.arrival_s) == run.sent
    assert set(result.outcome.tolist()) <= {0}


def test_result_times_out_while_the_run_goes_on(runner):
    run = labserve.start_load(
        runner.predict, example=np.ones((1, 2)), duration_s=60, arrivals=ConstantArrivals(10)
    )
    with pytest.raises(TimeoutError, match="still going"):
        run.result(timeout=0.05)
    run.stop()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LoadWarning)
        run.result(timeout=10)


def test_load_test_takes_start_loads_parameters_declared_once(runner):
    import inspect

    from labserve.load.generation import generation_load_test
    from labserve.load.generator import start_load

    shown = inspect.signature(load_test).parameters
    generation = inspect.signature(generation_load_test).parameters
    output_len = generation["output_len"]
    expected = [
        *inspect.signature(start_load).parameters.values(),
        output_len.replace(default=None, annotation=f"{output_len.annotation} | None"),
        generation["model"],  # None already
        generation["goodput"],
        generation["workload"],
    ]
    assert list(shown.values()) == expected  # what help() and IDEs show
    # None is "not set", for any target (as when load_test declared them itself).
    load_test(runner.predict, example=np.ones((1, 2)), duration_s=0.05, concurrency=1,
              output_len=None, model=None, goodput=None, workload=None)  # fmt: skip
    assert "Drive ``target``" in (load_test.__doc__ or "")
    with pytest.raises(TypeError, match="duraton_s"):  # a typo is refused, not ignored
        load_test(runner.predict, example=np.ones((1, 2)), duraton_s=1, concurrency=1)
