from collections import Counter, defaultdict

import numpy as np
import pytest

from labserve.base.clock import SimClock
from labserve.base.errors import (
    InputError,
    ModelError,
    OverloadError,
    QueueFullError,
    RunnerStoppedError,
)
from labserve.base.vocabulary import STRATEGIES
from labserve.batching.bulk import BulkQueue
from labserve.batching.containers import Codec, TensorSpec
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig

MS = 1e-3


def make_queue(codec=None, **settings):
    return BatchQueue("m", codec or Codec("m"), BatchingConfig(**settings))


def make_bulk_queue(**settings):
    return BulkQueue("m", Codec("m"), BatchingConfig(**settings))


def rows(n, width=3, start=0, dtype=np.float64):
    """``n`` distinct rows, so every row is recognisable in an output."""
    return (np.arange(n * width).reshape(n, width) + start).astype(dtype)


def model(x):
    return x * 2 + 1


def run(q, batch, now, fn=model):
    """Run ``batch`` like a driver does: stack, call, split, complete, release."""
    output = fn(*batch.stack(q.codec))
    outcomes = q.complete(batch, q.codec.split(output, batch.counts), now)
    q.release(batch, now, ok=True)
    return outcomes


def results(outcomes):
    """{request id: result} of a list of outcomes, checking none is an error."""
    assert all(err is None for _, _, err in outcomes)
    return {r.id: value for r, value, _ in outcomes}


def part_ids(batch):
    return [r.id for r, _, _ in batch.parts]


# -- fixed ---------------------------------------------------------------------------


def test_fixed_holds_until_the_oldest_request_has_waited_max_latency_then_fires_timeout():
    q = make_queue(strategy="fixed", max_batch_size=8, max_latency_ms=10)
    t0 = 0.5
    r = q.admit((rows(2),), now=t0)
    step = q.poll(t0)
    assert step.fire == []
    deadline = t0 + 10 * MS
    assert step.wake_s == pytest.approx(deadline)
    assert q.poll(t0 + 4 * MS).fire == []
    assert q.poll(np.nextafter(step.wake_s, 0.0)).fire == []
    fired = q.poll(step.wake_s).fire
    assert [b.reason for b in fired] == ["timeout"]
    assert part_ids(fired[0]) == [r.id]


def test_fixed_deadline_follows_the_oldest_request_not_the_newest():
    q = make_queue(strategy="fixed", max_batch_size=8, max_latency_ms=10)
    q.admit((rows(1),), now=0.0)
    q.poll(0.0)
    q.admit((rows(1),), now=0.007)
    assert q.poll(0.007).wake_s == pytest.approx(0.010)
    fired = q.poll(0.010).fire
    assert [(b.reason, b.items) for b in fired] == [("timeout", 2)]


def test_fixed_fires_full_when_queued_items_reach_the_cap():
    q = make_queue(strategy="fixed", max_batch_size=4, max_latency_ms=10)
    for i in range(3):
        q.admit((rows(1, start=i),), now=i * MS)
        assert q.poll(i * MS).fire == []
    q.admit((rows(1, start=3),), now=3 * MS)
    fired = q.poll(3 * MS).fire
    assert [(b.reason, b.items, len(b.parts)) for b in fired] == [("full", 4, 4)]


def test_max_batch_size_counts_items_not_requests():
    q = make_queue(strategy="fixed", max_batch_size=6, max_latency_ms=10)
    q.admit((rows(2),), now=0.0)
    q.admit((rows(2),), now=0.0)
    assert q.poll(0.0).fire == []  # 4 items in 2 requests: not full
    q.admit((rows(2),), now=0.0)
    fired = q.poll(0.0).fire
    assert [(b.reason, b.items, len(b.parts)) for b in fired] == [("full", 6, 3)]


def test_a_batch_never_holds_more_items_than_the_cap():
    q = make_queue(strategy="greedy", max_batch_size=5)
    for _ in range(3):
        q.admit((rows(2),), now=0.0)
    first = q.poll(0.0).fire
    assert [b.items for b in first] == [4]  # the third request (2 items) would make 6
    run(q, first[0], 0.001)
    assert [b.items for b in q.poll(0.001).fire] == [2]


# -- greedy and off ------------------------------------------------------------------


def test_greedy_fires_whatever_is_queued_when_a_slot_is_free():
    q = make_queue(strategy="greedy", max_batch_size=8, max_latency_ms=10)
    ids = [q.admit((rows(1),), now=0.0).id for _ in range(3)]
    step = q.poll(0.0)
    assert [(b.reason, part_ids(b)) for b in step.fire] == [("idle", ids)]
    assert step.wake_s is None


def test_greedy_fires_full_at_the_cap_and_the_rest_after_release():
    q = make_queue(strategy="greedy", max_batch_size=8)
    for _ in range(11):
        q.admit((rows(1),), now=0.0)
    first = q.poll(0.0).fire
    assert [(b.reason, b.items) for b in first] == [("full", 8)]
    assert q.poll(0.001).fire == []  # the only slot is busy
    run(q, first[0], 0.002)
    assert [(b.reason, b.items) for b in q.poll(0.002).fire] == [("idle", 3)]


def test_off_runs_one_request_per_batch():
    q = make_queue(strategy="off", max_batch_size=32, max_concurrent_batches=3)
    ids = [q.admit((rows(2),), now=0.0).id for _ in range(3)]
    fired = q.poll(0.0).fire
    assert [part_ids(b) for b in fired] == [[i] for i in ids]
    assert [b.items for b in fired] == [2, 2, 2]


def test_disabled_batching_runs_one_request_per_batch():
    q = make_queue(enabled=False, strategy="fixed", max_concurrent_batches=4)
    for _ in range(4):
        q.admit((rows(1),), now=0.0)
    fired = q.poll(0.0).fire
    assert [len(b.parts) for b in fired] == [1, 1, 1, 1]


# -- adaptive ------------------------------------------------------------------------


A_S, B_S = 5 * MS, 0.05 * MS


def fit_cost(q, a_s=A_S, b_s=B_S, batches=64):
    for items in range(1, batches + 1):
        q.cost_model.observe(items, a_s + b_s * items)


