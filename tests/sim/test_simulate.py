import math

import numpy as np
import pytest

import labserve
from labserve.base.vocabulary import OUTCOMES, REASONS, REFUSED, REJECTED
from labserve.sim import LinearCost, simulate
from labserve.testing import assert_slo

MS = 1e-3


def poisson(rate, n, seed=0):
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


def test_the_same_inputs_give_bit_identical_results():
    times = poisson(3000, 5000)
    runs = [
        simulate(times, cost=LinearCost(2.0, 0.1, jitter=0.2), seed=7, max_batch_size=32)
        for _ in range(2)
    ]
    for name in ("start_s", "finish_s", "outcome", "batch_items", "batch_duration_s"):
        np.testing.assert_array_equal(getattr(runs[0], name), getattr(runs[1], name))
    other = simulate(times, cost=LinearCost(2.0, 0.1, jitter=0.2), seed=8, max_batch_size=32)
    assert not np.array_equal(runs[0].batch_duration_s, other.batch_duration_s)


def test_fixed_with_evenly_spaced_arrivals_forms_full_batches():
    # One request per ms, cap 4, a 1 ms model: each batch fills at its 4th arrival.
    times = np.arange(400) * MS
    r = simulate(times, cost=(1.0, 0.0), strategy="fixed", max_batch_size=4, max_latency_ms=100)
    assert set(r.batch_items.tolist()) == {4}
    assert r.summary()["fire_reasons"] == {"full": 100}
    # The first of each four waited 3 ms for the batch to fill, the last none; +1 ms model.
    np.testing.assert_allclose(np.sort(np.unique(np.round(r.latency_s / MS, 6))), [1, 2, 3, 4])


def test_greedy_runs_each_request_alone_when_arrivals_are_far_apart():
    times = np.arange(100) * 10 * MS  # 10 ms apart, a 2 ms model: never two in the queue
    r = simulate(times, cost=(2.0, 0.0), strategy="greedy", max_batch_size=64)
    assert r.batch_items.tolist() == [1] * 100
    np.testing.assert_allclose(r.latency_s, 2 * MS)


def test_every_request_gets_exactly_one_outcome_under_overload():
    cap, wait_ms = 16, 5
    r = simulate(
        poisson(20000, 20000),
        cost=(2.0, 0.2),
        max_batch_size=cap,
        max_latency_ms=wait_ms,
        on_overload="reject",
    )
    assert set(np.unique(r.outcome).tolist()) <= set(range(len(OUTCOMES)))
    s = r.summary()
    assert s["rejected_pct"] > 0
    # Served requests never waited past the cap (virtual time has no late timers).
    assert r.queue_wait_s.max() <= wait_ms * MS + 1e-12
    # Capacity at full batches: cap / (2 + 0.2 * cap) ms.
    capacity = cap / ((2.0 + 0.2 * cap) * MS)
    busy_s = np.nanmax(r.finish_s)  # the queue drains after the last arrival
    served = int(r.served.sum())
    assert served <= capacity * busy_s * 1.001
    assert served >= 0.9 * capacity * busy_s


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_overload_is_shed_at_admission_when_model_time_varies(seed):
    # Reject mode at 8,000 req/s offered, each batch's time off its fit by up to 5%: what
    # cannot start within the cap is refused at the call, not left to wait and be shed
    # later (11-14% of what was shed, before the margin and the re-check), and throughput
    # stays at the model's capacity with every served wait within the cap.
    r = simulate(
        labserve.PoissonArrivals(8000),
        duration_s=5,
        seed=seed,
        cost=LinearCost(2.0, 0.1, jitter=0.05),
        strategy="greedy",
        max_batch_size=64,
        max_latency_ms=20,
        on_overload="reject",
    )
    refused = int((r.outcome == REFUSED).sum())
    shed_late = int((r.outcome == REJECTED).sum())
    assert refused > 0.03 * len(r.outcome)  # about 5% must go: 8,000 offered, 7,619 capacity
    assert shed_late < 0.01 * (refused + shed_late)
    assert r.served.sum() / 5 >= 0.97 * 64 / ((2.0 + 0.1 * 64) * MS)
    assert r.queue_wait_s.max() <= 20 * MS + 1e-12


def test_simulates_an_arrival_process_with_a_duration():
    class Every:
        def times(self, duration_s, seed=0):
            return np.arange(0.0, duration_s, 0.001)

    r = simulate(Every(), duration_s=1.0, strategy="greedy")
    assert len(r.arrival_s) == 1000
    assert math.isclose(r.summary()["offered_rps"], 1000.0)
    with pytest.raises(TypeError, match="needs duration_s"):
        simulate(Every())


