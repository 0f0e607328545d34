"""calibrate on a request-batching run: the batch cost, its spread and the hand-off.

Runs come from the simulator on a known cost and hand-off (virtual time, no wall clock);
stalls are put into a run's batch times by hand, as a shared machine puts them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import labserve
from labserve.lab.calibrate_requests import MAX_QUANTILES, MIN_BATCHES, calibrate_requests
from labserve.lab.surface import TokenCost
from labserve.sim.batch_cost import BatchCost


def arrivals(rate: float = 2000.0, seconds: float = 3.0, seed: int = 1) -> np.ndarray:
    return np.asarray(labserve.arrivals("poisson", rate_rps=rate).times(seconds, seed=seed))


def test_a_run_simulated_on_a_known_cost_calibrates_back_to_it():
    ran = labserve.simulate(arrivals(), cost=(2.0, 0.1), handoff_ms=0.5, max_batch_size=64)
    cal = labserve.calibrate(ran)
    assert isinstance(cal, labserve.RequestCalibration)
    assert cal.cost.fixed_ms == pytest.approx(2.0, rel=1e-6)
    assert cal.cost.per_item_ms == pytest.approx(0.1, rel=1e-6)
    assert cal.cost.per_token_ms == 0.0
    np.testing.assert_allclose(cal.cost.spread, 1.0, atol=1e-9)  # every batch typical
    np.testing.assert_allclose(cal.handoff_ms, 0.5, atol=1e-6)
    assert len(cal.cost.spread) == min(len(ran.batch_items), MAX_QUANTILES)
    assert len(cal.handoff_ms) == min(cal.requests, MAX_QUANTILES)
    assert not any(cal.arrival_delay_ms)  # a simulated run sends on time
    assert cal.requests == int(ran.served.sum())
    assert cal.rms_ms == pytest.approx(0.0, abs=1e-9)
    # Replayed under the run's own config, it is the run again.
    again = labserve.simulate(ran.arrival_s, **cal.simulate_kwargs())
    np.testing.assert_allclose(again.finish_s, ran.finish_s, atol=1e-9)
    np.testing.assert_array_equal(again.batch_items, ran.batch_items)


def test_simulate_kwargs_carry_the_runs_config_and_take_overrides():
    ran = labserve.simulate(arrivals(), cost=(2.0, 0.1), strategy="greedy", max_batch_size=16)
    kw = labserve.calibrate(ran).simulate_kwargs(max_batch_size=8)
    assert kw["strategy"] == "greedy"
    assert kw["max_batch_size"] == 8
    assert max(labserve.simulate(ran.arrival_s, **kw).batch_items) == 8


def test_stalled_batches_stay_out_of_the_typical_fit_and_make_the_spread():
    ran = labserve.simulate(arrivals(), cost=(2.0, 0.1), max_batch_size=64)
    duration = ran.batch_duration_s.copy()
    stalled = np.arange(len(duration)) % 20 == 0  # one batch in 20 lost its core for a while
    duration[stalled] *= 4.0
    cal = calibrate_requests(dataclasses.replace(ran, batch_duration_s=duration))
    assert cal.cost.fixed_ms == pytest.approx(2.0, rel=1e-6)
    assert cal.cost.per_item_ms == pytest.approx(0.1, rel=1e-6)
    np.testing.assert_array_equal(cal.typical, ~stalled)
    assert np.percentile(cal.cost.spread, 94) == pytest.approx(1.0)
    assert cal.cost.spread[-1] == pytest.approx(4.0)
    assert cal.cost.mean_factor == pytest.approx(1.0 + 3.0 * stalled.mean(), rel=0.02)
    text = repr(cal)
    assert "2.000 ms + 0.1000 ms x items" in text and "off the typical fit" in text
    assert "items" in cal.table().splitlines()[0]


def test_the_spread_reaches_the_simulated_tail():
    times = arrivals()
    typical = labserve.simulate(times, cost=BatchCost(2.0, 0.1), max_batch_size=64)
    spread = (1.0,) * 90 + (3.0,) * 11
    stalls = labserve.simulate(times, cost=BatchCost(2.0, 0.1, spread=spread), max_batch_size=64)
    assert stalls.summary()["latency_p99_ms"] > 1.5 * typical.summary()["latency_p99_ms"]
    assert typical.summary()["latency_p50_ms"] < stalls.summary()["latency_p50_ms"]
    again = labserve.simulate(times, cost=BatchCost(2.0, 0.1, spread=spread), max_batch_size=64)
    np.testing.assert_array_equal(again.batch_duration_s, stalls.batch_duration_s)


def test_handoff_quantiles_are_drawn_per_request_and_hold_no_slot():
    times = arrivals()
    plain = labserve.simulate(times, cost=(2.0, 0.1))
    drawn = labserve.simulate(times, cost=(2.0, 0.1), handoff_ms=[0.0, 1.0, 2.0], seed=3)
    np.testing.assert_array_equal(plain.batch_items, drawn.batch_items)  # batching unchanged
    extra_ms = (drawn.finish_s - plain.finish_s)[plain.served] * 1000.0
    assert extra_ms.min() >= 0.0 and extra_ms.max() <= 2.0
    assert np.median(extra_ms) == pytest.approx(1.0, abs=0.05)
    assert len(np.unique(np.round(extra_ms, 9))) > 100  # each request its own draw


def test_a_ragged_run_calibrates_its_cost_per_padded_token_and_gets_its_handoff():
    true = TokenCost(fixed_ms=1.0, per_item_ms=0.05, per_token_ms=0.002)
    times = arrivals(rate=800.0)
    ran = labserve.simulate(times, cost=true, input_len="uniform:8:256", handoff_ms=0.3)
    plain = labserve.simulate(times, cost=true, input_len="uniform:8:256")
    gap = (ran.finish_s - plain.finish_s)[plain.served]
    np.testing.assert_allclose(gap, 0.0003, atol=1e-9)  # the hand-off was dropped before
    cal = labserve.calibrate(ran)
    assert cal.cost.per_token_ms == pytest.approx(0.002, rel=1e-6)
    assert cal.cost.fixed_ms == pytest.approx(1.0, rel=1e-6)


def test_what_calibrate_cannot_use_is_refused_with_what_it_expected():
    with pytest.raises(TypeError, match=r"RunResult of labserve\.load_test"):
        labserve.calibrate("run.csv")
    ran = labserve.simulate(arrivals(), cost=(2.0, 0.1))
    with pytest.raises(TypeError, match=r"takes cut= only, got memory="):
        labserve.calibrate(ran, memory=True)
    empty = np.zeros(0)
    over_http = dataclasses.replace(
        ran,
        batch_start_s=empty,
        batch_duration_s=empty,
        batch_items=empty.astype(np.int64),
        batch_requests=empty.astype(np.int64),
        batch_reason=empty.astype(np.int8),
    )
    with pytest.raises(ValueError, match=f"at least {MIN_BATCHES} batches, got 0.*over HTTP"):
        labserve.calibrate(over_http)
    with pytest.raises(TypeError, match="got str"):
        calibrate_requests("run.csv")  # type: ignore[arg-type]


def test_batch_cost_and_handoff_are_validated():
    with pytest.raises(ValueError, match="spread must be empty or at least 2 increasing"):
        BatchCost(2.0, spread=(1.2, 1.0))
    with pytest.raises(ValueError, match="per_item_ms must be a finite number >= 0"):
        BatchCost(2.0, per_item_ms=-0.1)
    with pytest.raises(ValueError, match="handoff_ms must be a finite number >= 0, or its"):
        labserve.simulate([0.0, 0.001], handoff_ms=[2.0, 1.0])


def test_an_arrival_delay_moves_the_entry_into_the_queue_not_the_arrival():
    times = np.arange(50) * 0.05  # far apart: each request alone, on an idle runner
    plain = labserve.simulate(times, cost=(2.0, 0.0), strategy="greedy")
    late = labserve.simulate(times, cost=(2.0, 0.0), strategy="greedy", arrival_delay_ms=1.5)
    np.testing.assert_array_equal(late.arrival_s, times)
    np.testing.assert_allclose(late.latency_s - plain.latency_s, 0.0015, atol=1e-9)
    np.testing.assert_allclose(late.queue_wait_s, 0.0015, atol=1e-9)
    # Drawn delays reorder requests; each still gets its own times back.
    busy = arrivals(rate=3000.0)
    drawn = labserve.simulate(busy, cost=(2.0, 0.1), arrival_delay_ms=[0.5, 1.0, 4.0], seed=2)
    np.testing.assert_array_equal(drawn.arrival_s, busy)
    wait_ms = drawn.queue_wait_s * 1000.0
    assert wait_ms.min() >= 0.5 - 1e-9
    assert drawn.served.all()
    # A request delayed while a batch runs loses nothing if it would have waited anyway.
    both = labserve.simulate(
        [0.0, 0.001], cost=(10.0, 0.0), strategy="greedy", arrival_delay_ms=[0.0, 0.0]
    )
    later = labserve.simulate(
        [0.0, 0.001], cost=(10.0, 0.0), strategy="greedy", arrival_delay_ms=[2.0, 2.0]
    )
    assert later.finish_s[1] - both.finish_s[1] == pytest.approx(0.002)  # all shifted by 2 ms
    assert later.batch_items.tolist() == both.batch_items.tolist() == [1, 1]


def test_a_cost_not_linear_in_items_is_bent_to_its_measured_shape():
    def gemv_or_gemm(items: int) -> float:  # one row: a cheap matrix-vector product
        return 0.001 if items == 1 else (10.0 + 0.1 * items) / 1000.0

    times = arrivals(rate=150.0, seconds=20.0)
    ran = labserve.simulate(times, cost=gemv_or_gemm, max_batch_size=64)
    assert (ran.batch_items == 1).sum() >= 2 and (ran.batch_items > 1).sum() >= 2
    cal = labserve.calibrate(ran)
    assert cal.cost.by_items, "a linear fit cannot price one row at a tenth of two"
    assert cal.cost.seconds(1) == pytest.approx(0.001, rel=0.05)
    for n in (2, 3):  # the sizes the run had (beyond them: the largest one's factor)
        assert cal.cost.seconds(n) == pytest.approx(gemv_or_gemm(n), rel=0.05)
    again = labserve.simulate(ran.arrival_s, **cal.simulate_kwargs())
    for key in ("latency_p50_ms", "latency_p99_ms", "mean_batch"):
        assert again.summary()[key] == pytest.approx(ran.summary()[key], rel=0.05), key
    assert "by items" in repr(cal)
    with pytest.raises(ValueError, match="by_items must be"):
        BatchCost(1.0, by_items=((4, 1.0), (2, 1.0)))