def arrivals_at_rate(q, rate, until_s):
    """Feed the queue's rate estimator a steady stream of arrivals up to ``until_s``."""
    for t in np.arange(0.0, until_s, 1.0 / rate):
        q.rate.observe(float(t), 1)


def test_adaptive_with_a_target_holds_when_busy_then_fires_adaptive():
    q = make_queue(strategy="adaptive", max_batch_size=64, max_latency_ms=10, latency_slo_ms=15)
    fit_cost(q)
    assert q.cost_model.fit.ready
    arrivals_at_rate(q, 2000.0, 1.0)  # steady arrivals, one queued
    first = q.admit((rows(1),), now=1.0)
    step = q.poll(1.0)
    assert step.fire == []
    assert 1.0 < step.wake_s <= 1.0 + 10 * MS
    joiner_t = 1.0 + (step.wake_s - 1.0) / 4
    joiner = q.admit((rows(1),), now=joiner_t)
    step = q.poll(joiner_t)
    assert step.fire == []
    fired = q.poll(step.wake_s).fire
    assert [b.reason for b in fired] == ["adaptive"]
    assert part_ids(fired[0]) == [first.id, joiner.id]


def test_adaptive_fires_at_once_when_arrivals_are_rare():
    q = make_queue(strategy="adaptive", max_batch_size=64, max_latency_ms=10)
    fit_cost(q)
    arrivals_at_rate(q, 5.0, 4.0)
    q.admit((rows(1),), now=4.0)
    assert [b.reason for b in q.poll(4.0).fire] == ["idle"]


def test_adaptive_fires_at_once_until_its_cost_fit_is_ready():
    q = make_queue(strategy="adaptive", max_batch_size=64, max_latency_ms=10)
    fit_cost(q, batches=3)
    assert not q.cost_model.fit.ready
    arrivals_at_rate(q, 2000.0, 1.0)
    q.admit((rows(1),), now=1.0)
    assert [b.reason for b in q.poll(1.0).fire] == ["idle"]


def test_adaptive_never_fires_later_than_max_latency_after_arrival():
    """Random scenarios: with the slot free, no request's batch fires past its deadline."""
    rng = np.random.default_rng(12345)
    reasons = Counter()
    for _ in range(120):
        cap = int(rng.integers(1, 65))
        q = make_queue(
            strategy="adaptive",
            max_batch_size=cap,
            max_latency_ms=float(rng.uniform(0.2, 30)),
            latency_slo_ms=float(rng.uniform(1, 60)),
        )
        a_s, b_s = float(10 ** rng.uniform(-4, -1)), float(rng.uniform(0, 1e-3))
        for items in rng.integers(1, cap + 1, size=16):
            q.cost_model.observe(int(items), (a_s + b_s * items) * rng.uniform(0.9, 1.1))
        rate = float(10 ** rng.uniform(1, 4.5))
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=150))
        max_wait = q.config.max_latency_s
        fired = {}
        admitted = []
        wake = None
        i = 0
        while True:
            if wake is not None and (i == len(arrivals) or wake <= arrivals[i]):
                now = wake
            elif i < len(arrivals):
                now = float(arrivals[i])
                items = int(rng.integers(1, cap + 1))
                admitted.append(q.admit((rows(items),), now=now))
                i += 1
            else:
                break
            step = q.poll(now)
            while step.fire:  # batches finish at once: the slot is free, the policy decides
                assert step.rejected == []
                for batch in step.fire:
                    reasons[batch.reason] += 1
                    for r, _, _ in batch.parts:
                        assert batch.start_s <= r.arrival_s + max_wait, (r.arrival_s, batch)
                        fired[r.id] = batch.start_s
                    run(q, batch, now)
                step = q.poll(now)
            assert step.rejected == []
            assert step.wake_s is None or step.wake_s > now
            wake = step.wake_s
        assert sorted(fired) == [r.id for r in admitted]
    # The scenarios exercised holding (adaptive), the deadline (timeout) and firing at once.
    assert reasons["adaptive"] > 0
    assert reasons["timeout"] > 0
    assert reasons["idle"] > 0


# -- splitting large requests --------------------------------------------------------


def test_a_request_bigger_than_the_cap_is_split_and_rejoined_in_order():
    q = make_queue(strategy="greedy", max_batch_size=4)
    x = rows(10)
    r = q.admit((x,), now=0.0)
    sizes = []
    outcomes = []
    now = 0.0
    while not q.idle:
        fired = q.poll(now).fire
        assert len(fired) == 1
        sizes.append(fired[0].items)
        now += MS
        outcomes += run(q, fired[0], now)
    assert sizes == [4, 4, 2]
    assert len(outcomes) == 1
    np.testing.assert_array_equal(results(outcomes)[r.id], model(x))


def test_split_parts_finishing_out_of_order_are_rejoined_in_order():
    q = make_queue(strategy="greedy", max_batch_size=3, max_concurrent_batches=4)
    x = rows(10)
    r = q.admit((x,), now=0.0)
    fired = q.poll(0.0).fire
    assert [b.items for b in fired] == [3, 3, 3, 1]
    outcomes = []
    for k, batch in enumerate(reversed(fired)):
        outcomes += run(q, batch, 0.001 * (k + 1))
    assert len(outcomes) == 1
    np.testing.assert_array_equal(results(outcomes)[r.id], model(x))


def test_a_split_request_shares_batches_with_its_neighbours():
    q = make_queue(strategy="greedy", max_batch_size=4)
    a, big, b = rows(1, start=0), rows(6, start=100), rows(2, start=900)
    ra, rbig, rb = (q.admit((x,), now=0.0) for x in (a, big, b))
    outcomes = []
    now = 0.0
    while not q.idle:
        (batch,) = q.poll(now).fire
        assert batch.items <= 4
        now += MS
        outcomes += run(q, batch, now)
    got = results(outcomes)
    np.testing.assert_array_equal(got[ra.id], model(a))
    np.testing.assert_array_equal(got[rbig.id], model(big))
    np.testing.assert_array_equal(got[rb.id], model(b))