def test_bad_inputs_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="increasing"):
        simulate([0.002, 0.001])
    with pytest.raises(ValueError, match="jitter must be"):
        LinearCost(1.0, 0.0, jitter=1.5)
    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1"):
        simulate([0.0], max_batch_size=0)
    with pytest.raises(TypeError, match="cost must be"):
        simulate([0.0], cost="fast")


def test_summary_table_and_csv(tmp_path):
    r = simulate(poisson(1000, 2000), cost=(2.0, 0.1), label="greedy at 1000/s", strategy="greedy")
    s = r.summary()
    assert s["requests"] == 2000
    assert s["latency_p50_ms"] <= s["latency_p99_ms"] <= s["latency_p99_9_ms"]
    assert np.isclose(s["latency_p99_ms"], np.percentile(r.latency_s, 99) * 1000)
    text = r.table()
    assert text.startswith("greedy at 1000/s") and "mean_batch" in text
    path = tmp_path / "run.csv"
    r.to_csv(path)
    lines = path.read_text().splitlines()
    assert lines[0] == "arrival_s,start_s,finish_s,outcome,items"
    assert len(lines) == 2001 and lines[1].endswith(",served,1")


def reference(times, cost_s, items=1, **settings):
    """The plainest driver of the real queue: one admit and one poll per arrival."""
    import heapq

    from labserve.base.errors import OverloadError, QueueFullError
    from labserve.batching.containers import Codec
    from labserve.batching.queue import BatchQueue
    from labserve.config.batching import BatchingConfig

    q = BatchQueue("ref", Codec("ref"), BatchingConfig(**settings))
    heap, wake, seq, batches = [], None, 0, []
    finish = {}
    i = 0
    while i < len(times) or heap:
        if heap and (i == len(times) or heap[0][0] <= times[i]):
            now, _, batch = heapq.heappop(heap)
            if batch is None:
                if now != wake:
                    continue
                wake = None
            else:
                outputs = [[None] * (b - a) for _, a, b in batch.parts]
                for r, _, _ in q.complete(batch, outputs, now):
                    finish[r.handle] = now
                q.release(batch, now, ok=True)
        else:
            now = float(times[i])
            i += 1
            try:
                q.admit(q.new_request(([None] * items,), handle=i - 1), now)
            except (QueueFullError, OverloadError):
                continue  # refused: no poll, as the simulator does
        step = q.poll(now)
        for batch in step.fire:
            batches.append((now, batch.items, batch.reason))
            seq += 1
            heapq.heappush(heap, (now + cost_s(batch.items), seq, batch))
        if step.wake_s is not None and step.wake_s != wake:
            wake = step.wake_s
            seq += 1
            heapq.heappush(heap, (wake, seq, None))
    return batches, finish


@pytest.mark.parametrize("strategy", ["fixed", "greedy", "adaptive", "off"])
@pytest.mark.parametrize("rate", [500, 4000, 20000])
def test_bulk_admission_decides_exactly_as_a_poll_after_every_arrival(strategy, rate):
    times = poisson(rate, 3000, seed=rate)
    cost = LinearCost(2.0, 0.1)
    settings = dict(strategy=strategy, max_batch_size=16, max_latency_ms=5, max_queue_size=200)
    batches, finish = reference(times, cost.seconds, **settings)
    r = simulate(times, cost=cost, **settings)
    assert list(zip(r.batch_start_s, r.batch_items, r.batch_reason, strict=True)) == [
        (t, n, REASONS.index(reason)) for t, n, reason in batches
    ]
    served = np.flatnonzero(r.served)
    assert served.tolist() == sorted(finish)
    assert r.finish_s[served].tolist() == [finish[k] for k in served]


@pytest.mark.parametrize(
    ("strategy", "rate", "items", "extra"),
    [
        ("greedy", 4000, 1, {"max_concurrent_batches": 2}),
        ("adaptive", 4000, 1, {"max_concurrent_batches": 2}),
        ("adaptive", 20000, 1, {"max_concurrent_batches": 3}),
        ("fixed", 4000, 1, {"max_concurrent_batches": 2}),
        ("greedy", 20000, 1, {"on_overload": "wait"}),
        ("adaptive", 20000, 1, {"on_overload": "wait"}),
        ("greedy", 20000, 1, {"on_overload": "reject"}),
        ("fixed", 6000, 1, {"on_overload": "reject", "max_concurrent_batches": 2}),
        ("adaptive", 20000, 3, {"on_overload": "reject", "latency_slo_ms": 4}),
        ("greedy", 2000, 3, {}),
        ("adaptive", 3000, 5, {}),
        ("fixed", 3000, 20, {}),  # larger than the cap: requests split across batches
        ("greedy", 3000, 20, {"max_concurrent_batches": 2}),
    ],
)
def test_bulk_admission_matches_a_poll_after_every_arrival_across_settings(
    strategy, rate, items, extra
):
    times = poisson(rate, 3000, seed=rate + items)
    cost = LinearCost(2.0, 0.1)
    settings = dict(strategy=strategy, max_batch_size=16, max_latency_ms=5, max_queue_size=200)
    settings.update(extra)
    batches, finish = reference(times, cost.seconds, items=items, **settings)
    r = simulate(times, cost=cost, items_per_request=items, **settings)
    assert list(zip(r.batch_start_s, r.batch_items, r.batch_reason, strict=True)) == [
        (t, n, REASONS.index(reason)) for t, n, reason in batches
    ]
    served = np.flatnonzero(r.served)
    assert served.tolist() == sorted(finish)
    assert r.finish_s[served].tolist() == [finish[k] for k in served]


