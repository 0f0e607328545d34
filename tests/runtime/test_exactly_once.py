"""Exactly once, under every strategy: the real driver stepped on virtual time (Hypothesis).

A state machine drives MethodDriver, the code a notebook runs, through a VirtualHost:
admissions by both doors, clock advances, model calls that return, raise, return the wrong
count or hang, live config changes (strategy, caps, target, on_overload), withdrawals and a
stop. After every step it checks the promises against a small reference of what each caller
was given:

- every admitted request gets exactly one outcome, and the queue's counts agree with what the
  callers saw; a result is the caller's own payload (the model is the identity);
- no caller waits longer than ``request_timeout_ms`` after admission plus one timer tick,
  however long the model hangs;
- under ``fixed`` with a free batch slot, no request waits in the queue past
  ``max_latency_ms``;
- a stop (drain, then abort) answers everyone.

``test_the_suite_finds_the_timer_bug`` puts the old bug back (re-arming the wake timer
disarmed the timeout check, which still believed itself armed) and expects the suite to fail.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import labserve
from labserve.batching.containers import Codec
from labserve.batching.queue import BatchQueue
from labserve.batching.requests import Request
from labserve.config.batching import BatchingConfig
from labserve.metrics.snapshot import Snapshot
from labserve.runtime.driver import MethodDriver
from labserve.runtime.scheduling import MIN_TIMER_S, Timer
from labserve.runtime.virtual import VirtualHost

EPS = 1e-9
TICK = MIN_TIMER_S
# (strategy, latency_slo_ms): every strategy, and adaptive planning to a target.
STRATEGIES = [("off", 0.0), ("fixed", 0.0), ("greedy", 0.0), ("adaptive", 0.0), ("adaptive", 6.0)]
EXPECTED_ERRORS = (
    labserve.ModelError,
    labserve.BatchSizeMismatchError,
    labserve.RequestTimeoutError,
    labserve.OverloadError,
    labserve.QueueFullError,
    labserve.ModelStuckError,
    labserve.RunnerStoppedError,
)


@dataclass
class Caller:
    request: Request
    future: concurrent.futures.Future[Any]
    payload: np.ndarray
    admitted_s: float
    outcome_s: float | None = None
    withdrawn: bool = False
    notes: list[str] = field(default_factory=list)


class DriverMachine(RuleBasedStateMachine):
    wake_timer: type[Timer] = Timer  # the tests of the test swap in old bugs
    strategies: tuple[tuple[str, float], ...] = tuple(STRATEGIES)  # to start with
    timer_kinds: tuple[str, ...] = ("exact", "late", "early")  # asyncio's and uvloop's
    timeouts_ms: tuple[float, ...] = (0.0, 9.0, 30.0)
    hang_at_start: tuple[bool, ...] = (False, True)

    @initialize(
        strategy_pick=st.integers(0, 4),
        max_batch_size=st.integers(1, 4),
        max_latency_ms=st.sampled_from([0.0, 2.0, 5.0, 12.0]),
        timeout_pick=st.integers(0, 2),
        slots=st.integers(1, 2),
        on_overload=st.sampled_from(["wait", "reject"]),
        isolate=st.booleans(),
        max_queue_size=st.sampled_from([4, 10_000]),
        timers_pick=st.integers(0, 2),
        hangs_pick=st.integers(0, 1),
    )
    def setup(
        self,
        strategy_pick: int,
        max_batch_size: int,
        max_latency_ms: float,
        timeout_pick: int,
        slots: int,
        on_overload: str,
        isolate: bool,
        max_queue_size: int,
        timers_pick: int,
        hangs_pick: int,
    ) -> None:
        strategy = self.strategies[strategy_pick % len(self.strategies)]
        timers = self.timer_kinds[timers_pick % len(self.timer_kinds)]
        timeout_ms = self.timeouts_ms[timeout_pick % len(self.timeouts_ms)]
        self.sched = VirtualHost(timers=timers)  # type: ignore[arg-type]
        config = BatchingConfig(
            strategy=strategy[0],  # type: ignore[arg-type]
            latency_slo_ms=strategy[1],
            max_batch_size=max_batch_size,
            max_latency_ms=max_latency_ms,
            request_timeout_ms=timeout_ms,
            max_concurrent_batches=slots,
            on_overload=on_overload,  # type: ignore[arg-type]
            isolate_errors=isolate,
            max_queue_size=max_queue_size,
        )
        self.timeout_s = timeout_ms / 1000.0
        self.queue = BatchQueue("predict", Codec("predict"), config, runner="m")
        # While the model hangs, its calls park until released; else they return at once.
        self.hangs = self.hang_at_start[hangs_pick % len(self.hang_at_start)]
        self.driver = MethodDriver(self.queue, self.model, is_async=False, scheduler=self.sched)
        if self.wake_timer is not Timer:  # the test of the test
            wake = self.wake_timer(self.sched, self.driver._on_wake, lead_s=TICK)
            wake.partner = self.driver._check  # type: ignore[attr-defined]
            self.driver._wake = wake
        self.callers: list[Caller] = []
        self.next_value = 0
        self.stopped = False
        self.aborted = False
        self.config_epoch = 0  # a config change starts a new one
        self.watched: list[tuple[Caller, float]] = []  # (waiting, its deadline), slot free
        self.watched_epoch = -1

    def model(self, x: np.ndarray) -> Any:
        """The identity; while ``hangs``, each call waits for the test to release it."""
        return self.sched.park(x) if self.hangs else x

    # -- the world's moves ------------------------------------------------------------------

    @rule(hangs=st.booleans())
    def model_changes_pace(self, hangs: bool) -> None:
        self.hangs = hangs

    def _caller(self, items: int) -> Caller:
        payload = np.arange(self.next_value, self.next_value + items)
        self.next_value += items
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        request = self.queue.new_request((payload,), future)
        caller = Caller(request, future, payload, self.sched.now())

        def done(_: Any, caller: Caller = caller) -> None:
            caller.outcome_s = self.sched.now()

        future.add_done_callback(done)
        self.callers.append(caller)
        return caller

    @rule(items=st.integers(1, 5), threadsafe=st.booleans())
    def admit(self, items: int, threadsafe: bool) -> None:
        caller = self._caller(items)
        if threadsafe:
            self.driver.submit_threadsafe(caller.request)
        else:
            self.driver.submit(caller.request)
        self.sched.settle()

    @rule(dt_ms=st.sampled_from([0.3, 1.0, 2.5, 7.0, 20.0, 60.0]))
    def advance(self, dt_ms: float) -> None:
        self.sched.advance(dt_ms / 1000.0)

    def _parked(self, pick: int) -> Any:
        return self.sched.parked[pick % len(self.sched.parked)]

    @precondition(lambda self: self.sched.parked)
    @rule(pick=st.integers(0, 3))
    def model_returns(self, pick: int) -> None:
        call = self._parked(pick)
        self.sched.release(call, value=call.args[0])

    @precondition(lambda self: self.sched.parked)
    @rule(pick=st.integers(0, 3))
    def model_raises(self, pick: int) -> None:
        self.sched.release(self._parked(pick), error=ValueError("poisoned"))

    @precondition(lambda self: self.sched.parked)
    @rule(pick=st.integers(0, 3))
    def model_returns_one_item_short(self, pick: int) -> None:
        call = self._parked(pick)
        self.sched.release(call, value=call.args[0][:-1])

    @rule(
        strategy=st.sampled_from(STRATEGIES),
        max_batch_size=st.integers(1, 4),
        max_latency_ms=st.sampled_from([0.0, 2.0, 5.0, 12.0]),
        on_overload=st.sampled_from(["wait", "reject"]),
    )
    def configure(
        self,
        strategy: tuple[str, float],
        max_batch_size: int,
        max_latency_ms: float,
        on_overload: str,
    ) -> None:
        new = self.queue.latest_config.replace(
            strategy=strategy[0],
            latency_slo_ms=strategy[1],
            max_batch_size=max_batch_size,
            max_latency_ms=max_latency_ms,
            on_overload=on_overload,
        )
        self.driver.configure(new)
        self.config_epoch += 1
        self.sched.settle()

    @precondition(lambda self: any(not c.future.done() for c in self.callers))
    @rule(pick=st.integers(0, 50), threadsafe=st.booleans())
    def caller_gives_up(self, pick: int, threadsafe: bool) -> None:
        waiting = [c for c in self.callers if not c.future.done()]
        caller = waiting[pick % len(waiting)]
        caller.future.cancel()  # as run() and async_run() do, before withdrawing
        caller.withdrawn = True
        if threadsafe:
            self.driver.cancel_threadsafe(caller.request)
        else:
            self.driver.cancel(caller.request)
        self.sched.settle()

    @precondition(lambda self: not self.stopped)
    @rule()
    def stop(self) -> None:
        self.driver.begin_close()
        self.sched.settle()
        self.stopped = True

    @precondition(lambda self: self.stopped and not self.aborted)
    @rule()
    def stop_gives_up_waiting(self) -> None:
        self.driver.abort()
        self.driver.end()
        self.sched.settle()
        self.aborted = True

    # -- the promises -------------------------------------------------------------------------

    @invariant()
    def the_promises_hold(self) -> None:
        assert self.sched.errors == []
        snap = self.queue.snapshot(self.sched.now())  # one snapshot a step: they cost ~1 ms
        self.each_outcome_is_the_callers_own_and_counted_once(snap)
        self.nobody_waits_past_the_request_timeout()
        self.fixed_fires_by_the_deadline_when_a_slot_is_free(snap)
        if self.aborted:  # a stop that gave up waiting answered everyone
            assert all(c.future.done() for c in self.callers)

    def each_outcome_is_the_callers_own_and_counted_once(self, snap: Snapshot) -> None:
        done = 0
        for c in self.callers:
            if not c.future.done():
                continue
            done += 1
            if c.future.cancelled():
                assert c.withdrawn
                continue
            error = c.future.exception()
            if error is None:
                np.testing.assert_array_equal(c.future.result(), c.payload)
            else:
                assert isinstance(error, EXPECTED_ERRORS), repr(error)
                if isinstance(error, labserve.RequestTimeoutError):
                    assert c.outcome_s is not None
                    assert c.outcome_s - c.admitted_s >= self.timeout_s - EPS
        counted = snap.served + snap.rejected + snap.failed + snap.cancelled
        counted += snap.timeout + snap.refused
        assert counted == done
        assert snap.admitted + snap.refused == len(self.callers)

    def nobody_waits_past_the_request_timeout(self) -> None:
        if not self.timeout_s:
            return
        limit = self.timeout_s + TICK + EPS
        now = self.sched.now()
        for c in self.callers:
            end = c.outcome_s if c.outcome_s is not None else now
            assert end - c.admitted_s <= limit, (
                f"request {c.request.id} admitted at {c.admitted_s * 1e3:.3f} ms still waited "
                f"at {end * 1e3:.3f} ms, past request_timeout_ms={self.timeout_s * 1e3:g}"
            )

    def fixed_fires_by_the_deadline_when_a_slot_is_free(self, snap: Snapshot) -> None:
        """Who waited with a slot free at the last step must have started by its deadline.

        FIFO, one group: whatever batch takes the free slot first takes the oldest request,
        so with a slot free at the last step and no config change since, each request then
        waiting starts by its own deadline (and, still waiting now, is not past it).
        """
        now = self.sched.now()
        if self.config_epoch == self.watched_epoch:
            for c, deadline in self.watched:
                start = c.request.start_s
                if start is None and c.future.done():
                    continue  # timed out, rejected or withdrawn first
                waited = (start if start is not None else now) - c.admitted_s
                assert (start if start is not None else now) <= deadline + EPS, (
                    f"request {c.request.id} waited {waited * 1e3:.3f} ms in the queue with a "
                    f"slot free, past max_latency_ms={(deadline - c.admitted_s) * 1e3:g}"
                )
        self.watched, self.watched_epoch = [], self.config_epoch
        config = snap.config
        if config.effective_strategy != "fixed" or self.stopped:
            return
        if snap.in_flight_batches >= config.max_concurrent_batches:
            return
        self.watched = [
            (c, c.admitted_s + config.max_latency_s)
            for c in self.callers
            if not c.future.done() and c.request.start_s is None
        ]

    def teardown(self) -> None:
        # Let every hung call return, then everyone must have had exactly one outcome.
        if not hasattr(self, "sched"):
            return
        if not self.stopped:
            self.driver.begin_close()
            self.sched.settle()
        for _ in range(1000):
            if not self.sched.parked:
                break
            call = self.sched.parked[0]
            self.sched.release(call, value=call.args[0])
        self.sched.advance(1.0)
        assert not self.sched.parked
        assert all(c.future.done() for c in self.callers)
        self.each_outcome_is_the_callers_own_and_counted_once(self.queue.snapshot(1e9))
        assert self.sched.errors == []
        self.sched.shutdown()


SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# The tests of the test: the first failure is enough (no shrinking: it would take minutes),
# and a fixed seed, so that they find the same failing run every time or fail loudly.
FIND_SETTINGS = settings(SETTINGS, max_examples=2000, phases=[Phase.generate], derandomize=True)


@pytest.mark.parametrize("start", STRATEGIES, ids=lambda s: f"{s[0]}-target{s[1]:g}")
def test_exactly_once_under_every_strategy(start: tuple[str, float]) -> None:
    machine = type("Machine", (DriverMachine,), {"strategies": (start,)})
    run_state_machine_as_test(machine, settings=SETTINGS)


class _OldBug(Timer):
    """The wake timer as it was: re-arming it cancelled the timeout check's handle too,
    leaving the check's due time set, so the driver believed the check still armed."""

    partner: Timer

    def set(self, due_s: float | None, now: float) -> None:
        if due_s != self.due_s and self.partner._handle is not None:
            self.partner._handle.cancel()
            self.partner._handle = None
        super().set(due_s, now)


class BuggyDriverMachine(DriverMachine):
    wake_timer = _OldBug
    strategies = (("fixed", 0.0),)  # the only strategy that arms the wake while a model hangs
    timeouts_ms = (9.0, 30.0)
    hang_at_start = (True,)


def test_the_suite_finds_the_timer_bug() -> None:
    with pytest.raises(AssertionError, match="past request_timeout_ms"):
        run_state_machine_as_test(
            BuggyDriverMachine,
            settings=FIND_SETTINGS,
        )


class _NoLead(Timer):
    """The wake timer armed for the deadline itself: the loop wakes up to a tick after it."""

    def __init__(self, scheduler: Any, callback: Any, *, lead_s: float = 0.0) -> None:
        super().__init__(scheduler, callback, lead_s=0.0)


class LateHoldMachine(DriverMachine):
    wake_timer = _NoLead
    strategies = (("fixed", 0.0),)
    timer_kinds = ("late",)  # asyncio's


def test_the_suite_finds_a_hold_that_ends_a_tick_late() -> None:
    with pytest.raises(AssertionError, match="with a slot free, past max_latency_ms"):
        run_state_machine_as_test(LateHoldMachine, settings=FIND_SETTINGS)