def test_a_split_request_is_rejoined_along_the_output_axis():
    q = make_queue(Codec("m", batch_dim=(0, 1)), strategy="greedy", max_batch_size=2)
    x = rows(5)
    r = q.admit((x,), now=0.0)
    outcomes = []
    now = 0.0
    while not q.idle:
        (batch,) = q.poll(now).fire
        now += MS
        outcomes += run(q, batch, now, fn=lambda x: x.T)
    np.testing.assert_array_equal(results(outcomes)[r.id], x.T)


# -- slots, queue bound, overload ----------------------------------------------------


def test_max_concurrent_batches_bounds_batches_in_flight():
    q = make_queue(strategy="greedy", max_batch_size=1, max_concurrent_batches=2)
    for _ in range(5):
        q.admit((rows(1),), now=0.0)
    first = q.poll(0.0).fire
    assert len(first) == 2
    assert q.poll(0.001).fire == []
    assert q.snapshot(0.001).in_flight_batches == 2
    run(q, first[0], 0.002)
    assert len(q.poll(0.002).fire) == 1
    assert q.snapshot(0.002).in_flight_batches == 2


def test_max_queue_size_refuses_at_admission():
    q = make_queue(strategy="greedy", max_queue_size=2)
    q.admit((rows(1),), now=0.0)
    q.admit((rows(1),), now=0.0)
    with pytest.raises(QueueFullError) as info:
        q.admit((rows(1),), now=0.0)
    assert info.value.status == 503
    snap = q.snapshot(0.0)
    assert (snap.admitted, snap.refused, snap.queue_requests) == (2, 1, 2)
    q.poll(0.0)  # both leave the queue for a batch: room again
    q.admit((rows(1),), now=0.001)
    assert q.snapshot(0.001).admitted == 3


def test_cancelling_a_refused_request_changes_nothing():
    # A caller can give up after its request was refused (the refusal is still on its way).
    q = make_queue(strategy="greedy", max_queue_size=1)
    q.admit((rows(1),), now=0.0)
    refused = q.new_request((rows(1),))
    with pytest.raises(QueueFullError):
        q.admit(refused, now=0.0)
    assert q.cancel(refused, now=0.0) is False
    snap = q.snapshot(0.0)
    assert (snap.admitted, snap.cancelled, snap.queue_requests, snap.pending) == (1, 0, 1, 1)


def test_overload_reject_rejects_a_request_still_queued_at_its_deadline():
    q = make_queue(strategy="greedy", max_latency_ms=10, on_overload="reject")
    q.admit((rows(1),), now=0.0)
    (running,) = q.poll(0.0).fire
    late = q.admit((rows(1),), now=0.002)
    step = q.poll(0.002)
    assert step.fire == [] and step.rejected == []
    assert step.wake_s == pytest.approx(0.012)
    assert q.poll(0.011).rejected == []
    step = q.poll(step.wake_s)
    assert [r.id for r, _, _ in step.rejected] == [late.id]
    (_, value, err) = step.rejected[0]
    assert value is None
    assert isinstance(err, OverloadError)
    assert err.status == 503
    assert err.waited_ms == pytest.approx(10.0)
    snap = q.snapshot(0.012)
    assert (snap.rejected, snap.queue_requests) == (1, 0)
    run(q, running, 0.013)
    assert q.poll(0.013).fire == []  # the rejected request never runs
    assert q.idle


def test_overload_reject_does_not_fire_late_requests_into_a_freed_slot():
    # The slot frees after the queued requests' deadline (the timer that would have
    # rejected them came late): they could not start in time, so they are rejected.
    q = make_queue(strategy="greedy", max_batch_size=2, max_latency_ms=10, on_overload="reject")
    for _ in range(3):
        q.admit((rows(1),), now=0.0)
    (running,) = q.poll(0.0).fire
    late = q.admit((rows(1),), now=0.008)  # its deadline, 18 ms, is still ahead
    q.complete(running, [rows(1)] * 2, now=0.015)
    q.release(running, now=0.015, ok=True)
    step = q.poll(0.015)
    assert [type(err) for _, _, err in step.rejected] == [OverloadError]
    assert [part_ids(b) for b in step.fire] == [[late.id]]


def test_overload_wait_keeps_the_request_until_a_slot_frees():
    q = make_queue(strategy="fixed", max_batch_size=1, max_latency_ms=10, on_overload="wait")
    q.admit((rows(1),), now=0.0)
    (running,) = q.poll(0.0).fire
    waiting = q.admit((rows(1),), now=0.002)
    step = q.poll(0.050)
    assert step.rejected == [] and step.fire == []
    run(q, running, 0.060)
    fired = q.poll(0.060).fire
    assert [part_ids(b) for b in fired] == [[waiting.id]]


def test_overload_reject_spares_requests_within_their_deadline():
    q = make_queue(strategy="greedy", max_latency_ms=10, on_overload="reject")
    q.admit((rows(1),), now=0.0)
    q.poll(0.0)
    old = q.admit((rows(1),), now=0.001)
    young = q.admit((rows(1),), now=0.008)
    step = q.poll(0.0115)
    assert [r.id for r, _, _ in step.rejected] == [old.id]
    assert step.wake_s == pytest.approx(0.018)
    assert q.snapshot(0.0115).queue_requests == 1
    assert not young.done


# -- live configure ------------------------------------------------------------------


def test_configure_applies_at_the_next_poll_not_to_a_fired_batch():
    q = make_queue(strategy="greedy", max_batch_size=4)
    for _ in range(12):
        q.admit((rows(1),), now=0.0)
    (first,) = q.poll(0.0).fire
    new = q.config.replace(max_batch_size=8)
    q.configure(new)
    assert q.config.max_batch_size == 4  # not yet: no batch boundary passed
    assert first.items == 4  # the fired batch keeps its cap
    assert q.snapshot(0.0).config.max_batch_size == 4
    run(q, first, 0.001)
    (second,) = q.poll(0.001).fire
    assert q.config is new
    assert second.items == 8


def test_configure_can_switch_strategy_for_queued_requests():
    q = make_queue(strategy="fixed", max_batch_size=8, max_latency_ms=100)
    q.admit((rows(1),), now=0.0)
    assert q.poll(0.0).fire == []
    q.configure(q.config.replace(strategy="greedy"))
    assert [b.reason for b in q.poll(0.001).fire] == ["idle"]


# -- grouping by signature -----------------------------------------------------------


