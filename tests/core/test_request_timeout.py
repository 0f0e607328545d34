"""request_timeout_ms on the virtual clock: exactly one answer past it, stuck batches, readiness."""

from __future__ import annotations

import numpy as np
import pytest

from labserve.base.errors import ModelStuckError, RequestTimeoutError, RunnerStoppedError
from labserve.batching.containers import Codec
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig


def make_queue(**settings):
    settings.setdefault("strategy", "greedy")
    return BatchQueue("m", Codec("m"), BatchingConfig(**settings))


def row():
    return (np.ones((1, 3)),)


def test_a_queued_request_past_its_timeout_gets_one_timeout_error():
    q = make_queue(request_timeout_ms=100, on_overload="wait", max_batch_size=1)
    first = q.admit(row(), now=0.0)
    (batch,) = q.poll(0.0).fire  # the only slot is busy from here
    late = q.admit(row(), now=0.010)
    step = q.poll(0.010)
    assert step.fire == [] and step.timeout_check_s == pytest.approx(0.100)
    step = q.poll(0.100)  # the first request's deadline (in the running batch)
    assert [r for r, _, _ in step.timed_out] == [first]
    step = q.poll(0.110)
    assert [r for r, _, e in step.timed_out] == [late]
    err = step.timed_out[0][2]
    assert isinstance(err, RequestTimeoutError) and err.status == 504
    assert err.elapsed_s == pytest.approx(0.100)
    # The batch returns late: its result is dropped, no second outcome for anyone.
    assert q.complete(batch, [np.ones((1, 3))], now=0.120) == []
    q.release(batch, 0.120, ok=True)
    assert q.poll(0.2).timed_out == []
    snap = q.snapshot(0.2)
    assert (snap.timeout, snap.served, snap.pending) == (2, 0, 0)


def test_a_batch_running_past_the_timeout_is_stuck_and_the_method_refuses_until_it_returns():
    q = make_queue(request_timeout_ms=50)
    q.admit(row(), now=0.0)
    (batch,) = q.poll(0.0).fire
    assert q.snapshot(0.01).ready
    step = q.poll(0.050)
    assert len(step.timed_out) == 1
    snap = q.snapshot(0.050)
    assert snap.stuck_batches == 1 and not snap.ready
    with pytest.raises(ModelStuckError, match="not ready"):
        q.admit(row(), now=0.060)
    q.release(batch, 0.2, ok=False)
    assert q.snapshot(0.2).ready
    q.admit(row(), now=0.2)
    assert len(q.poll(0.2).fire) == 1
    assert q.snapshot(0.2).refused == 1


def test_no_timeout_when_it_is_zero():
    q = make_queue(request_timeout_ms=0, on_overload="wait", max_batch_size=1)
    q.admit(row(), now=0.0)
    q.poll(0.0)
    q.admit(row(), now=0.0)
    step = q.poll(1000.0)
    assert step.timed_out == [] and step.timeout_check_s is None
    assert q.snapshot(1000.0).stuck_batches == 0


def test_a_served_request_never_times_out():
    q = make_queue(request_timeout_ms=100)
    q.admit(row(), now=0.0)
    (batch,) = q.poll(0.0).fire
    assert len(q.complete(batch, [np.ones((1, 3))], now=0.01)) == 1
    q.release(batch, 0.01, ok=True)
    assert q.poll(0.5).timed_out == []
    assert q.snapshot(0.5).timeout == 0


def test_abort_answers_requests_in_running_batches_too():
    q = make_queue(max_batch_size=1, on_overload="wait")
    running = q.admit(row(), now=0.0)
    q.poll(0.0)
    queued = q.admit(row(), now=0.0)
    stopped = RunnerStoppedError("r")
    outcomes = q.abort(stopped, now=0.1)
    assert {r.id for r, _, _ in outcomes} == {running.id, queued.id}
    assert all(isinstance(e, RunnerStoppedError) for _, _, e in outcomes)