def test_handoff_delays_each_answer_and_leaves_batching_alone():
    times = poisson(2000, 3000)
    plain = simulate(times, strategy="greedy")
    handed = simulate(times, strategy="greedy", handoff_ms=1.5)
    np.testing.assert_array_equal(plain.batch_items, handed.batch_items)
    np.testing.assert_array_equal(plain.start_s, handed.start_s)
    np.testing.assert_allclose(handed.latency_s - plain.latency_s, 1.5 * MS)
    with pytest.raises(ValueError, match="handoff_ms must be a finite number >= 0"):
        simulate(times, handoff_ms=-1.0)


def test_a_simulated_overload_with_a_request_timeout_ends_some_requests_in_timeouts():
    times = np.arange(2000) * 0.0002  # 5000 req/s into a model that serves about 1,300
    r = simulate(
        times,
        cost=(2.0, 1.0),
        strategy="greedy",
        max_batch_size=4,
        on_overload="wait",
        request_timeout_ms=50,
    )
    s = r.summary()
    timed_out = int((r.outcome == OUTCOMES.index("timeout")).sum())
    assert timed_out > 0 and s["timeout_pct"] == pytest.approx(100.0 * timed_out / len(times))
    assert simulate(times[:10], cost=(2.0, 1.0)).summary()["timeout_pct"] == 0.0
    with pytest.raises(AssertionError, match="timeout_pct: asked <= 0"):
        assert_slo(r, timeout_pct=0)
    assert_slo(r, timeout_pct=100)


def test_a_latency_target_is_met_with_less_model_time_than_greedy():
    # The case: cost 2 ms + 0.1 ms/item, cap 64, a 15 ms target at p99.
    for rate, most in ((1000, 0.5), (2000, 0.5), (4000, 1.0)):
        times = poisson(rate, rate * 10, seed=rate)
        caps = dict(cost=(2.0, 0.1), max_batch_size=64, max_latency_ms=20, handoff_ms=1.0)
        greedy = simulate(times, strategy="greedy", **caps).summary()
        aimed = simulate(times, strategy="adaptive", latency_slo_ms=15, **caps).summary()
        assert aimed["latency_p99_ms"] <= 15.0, rate
        assert aimed["slo_met_pct"] >= 99.0, rate
        assert aimed["model_ms_per_request"] < most * greedy["model_ms_per_request"], rate
        assert aimed["mean_batch"] > greedy["mean_batch"], rate


def test_the_batch_follows_a_step_in_load_within_a_second_and_the_target_holds():
    arrivals = labserve.StepArrivals([(0, 200), (5, 4000), (10, 200)])
    r = simulate(
        arrivals,
        duration_s=15,
        seed=1,
        cost=(2.0, 0.1),
        handoff_ms=1.0,
        strategy="adaptive",
        latency_slo_ms=15,
        max_batch_size=64,
        max_latency_ms=20,
    )
    latency_ms = (r.finish_s - r.arrival_s) * 1000.0
    for start, stop in ((1, 5), (6, 10), (11, 15)):  # each phase after its first second
        phase = (r.arrival_s >= start) & (r.arrival_s < stop) & r.served
        assert np.percentile(latency_ms[phase], 99) <= 15.0, start

    def mean_batch(start, stop):
        fired = (r.batch_start_s >= start) & (r.batch_start_s < stop)
        return r.batch_items[fired].mean()

    assert mean_batch(5.5, 6.0) > 4 * mean_batch(4.0, 5.0)  # up within half a second
    assert mean_batch(10.5, 11.0) < mean_batch(9.0, 10.0) / 4  # and down again


def test_without_a_target_the_summary_has_no_slo_share_and_costs_are_reported():
    s = simulate(poisson(1000, 2000), cost=(2.0, 0.1), strategy="greedy").summary()
    assert "slo_met_pct" not in s
    assert 0 < s["model_ms_per_request"] and 0 < s["model_busy_pct"] < 100