def test_requests_of_other_shapes_or_dtypes_never_share_a_batch():
    q = make_queue(strategy="greedy", max_batch_size=32, max_concurrent_batches=4)
    payloads = {
        "a": rows(2),
        "wide": rows(2, width=4),
        "f32": rows(2, dtype=np.float32),
        "d": rows(1, start=50),
    }
    reqs = {name: q.admit((x,), now=0.0) for name, x in payloads.items()}
    fired = q.poll(0.0).fire
    groups = sorted(sorted(part_ids(b)) for b in fired)
    ids = {name: r.id for name, r in reqs.items()}
    assert groups == sorted([sorted([ids["a"], ids["d"]]), [ids["wide"]], [ids["f32"]]])
    got = {}
    for batch in fired:
        got.update(results(run(q, batch, 0.001)))
    for name, x in payloads.items():
        np.testing.assert_array_equal(got[ids[name]], model(x))
        assert got[ids[name]].dtype == x.dtype


def test_each_shape_group_is_served_with_one_slot():
    q = make_queue(strategy="greedy", max_batch_size=32, max_concurrent_batches=1)
    payloads = [rows(1, width=w, start=10 * i) for i, w in enumerate([3, 4, 3, 5, 4])]
    reqs = [q.admit((x,), now=0.0) for x in payloads]
    got = {}
    now = 0.0
    while not q.idle:
        (batch,) = q.poll(now).fire
        assert len({r.args[0].shape[1:] for r, _, _ in batch.parts}) == 1
        now += MS
        got.update(results(run(q, batch, now)))
    for r, x in zip(reqs, payloads, strict=True):
        np.testing.assert_array_equal(got[r.id], model(x))


def test_input_spec_mismatch_fails_alone_at_admission():
    codec = Codec("m", input_spec=TensorSpec("float64", (3,)))
    q = make_queue(codec, strategy="greedy")
    good = [q.admit((rows(1, start=i),), now=0.0) for i in range(2)]
    with pytest.raises(InputError) as info:
        q.admit((rows(2, width=4),), now=0.0)
    assert "float64[2, 4]" in str(info.value)
    assert "float64[N, 3]" in str(info.value)
    good.append(q.admit((rows(1, start=9),), now=0.0))
    assert q.snapshot(0.0).admitted == 3
    (batch,) = q.poll(0.0).fire
    got = results(run(q, batch, 0.001))
    assert sorted(got) == sorted(r.id for r in good)


# -- failures, cancellation, close ---------------------------------------------------


def test_fail_gives_each_request_a_model_error_carrying_the_message():
    q = make_queue(strategy="greedy")
    reqs = [q.admit((rows(1),), now=0.0) for _ in range(3)]
    (batch,) = q.poll(0.0).fire
    boom = ValueError("weights are not loaded")
    outcomes = q.fail(batch, boom, 0.001)
    q.release(batch, 0.001, ok=False)
    assert [r.id for r, _, _ in outcomes] == [r.id for r in reqs]
    errors = [err for _, _, err in outcomes]
    assert all(isinstance(e, ModelError) for e in errors)
    assert all("weights are not loaded" in str(e) and "ValueError" in str(e) for e in errors)
    assert all(e.__cause__ is boom for e in errors)
    assert all(e.status == 500 for e in errors)
    assert len({id(e) for e in errors}) == 3
    snap = q.snapshot(0.001)
    assert (snap.failed, snap.served, snap.pending) == (3, 0, 0)


def test_a_failed_part_fails_the_whole_split_request_once():
    q = make_queue(strategy="greedy", max_batch_size=2, max_concurrent_batches=3)
    r = q.admit((rows(5),), now=0.0)
    first, second, third = q.poll(0.0).fire
    outcomes = q.fail(second, RuntimeError("bad"), 0.001)
    assert [(o[0].id, type(o[2])) for o in outcomes] == [(r.id, ModelError)]
    assert run(q, first, 0.002) == [] and run(q, third, 0.002) == []
    q.release(second, 0.001, ok=False)
    assert q.idle
    snap = q.snapshot(0.002)
    assert (snap.failed, snap.served, snap.pending) == (1, 0, 0)


def test_bisecting_a_failed_batch_fails_only_the_poisoned_request():
    q = make_queue(strategy="greedy", isolate_errors=True)
    reqs = [q.admit((rows(1, start=10 * i),), now=0.0) for i in range(5)]
    poisoned = reqs[3].id
    (batch,) = q.poll(0.0).fire
    outcomes = []

    def isolate(b):
        if poisoned not in part_ids(b):
            outcomes.extend(run_half(b))
        elif len(b.parts) == 1:
            outcomes.extend(q.fail(b, ValueError("NaN in row"), 0.001))
        else:
            for half in b.halves():
                isolate(half)

    def run_half(b):
        out = model(*b.stack(q.codec))
        return q.complete(b, q.codec.split(out, b.counts), 0.001)

    isolate(batch)
    q.release(batch, 0.001, ok=False)
    by_id = {r.id: (value, err) for r, value, err in outcomes}
    assert sorted(by_id) == [r.id for r in reqs]
    assert isinstance(by_id[poisoned][1], ModelError)
    for i, r in enumerate(reqs):
        if r.id != poisoned:
            np.testing.assert_array_equal(by_id[r.id][0], model(rows(1, start=10 * i)))


def test_a_cancelled_queued_request_is_never_run_or_delivered():
    q = make_queue(strategy="greedy")
    keep, drop = q.admit((rows(1),), now=0.0), q.admit((rows(1),), now=0.0)
    assert q.cancel(drop, now=0.0)
    snap = q.snapshot(0.0)
    assert (snap.queue_requests, snap.queue_items, snap.cancelled) == (1, 1, 1)
    (batch,) = q.poll(0.0).fire
    assert part_ids(batch) == [keep.id]
    assert list(results(run(q, batch, 0.001))) == [keep.id]


def test_a_request_cancelled_while_its_batch_runs_gets_no_result():
    q = make_queue(strategy="greedy")
    keep, drop = q.admit((rows(1),), now=0.0), q.admit((rows(1),), now=0.0)
    (batch,) = q.poll(0.0).fire
    assert q.cancel(drop, now=0.0005)
    assert list(results(run(q, batch, 0.001))) == [keep.id]
    snap = q.snapshot(0.001)
    assert (snap.served, snap.cancelled, snap.pending) == (1, 1, 0)


def test_cancelling_a_split_request_withdraws_its_queued_rest():
    q = make_queue(strategy="greedy", max_batch_size=4)
    r = q.admit((rows(10),), now=0.0)
    (batch,) = q.poll(0.0).fire
    assert q.snapshot(0.0).queue_items == 6
    assert q.cancel(r, now=0.0005)
    snap = q.snapshot(0.0005)
    assert (snap.queue_requests, snap.queue_items) == (0, 0)
    assert run(q, batch, 0.001) == []
    assert q.poll(0.001).fire == []
    assert q.idle


def test_cancel_after_the_outcome_returns_false():
    q = make_queue(strategy="greedy")
    r = q.admit((rows(1),), now=0.0)
    (batch,) = q.poll(0.0).fire
    run(q, batch, 0.001)
    assert not q.cancel(r, now=0.002)
    assert q.snapshot(0.002).cancelled == 0
    other = q.admit((rows(1),), now=0.003)
    assert q.cancel(other, now=0.003)
    assert not q.cancel(other, now=0.003)
    assert q.snapshot(0.003).cancelled == 1


def test_close_drains_what_is_queued_with_reason_drain():
    q = make_queue(strategy="fixed", max_batch_size=8, max_latency_ms=1000)
    ids = [q.admit((rows(1),), now=0.0).id for _ in range(3)]
    assert q.poll(0.0).fire == []
    q.close()
    fired = q.poll(0.001).fire
    assert [(b.reason, part_ids(b)) for b in fired] == [("drain", ids)]
    run(q, fired[0], 0.002)
    assert q.idle


def test_admit_after_close_raises_runner_stopped():
    q = BatchQueue("predict", Codec("predict"), BatchingConfig(), runner="scorer")
    q.close()
    with pytest.raises(RunnerStoppedError, match="scorer") as info:
        q.admit((rows(1),), now=0.0)
    assert info.value.status == 503
    snap = q.snapshot(0.0)
    assert (snap.admitted, snap.refused) == (0, 1)


# -- snapshot -------------------------------------------------------------------------


def test_snapshot_reports_queue_batches_and_reasons():
    q = make_queue(strategy="greedy", max_batch_size=4)
    for _ in range(6):
        q.admit((rows(1),), now=0.0)
    (first,) = q.poll(0.0).fire
    snap = q.snapshot(0.0)
    assert (snap.queue_requests, snap.queue_items, snap.in_flight_batches) == (2, 2, 1)
    run(q, first, 0.004)
    (second,) = q.poll(0.004).fire
    run(q, second, 0.006)
    snap = q.snapshot(0.006)
    assert (snap.served, snap.batches, snap.pending) == (6, 2, 0)
    assert snap.batch_size_counts == {2: 1, 4: 1}
    assert snap.fire_reasons == {"full": 1, "idle": 1}
    assert [b.items for b in snap.recent_batches] == [4, 2]
    assert snap.recent_batches[0].duration_s == pytest.approx(0.004)
    assert snap.queue_wait_ms_overall.p99 == pytest.approx(4.0, rel=0.01)


# -- the accounting identity ---------------------------------------------------------

SIGNATURES = [((3,), np.float64), ((3,), np.float64), ((3,), np.float32), ((2,), np.int64)]


def random_config(rng):
    return BatchingConfig(
        enabled=bool(rng.random() < 0.9),
        strategy=str(rng.choice(STRATEGIES)),
        max_batch_size=int(rng.integers(1, 17)),
        max_latency_ms=float(rng.uniform(0, 5)),
        on_overload=str(rng.choice(["reject", "wait"])),
        max_queue_size=int(rng.integers(5, 80)),
        max_concurrent_batches=int(rng.integers(1, 4)),
        isolate_errors=bool(rng.random() < 0.5),
    )


class Tally:
    """The test's own ledger: what each admitted request received, independent of the queue."""

    def __init__(self):
        self.requests = {}
        self.expected = {}
        self.poisoned = set()
        self.outcomes = defaultdict(list)
        self.refused = 0

    def record(self, outcomes):
        for r, value, err in outcomes:
            assert r.id in self.requests
            if err is None:
                assert r.id not in self.poisoned
                np.testing.assert_array_equal(value, self.expected[r.id])
                assert value.dtype == self.expected[r.id].dtype
                self.outcomes[r.id].append("served")
            elif isinstance(err, OverloadError):
                self.outcomes[r.id].append("rejected")
            elif isinstance(err, ModelError):
                self.outcomes[r.id].append("failed")
            else:
                raise AssertionError(f"unexpected error {err!r}")

    def kinds(self):
        return Counter(kind for kinds in self.outcomes.values() for kind in kinds)

    def pending(self):
        return sum(1 for rid in self.requests if not self.outcomes[rid])

    def check(self, q, now):
        snap = q.snapshot(now)
        kinds = self.kinds()
        assert snap.admitted == len(self.requests)
        assert snap.refused == self.refused
        assert snap.served == kinds["served"]
        assert snap.rejected == kinds["rejected"]
        assert snap.failed == kinds["failed"]
        assert snap.cancelled == kinds["cancelled"]
        assert snap.pending == self.pending()
        assert snap.admitted == (
            snap.served + snap.rejected + snap.failed + snap.cancelled + self.pending()
        )
        queued = [r for r in self.requests.values() if not r.done and r.offset < r.items]
        assert snap.queue_requests == len(queued)
        assert snap.queue_items == sum(r.items - r.offset for r in queued)
        return snap


class RandomDriver:
    """Drives a queue with random events on virtual time, checking each step's batches."""

    def __init__(self, rng):
        self.rng = rng
        self.q = BatchQueue("m", Codec("m"), random_config(rng))
        self.ledger = Tally()
        self.running = []
        self.clock = SimClock()  # virtual time: it only moves forward, when the test says so
        self.closed = False

    def finish(self, batch):
        q, ledger, now = self.q, self.ledger, self.clock.now()
        poisoned = any(r.id in ledger.poisoned for r, _, _ in batch.parts)
        isolate = q.config.isolate_errors

        def attempt(b):
            if not any(r.id in ledger.poisoned for r, _, _ in b.parts):
                out = model(*b.stack(q.codec))
                ledger.record(q.complete(b, q.codec.split(out, b.counts), now))
            elif isolate and len(b.parts) > 1:
                for half in b.halves():
                    attempt(half)
            else:
                ledger.record(q.fail(b, RuntimeError("poisoned input"), now))

        attempt(batch)
        q.release(batch, now, ok=not poisoned)

    def step(self, at):
        s = self.q.poll(at)
        for batch in s.fire:
            self.check_fired(batch)
            self.running.append(batch)
        if s.fire:
            assert len(self.running) <= self.q.config.max_concurrent_batches
        self.ledger.record(s.rejected)
        return s.wake_s

    def check_fired(self, batch):
        cfg = self.q.config
        assert batch.items <= cfg.max_batch_size
        if cfg.effective_strategy == "off":
            assert len(batch.parts) == 1
        if self.closed:
            assert batch.reason == "drain"
        signatures = {(r.args[0].dtype, r.args[0].shape[1:]) for r, _, _ in batch.parts}
        assert len(signatures) == 1
        for r, _, _ in batch.parts:
            assert not self.ledger.outcomes[r.id], "a request with an outcome was fired"

    def arrive(self, event):
        rng, ledger = self.rng, self.ledger
        items = int(rng.integers(1, 5)) if rng.random() < 0.85 else int(rng.integers(5, 40))
        trailing, dtype = SIGNATURES[int(rng.integers(len(SIGNATURES)))]
        if rng.random() < 0.02:
            items = 0  # refused at admission: never admitted
        x = (np.arange(items * trailing[0]).reshape(items, *trailing) + event).astype(dtype)
        try:
            r = self.q.admit((x,), self.clock.now())
        except (QueueFullError, OverloadError):  # full, or predicted to start too late
            ledger.refused += 1
        except InputError:
            assert items == 0
        else:
            ledger.requests[r.id] = r
            ledger.expected[r.id] = model(x)
            if rng.random() < 0.03:
                ledger.poisoned.add(r.id)

    def cancel_one(self):
        ledger = self.ledger
        r = ledger.requests[int(self.rng.integers(len(ledger.requests)))]
        had_outcome = bool(ledger.outcomes[r.id])
        if self.q.cancel(r, self.clock.now()):
            assert not had_outcome
            ledger.outcomes[r.id].append("cancelled")
        else:
            assert had_outcome

    def event(self, event):
        """One random event, then the polls a driver would make after it."""
        rng, clock = self.rng, self.clock
        u = rng.random()
        if u < 0.42:
            self.arrive(event)
        elif u < 0.52 and self.ledger.requests:
            self.cancel_one()
        elif u < 0.78 and self.running:
            self.finish(self.running.pop(int(rng.integers(len(self.running)))))
        elif u < 0.80:
            self.q.configure(random_config(rng))
        else:
            clock.advance(float(rng.exponential(2 * MS)))
        wake = self.step(clock.now())
        if wake is not None and rng.random() < 0.3:
            clock.advance_to(max(clock.now(), wake))  # the driver's timer fires
            self.step(clock.now())

    def drain(self):
        """Close the queue and run until every admitted request has its outcome."""
        self.q.close()
        self.closed = True
        with pytest.raises(RunnerStoppedError):
            self.q.admit((rows(1),), self.clock.now())
        self.ledger.refused += 1
        for _ in range(100_000):
            if self.q.idle and not self.running:
                break
            while self.running:
                self.finish(self.running.pop(0))
            self.clock.advance(MS)
            self.step(self.clock.now())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_admitted_request_gets_exactly_one_outcome(seed):
    run = RandomDriver(np.random.default_rng(seed))
    ledger = run.ledger
    for event in range(6000):
        run.event(event)
        if event % 250 == 0:
            ledger.check(run.q, run.clock.now())
    run.drain()
    snap = ledger.check(run.q, run.clock.now())
    assert snap.pending == 0
    assert snap.queue_requests == snap.in_flight_batches == 0
    for rid in ledger.requests:
        assert len(ledger.outcomes[rid]) == 1, (rid, ledger.outcomes[rid])
    kinds = ledger.kinds()
    # The run exercised every outcome, so the identity above was not vacuous.
    assert min(kinds[k] for k in ("served", "rejected", "failed", "cancelled")) > 0, kinds
    assert ledger.refused > 1
    assert sum(kinds.values()) == len(ledger.requests) > 1000


# -- bulk admission and quiet items ---------------------------------------------------


def test_admit_many_queues_copies_in_order_and_refuses_past_the_queue_cap():
    q = make_bulk_queue(strategy="greedy", max_batch_size=8, max_queue_size=3)
    proto = q.new_request((rows(2),))
    assert q.admit_many(proto, [0.0, 0.1, 0.2, 0.3, 0.4], ["a", "b", "c", "d", "e"]) == 3
    batch = q.poll(0.4).fire[0]
    assert [r.handle for r, _, _ in batch.parts] == ["a", "b", "c"]
    assert [r.arrival_s for r, _, _ in batch.parts] == [0.0, 0.1, 0.2]
    assert [r.id for r, _, _ in batch.parts] == [0, 1, 2]
    assert batch.items == 6
    assert q.snapshot(0.4).refused == 2
    q.close()
    assert q.admit_many(proto, [0.5], ["f"]) == 0


def test_fixed_hold_says_how_many_items_may_join_before_it_fires_full():
    q = make_bulk_queue(strategy="fixed", max_batch_size=8, max_latency_ms=10)
    proto = q.new_request((rows(3),))
    q.admit_many(proto, [0.0], [0])
    step = q.poll(0.0)
    assert step.fire == [] and q.quiet_items == 4  # 3 queued: up to 7 still holds
    q.admit_many(q.new_request((rows(4),)), [0.001], [1])
    step = q.poll(0.001)
    assert step.fire == [] and q.quiet_items == 0
    q.admit((rows(1),), now=0.002)
    assert [b.reason for b in q.poll(0.002).fire] == ["full"]


def test_quiet_items_when_every_slot_is_busy_or_a_slot_is_free():
    q = make_bulk_queue(
        strategy="greedy", max_batch_size=4, max_latency_ms=10, on_overload="reject"
    )
    q.admit((rows(1),), now=0.0)
    step = q.poll(0.0)
    # Busy and empty: arrivals only queue, and the first one's deadline becomes the wake.
    assert len(step.fire) == 1 and q.quiet_items is None
    assert q.arrival_wake_s == 0.01 and step.wake_s is None
    running = step.fire[0]
    q.admit((rows(1),), now=0.001)
    step = q.poll(0.001)
    assert q.quiet_items is None and step.wake_s == 0.001 + 0.01
    assert q.arrival_wake_s is None  # the head waits for its deadline: already the wake
    run(q, running, 0.002)
    step = q.poll(0.002)
    assert len(step.fire) == 1 and (q.quiet_items, q.arrival_wake_s) == (None, 0.01)
    two = make_bulk_queue(strategy="greedy", max_concurrent_batches=2)
    two.admit((rows(1),), now=0.0)
    step = two.poll(0.0)  # a slot is still free: the next arrival fires at once
    assert len(step.fire) == 1 and (two.quiet_items, two.arrival_wake_s) == (0, None)
    adaptive = make_bulk_queue(strategy="adaptive")
    adaptive.poll(0.0)
    assert adaptive.quiet_items == 0
    waiting = make_bulk_queue(strategy="greedy", on_overload="wait")
    waiting.admit((rows(1),), now=0.0)
    waiting.poll(0.0)
    assert waiting.quiet_items is None  # no slot, no expiry: arrivals only queue


# -- the latency target's margin, and overload predicted at admission ----------------------


def warm(q, n=8, now=0.0, items=4, cost_s=0.002):
    """Run ``n`` batches through ``q`` so that its cost model is fitted; returns the time."""
    for _ in range(n):
        q.admit((rows(items),), now=now)
        for batch in q.poll(now).fire:
            now += cost_s + 0.0001 * batch.items
            q.complete(batch, q.codec.split(rows(batch.items), batch.counts), now)
            q.release(batch, now, ok=True)
            q.answered(batch, now)
    return now


def test_a_batch_whose_oldest_request_missed_the_target_lowers_the_planning_budget():
    q = make_queue(strategy="adaptive", latency_slo_ms=10, max_batch_size=8)
    assert q.snapshot(0.0).latency_budget_ms == pytest.approx(10.0)  # the target, at first
    q.admit((rows(1),), now=0.0)
    (batch,) = q.poll(0.0).fire
    q.release(batch, 0.002, ok=True)
    q.answered(batch, now=0.013)  # answered 13 ms after the request came: a miss
    assert q.snapshot(0.013).latency_budget_ms == pytest.approx(10.0 - 0.5 * (1 - 0.005))
    q.configure(q.config.replace(latency_slo_ms=20))
    q.poll(0.02)
    assert q.snapshot(0.02).latency_budget_ms == pytest.approx(20.0)  # learnt again, anew


def test_reject_refuses_at_admission_what_cannot_start_within_the_cap():
    q = make_queue(strategy="greedy", max_batch_size=4, max_latency_ms=5, on_overload="reject")
    now = warm(q)
    q.admit((rows(4),), now=now)
    assert len(q.poll(now).fire) == 1  # due to run 2.4 ms; the slot is busy from here
    for _ in range(8):  # two full batches queued: the next would start in ~7 ms
        q.admit((rows(1),), now=now)
    with pytest.raises(OverloadError, match="would wait about") as refused:
        q.admit((rows(1),), now=now)
    assert refused.value.predicted_wait_s > 0.005 and refused.value.retry_after_s > 0.005
    assert q.snapshot(now).refused == 1
    with_wait = make_queue(strategy="greedy", max_batch_size=4, max_latency_ms=5)
    now = warm(with_wait)
    with_wait.admit((rows(4),), now=now)
    with_wait.poll(now)
    for _ in range(20):
        with_wait.admit((rows(1),), now=now)  # 'wait' (the default) queues them all


def test_reject_never_serves_a_request_past_its_cap_after_a_late_poll():
    # The slot frees at 8 ms, but the owner's next poll comes at 50 ms (a stalled loop):
    # the request that came at 1 ms is past its 20 ms cap by then, so it is rejected.
    q = make_queue(strategy="greedy", max_batch_size=4, max_latency_ms=20, on_overload="reject")
    q.admit((rows(1),), now=0.0)
    (a,) = q.poll(0.0).fire
    late = q.admit((rows(1),), now=0.001)
    q.complete(a, [rows(1)], now=0.008)
    q.release(a, now=0.008, ok=True)
    step = q.poll(0.050)
    assert step.fire == [] and [r for r, _, _ in step.rejected] == [late]
    # A holding strategy's deadline timer a little late still fires the batch.
    f = make_queue(strategy="fixed", max_batch_size=4, max_latency_ms=20, on_overload="reject")
    f.admit((rows(1),), now=0.0)
    assert f.poll(0.0).fire == []
    assert [b.reason for b in f.poll(0.0205).fire] == ["timeout"]


def test_reject_sheds_a_queued_request_once_the_running_batch_makes_it_late():
    q = make_queue(strategy="greedy", max_batch_size=4, max_latency_ms=5, on_overload="reject")
    now = warm(q)  # a batch of 4 is fitted at 2.4 ms
    q.admit((rows(4),), now=now)
    (running,) = q.poll(now).fire  # due 2.4 ms from now
    queued = [q.admit((rows(1),), now=now) for _ in range(8)]  # to start at 2.4 and 4.8 ms
    step = q.poll(now)
    # Should the running batch still run 2.6 ms from now, the second four start too late.
    assert step.rejected == [] and step.wake_s == pytest.approx(now + 2.6 * MS)
    assert q.poll(now + 2.5 * MS).rejected == []
    step = q.poll(now + 2.7 * MS)
    assert [r for r, _, _ in step.rejected] == queued[4:]  # 2.3 ms before their deadline
    for _, _, err in step.rejected:
        assert isinstance(err, OverloadError) and err.waited_s == pytest.approx(2.7 * MS)
        assert "waited 2.7 ms and is predicted to find no free batch slot in time" in str(err)
    assert step.wake_s == pytest.approx(now + 5 * MS)  # the first four's deadline
    run(q, running, now + 3 * MS)
    (batch,) = q.poll(now + 3 * MS).fire
    assert part_ids(batch) == [r.id for r in queued[:4]]
    assert q.snapshot(now + 3 * MS).rejected == 4


def test_reject_judges_a_burst_larger_than_the_free_slot_starts():
    # A loop that stalled catches up: a burst arrives while the slot is free. Four start
    # now, two more batches by 4.8 ms; the rest could not start within 5 ms, and used to
    # be queued all the same (to be shed at their deadlines, a long queue to walk).
    q = make_queue(strategy="greedy", max_batch_size=4, max_latency_ms=5, on_overload="reject")
    now = warm(q)  # a batch of 4 is fitted at 2.4 ms
    refused = q.admit_all([q.new_request((rows(1),), i) for i in range(20)], now)
    assert [r.handle for r, _, _ in refused] == list(range(12, 20))
    for _, _, err in refused:
        assert isinstance(err, OverloadError) and err.predicted_wait_s == pytest.approx(7.2 * MS)
    assert q.snapshot(now).queue_requests == 12
    assert [b.items for b in q.poll(now).fire] == [4]


def test_reject_refuses_at_admission_within_how_late_batches_ran():
    def admitted_behind_a_running_batch(late_ms):
        q = make_queue(strategy="greedy", max_batch_size=4, max_latency_ms=6, on_overload="reject")
        now = warm(q)  # a batch of 4 is fitted at 2.4 ms
        for _ in range(6):  # then batches end late_ms past their due time
            q.admit((rows(4),), now=now)
            (batch,) = q.poll(now).fire
            now = batch.due_s + late_ms * MS
            run(q, batch, now)
        q.admit((rows(4),), now=now)
        q.poll(now)  # every slot busy from here: each arrival is judged
        for admitted in range(20):
            try:
                q.admit((rows(1),), now=now)
            except OverloadError:
                return admitted
        raise AssertionError("never refused")

    # On time: two full batches fit within the 6 ms cap (starts predicted at 2.4 and 4.8 ms).
    assert admitted_behind_a_running_batch(0.0) == 8
    # Batches 1 ms late: a start one full batch further on keeps two of them (2 ms) in hand,
    # so 4.8 ms is refused; the next batch (2.4 ms, 1 ms in hand) still fills.
    assert admitted_behind_a_running_batch(1.0) == 4


# -- admission of one loop iteration's arrivals together (admit_all) -----------------


def admitted_state(q, now):
    """What the queue holds and decides: batches (handles, arrivals, ids) and counters."""
    fired = q.poll(now).fire
    batches = [
        ([r.handle for r, _, _ in b.parts], [r.arrival_s for r, _, _ in b.parts], b.items)
        for b in fired
    ]
    ids = [r.id for b in fired for r, _, _ in b.parts]
    snap = q.snapshot(now)
    return batches, ids, (snap.admitted, snap.refused, snap.queue_requests, snap.queue_items)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_admit_all_queues_exactly_what_admitting_one_by_one_queues(strategy):
    clock = SimClock()
    calls = [(rows(n % 3 + 1, width=3 if n % 4 else 5),) for n in range(40)]
    one = make_queue(strategy=strategy, max_batch_size=8, max_latency_ms=10)
    bulk = make_queue(strategy=strategy, max_batch_size=8, max_latency_ms=10)
    for i, args in enumerate(calls):
        one.admit(one.new_request(args, i), clock.now())
    assert bulk.admit_all([bulk.new_request(args, i) for i, args in enumerate(calls)], 0.0) == []
    clock.advance(0.02)  # past the cap: every strategy fires all it holds, group by group
    for _ in range(len(calls)):  # "off" fires one request per poll
        assert admitted_state(one, clock.now()) == admitted_state(bulk, clock.now())
        for q in (one, bulk):
            for b in list(q._slots.running.values()):
                q.complete(b, q.codec.split(b.stack(q.codec)[0], b.counts), clock.now())
                q.release(b, clock.now(), ok=True)
        if one.idle:
            break
    assert one.idle and bulk.idle


def test_admit_all_refuses_past_the_queue_cap_in_order_each_with_its_error():
    q = make_queue(strategy="greedy", max_batch_size=8, max_queue_size=3)
    requests = [q.new_request((rows(1),), name) for name in "abcde"]
    refused = q.admit_all(requests, 0.5)
    assert [r.handle for r, _, _ in refused] == ["d", "e"]
    assert all(isinstance(err, QueueFullError) and value is None for _, value, err in refused)
    assert all(r.done for r, _, _ in refused)  # refused: never admitted, no other outcome
    (batch,) = q.poll(0.5).fire
    assert [r.handle for r, _, _ in batch.parts] == ["a", "b", "c"]
    assert [r.arrival_s for r, _, _ in batch.parts] == [0.5, 0.5, 0.5]
    snap = q.snapshot(0.5)
    assert (snap.admitted, snap.refused) == (3, 2)


def test_admit_all_on_a_closed_queue_refuses_them_all():
    q = BatchQueue("predict", Codec("predict"), BatchingConfig(), runner="scorer")
    q.close()
    refused = q.admit_all([q.new_request((rows(1),), i) for i in range(3)], 0.0)
    assert [type(err) for _, _, err in refused] == [RunnerStoppedError] * 3
    assert q.idle and q.snapshot(0.0).refused == 3


def test_admit_all_in_reject_mode_judges_each_arrival_as_admit_does():
    q = make_queue(strategy="greedy", max_batch_size=4, max_latency_ms=5, on_overload="reject")
    now = warm(q)
    q.admit((rows(4),), now=now)
    assert len(q.poll(now).fire) == 1  # every slot busy: each arrival is predicted
    refused = q.admit_all([q.new_request((rows(1),), i) for i in range(10)], now)
    # Eight fit in two full batches behind the running one; the ninth would start too late.
    assert [r.handle for r, _, _ in refused] == [8, 9]
    assert all(isinstance(err, OverloadError) for _, _, err in refused)
    assert q.snapshot(now).queue_requests == 8
