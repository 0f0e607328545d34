"""The sans-IO batch queue: admission, the queue, decisions, and result splitting.

It never reads a clock, sleeps, locks or touches a loop: its owner (the asyncio driver
or the simulator) feeds it events with their time — :meth:`BatchQueue.admit`,
:meth:`BatchQueue.cancel`, :meth:`BatchQueue.complete`, :meth:`BatchQueue.fail`,
:meth:`BatchQueue.release` — and after each one calls :meth:`BatchQueue.poll`, which says
which batches to fire now, which requests to reject, and when to wake up next.

Every admitted request leaves with exactly one outcome: a result (``complete``), a
typed error (``fail``, or rejected by ``poll``), or cancelled (``cancel``).
Not thread-safe: one owner calls everything.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Hashable, Sequence
from itertools import repeat
from typing import Any

from labserve.base.errors import (
    LabServeError,
    ModelError,
    ModelStuckError,
    OverloadError,
    QueueFullError,
    RequestTimeoutError,
    RunnerStoppedError,
)
from labserve.base.vocabulary import Reason
from labserve.batching.containers import Codec
from labserve.batching.estimators import CostFit, CostModel, RateEstimator
from labserve.batching.policy import Decision, Fire, HeadView, decide
from labserve.batching.requests import DONE, QUEUED, Batch, Outcome, Request, Step
from labserve.config.batching import BatchingConfig
from labserve.metrics.recorder import Recorder
from labserve.metrics.snapshot import BatchRecord, CostFitView, Snapshot

__all__ = ["BatchQueue", "BulkQueue"]

_NO_FIT = CostFit(0.0, 0.0, 0)
# The latency target's margin: each batch whose oldest request missed the target lowers
# the planning budget by this fraction of the target (a hit raises it by a small share of
# that), never below _MIN_BUDGET of the target.
_STEP = 0.05
# A request this far past its wait cap when a free slot is finally polled is rejected (reject
# mode), not served late; within it, a deadline timer that fired late still fires the batch.
_OVERDUE_GRACE_S = 0.002
_MIN_BUDGET = 0.2
_NO_RATES = (0.0, 0.0)


class _Group:
    """Queued requests that can be stacked together (one signature)."""

    __slots__ = ("hold_start", "hold_until", "items", "key", "queue", "requests")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.queue: deque[Request] = deque()
        self.items = 0
        self.requests = 0
        self.hold_start: float | None = None
        self.hold_until: float | None = None

    def head(self) -> Request | None:
        q = self.queue
        while q and q[0].state == DONE:
            q.popleft()
        return q[0] if q else None


class BatchQueue:
    """The batching state machine of one runner method.

    >>> from labserve.batching.containers import Codec
    >>> import numpy as np
    >>> q = BatchQueue("m", Codec("m"), BatchingConfig(strategy="greedy"))
    >>> r = q.admit((np.ones((2, 3)),), now=0.0)
    >>> [b.items for b in q.poll(now=0.0).fire]
    [2]
    """

    def __init__(
        self,
        name: str,
        codec: Codec,
        config: BatchingConfig,
        *,
        runner: str = "",
        recorder: Recorder | None = None,
        cost_model: CostModel | None = None,
        rate: RateEstimator | None = None,
    ) -> None:
        self.name = name
        self.runner = runner
        self.codec = codec
        self._config = config
        self._pending_config: BatchingConfig | None = None
        self._target_s = -1.0  # the latency target planned for (0: none)
        self._budget_s = 0.0  # what a request's latency is planned to: the target, less a margin
        self._use(config)
        self.recorder = recorder if recorder is not None else Recorder()
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.rate = rate if rate is not None else RateEstimator()
        self._groups: dict[Hashable, _Group] = {}
        self._queued_requests = 0
        self._queued_items = 0
        self._in_flight = 0
        self._next_request = 0
        self._next_batch = 0
        self._new_requests = 0
        self._new_items = 0
        self._new_at = 0.0
        self._expired: list[Outcome] = []  # rejected when a slot freed, reported by poll
        self._closed = False
        self._running: dict[int, Batch] = {}  # fired and not yet released, by id
        self._stuck: set[int] = set()  # running batches past the request timeout
        # The earliest time a request can time out or a batch become stuck (inf: none can).
        self._timeout_check_s = math.inf

    # -- config -----------------------------------------------------------------------

    @property
    def config(self) -> BatchingConfig:
        """The config in force (a change waiting for the next batch boundary is not yet)."""
        return self._config

    @property
    def latest_config(self) -> BatchingConfig:
        """The config last asked for: the one waiting for the next batch boundary, if any."""
        pending = self._pending_config
        return self._config if pending is None else pending

    def _use(self, config: BatchingConfig) -> None:
        """Put ``config`` in force (and the target it plans for, learnt anew when it changed)."""
        self._config = config
        self._one_request = config.effective_strategy == "off"
        target = config.latency_slo_s if config.effective_strategy == "adaptive" else 0.0
        if target != self._target_s:
            self._target_s = target
            self._budget_s = target  # a new target: plan to it, and learn the margin again
        # A miss (the oldest request of an answered batch over the target) moves the budget
        # down by _STEP of the target; a hit moves it up so that, in balance, misses are
        # half as frequent as the percentile allows.
        self._miss_allowed = (100.0 - config.slo_percentile) / 200.0

    def configure(self, config: BatchingConfig) -> None:
        """Swap in ``config`` at the next batch boundary (the next :meth:`poll`)."""
        self._pending_config = config

    # -- events -----------------------------------------------------------------------

    def new_request(self, args: tuple[Any, ...], handle: Any = None) -> Request:
        """Check a call's arguments and wrap them; raises InputError. Pure: any thread."""
        args, items, key = self.codec.admit(args)
        request = Request(-1, args, items, key, handle)
        if self.codec.padding is not None:
            request.lengths = self.codec.lengths(args)
        return request

    def admit(self, request: Request | tuple[Any, ...], now: float) -> Request:
        """Queue a request (or raw call arguments); raises if it is refused.

        Raises InputError (bad arguments), QueueFullError, RunnerStoppedError. A refused
        request is never admitted and gets no other outcome.
        """
        if not isinstance(request, Request):
            request = self.new_request(request)
        if self._closed:
            self.recorder.refused(now)
            request.state = DONE  # refused: never admitted, so a later cancel is a no-op
            raise RunnerStoppedError(self.runner or self.name)
        cfg = self._config
        if self._queued_requests >= cfg.max_queue_size:
            self.recorder.refused(now)
            request.state = DONE
            raise QueueFullError(self.label, cfg.max_queue_size, cfg.retry_after_s)
        if self._stuck and len(self._stuck) >= cfg.max_concurrent_batches:
            self.recorder.refused(now)
            request.state = DONE
            oldest = min(b.start_s for b in self._running.values() if b.id in self._stuck)
            raise ModelStuckError(self.label, len(self._stuck), now - oldest)
        if self._timeout_check_s == math.inf and cfg.request_timeout_s:
            self._timeout_check_s = now + cfg.request_timeout_s
        if self._in_flight >= cfg.max_concurrent_batches and cfg.on_overload == "reject":
            self._refuse_if_late(request, now)
        self._enqueue((request,), now)
        return request

    def admit_all(self, requests: list[Request], now: float) -> list[Outcome]:
        """Admit ``requests`` (from :meth:`new_request`) at ``now``, in order; return the refused.

        The same as :meth:`admit` once per request with no :meth:`poll` in between (the
        arrivals of one event-loop iteration), but cheaper: when every one of them is
        surely admitted (the queue open, room for all, no stuck batch, no prediction to
        make at admission) the checks are made once. Each refused request comes back with
        its error (QueueFullError, RunnerStoppedError, ModelStuckError, OverloadError), is
        never admitted and gets no other outcome.
        """
        cfg = self._config
        n = len(requests)
        if (
            self._closed
            or self._stuck
            or self._queued_requests + n > cfg.max_queue_size
            or (cfg.on_overload == "reject" and self._in_flight >= cfg.max_concurrent_batches)
        ):
            refused: list[Outcome] = []
            for request in requests:
                try:
                    self.admit(request, now)
                except LabServeError as exc:
                    refused.append((request, None, exc))
            return refused
        if self._timeout_check_s == math.inf and cfg.request_timeout_s:
            self._timeout_check_s = now + cfg.request_timeout_s
        self._enqueue(requests, now)
        return []

    def _enqueue(self, requests: Sequence[Request], now: float) -> None:
        """File admitted requests, in order, into their shape groups as arrived at ``now``."""
        groups = self._groups
        rid = self._next_request
        items = 0
        key: Hashable = None
        group: _Group | None = None
        for request in requests:
            request.id = rid
            rid += 1
            request.arrival_s = now
            if group is None or request.key != key:
                key = request.key
                group = groups.get(key)
                if group is None:
                    group = groups[key] = _Group(key)
            group.queue.append(request)
            group.items += request.items
            group.requests += 1
            items += request.items
        n = len(requests)
        self._next_request = rid
        self._queued_items += items
        self._queued_requests += n
        # Arrivals are counted in bulk at the next poll or snapshot: they come in bursts
        # (one loop iteration's worth).
        self._new_requests += n
        self._new_items += items
        self._new_at = now

    def _adaptive_admission(self) -> bool:
        """True when admission predicts overload (reject mode, every slot busy, a fit)."""
        cfg = self._config
        return (
            cfg.on_overload == "reject"
            and self._in_flight >= cfg.max_concurrent_batches
            and self.cost_model.fit.ready
        )

    def _refuse_if_late(self, request: Request, now: float) -> None:
        """Refuse at once a request the cost model predicts cannot start in time (reject mode).

        Every slot is busy: it starts when the first running batch is due to end, plus one
        full batch's time (per slot) for each full batch of items queued ahead of it.
        "In time" is within ``max_latency_ms`` and, with a latency target, early enough to
        meet it. A wrong prediction errs both ways; the deadline check stays the backstop.
        """
        fit = self.cost_model.fit
        if not fit.ready:
            return
        cfg = self._config
        cap, slots = cfg.max_batch_size, cfg.max_concurrent_batches
        full_s = fit.predict_s(cap) / slots
        free_at = min(b.due_s for b in self._running.values())
        queued = self._queued_items
        wait = max(free_at - now, 0.0) + (queued // cap) * full_s
        limit = cfg.max_latency_s
        if self._target_s > 0.0:
            limit = min(limit, self._target_s - fit.predict_s(min(cap, queued % cap + 1)))
        if wait <= limit:
            return
        self.recorder.refused(now)
        request.state = DONE
        drain = max(free_at - now, 0.0) + (queued / cap) * full_s
        raise OverloadError(self.label, 0.0, limit, max(drain, 0.001), predicted_wait_s=wait)

    def _count_arrivals(self) -> None:
        if self._new_requests:
            self.rate.observe(self._new_at, self._new_items, self._new_requests)
            self.recorder.arrived(self._new_at, self._new_requests)
            self._new_requests = self._new_items = 0

    def cancel(self, request: Request, now: float) -> bool:
        """The caller gave up: withdraw the request. False if it already has its outcome.

        A request whose batch is running is counted cancelled and its result dropped.
        """
        if request.state == DONE:
            return False
        self._settle(request)
        self.recorder.cancelled(now)
        return True

    def abort(self, exc: LabServeError, now: float) -> list[Outcome]:
        """Fail every request without an outcome, queued or in a running batch, with ``exc``.

        For when stopping cannot wait any longer: a running batch keeps its slot until it
        returns, and its late results are dropped. Returns the outcomes to deliver.
        """
        done: list[Outcome] = []
        running = [r for b in self._running.values() for r, _, _ in b.parts]
        for r in (*(r for g in self._groups.values() for r in g.queue), *running):
            if r.state != DONE:
                self._settle(r)
                done.append((r, None, copy.copy(exc)))
        self._expired, expired = [], self._expired
        self.recorder.failed(now, len(done))
        return done + expired

    def close(self) -> None:
        """Refuse new requests; :meth:`poll` fires what is queued with reason ``drain``."""
        self._closed = True

    @property
    def idle(self) -> bool:
        """True when nothing is queued or running."""
        return self._queued_requests == 0 and self._in_flight == 0

    def poll(self, now: float, due_s: float | None = None) -> Step:
        """Decide: the batches to fire now, the requests to reject, and when to wake next.

        ``due_s`` is the ``wake_s`` an owner's timer was set for, when that timer is why it
        polls: a hold ending by then ends now. An event loop's timer wakes in the tick of its
        due time, not at it (asyncio up to a millisecond after, uvloop up to one before), so a
        driver arms it a tick early and says for when: the batch then fires in time, and its
        requests' recorded waits, taken at ``now``, stay within ``max_latency_ms``.
        """
        if self._new_requests:
            self._count_arrivals()
        if self._pending_config is not None:
            self._use(self._pending_config)
            self._pending_config = None
        step = Step()
        if self._expired:
            step.rejected, self._expired = self._expired, []
        if now >= self._timeout_check_s:
            self._check_timeouts(now, step)
        if self._timeout_check_s != math.inf:
            # Firing batches cannot bring it earlier: a batch becomes stuck no sooner than
            # its requests time out.
            step.timeout_check_s = self._timeout_check_s
        slots = self._config.max_concurrent_batches
        if self._queued_requests and self._config.on_overload == "reject":
            self._reject_overdue(now, step)
        if self._queued_requests:
            held: list[_Group] = []
            held_items: int | None = None  # the hold stands while its group has fewer items
            cfg = self._config
            # Only a latency target reads the fit and the rates: without one, no refit.
            planning = self._target_s > 0.0
            fit = self.cost_model.fit if planning else _NO_FIT
            while self._queued_requests and self._in_flight < slots:
                group = self._oldest_group(held)
                if group is None:
                    break
                head = group.head()
                assert head is not None  # a group with queued requests has a live head
                decision: Decision
                if self._closed:
                    decision = Fire("drain")
                else:
                    view = HeadView(
                        group.items,
                        group.requests,
                        head.arrival_s,
                        group.hold_start,
                        group.hold_until,
                    )
                    rates = self.rate.rates(now) if planning else _NO_RATES
                    at = now if due_s is None or due_s < now else due_s
                    decision = decide(view, at, cfg, fit, rates, self._budget_s)
                if isinstance(decision, Fire):
                    step.fire.append(self._form(group, decision.reason, now))
                    continue
                if group.hold_start is None:
                    group.hold_start = now
                group.hold_until = decision.until_s
                step.wake_s = _earliest(step.wake_s, decision.until_s)
                held.append(group)
                held_items = decision.until_items
            if self._in_flight < slots:
                if len(held) == 1 and len(self._groups) == 1 and held_items is not None:
                    step.quiet_items = max(held_items - 1 - held[0].items, 0)
                return step
        elif self._in_flight < slots:
            return step  # a free slot and an empty queue: the next arrival is decided on
        # No slot: arrivals only queue, and change nothing unless one would bring the
        # earliest deadline (when no queued request is still waiting to start).
        if self._config.on_overload != "reject":
            step.quiet_items = None
        elif self._adaptive_admission():
            step.quiet_items = 0  # each arrival is judged at admission: admit them one by one
        elif self._queued_requests and self._expire(now, step):
            step.quiet_items = None
        elif not self._closed:
            # Nothing waits for a deadline: the next arrival's own deadline is the wake.
            step.quiet_items = None
            step.arrival_wake_s = self._config.max_latency_s
        return step

    def complete(self, batch: Batch, outputs: Sequence[Any], now: float) -> list[Outcome]:
        """A batch (or half of one) ran: ``outputs`` holds each part's slice, in order."""
        done: list[Outcome] = []
        append = done.append
        for (r, a, b), out in zip(batch.parts, outputs, strict=True):
            r.parts_pending -= 1
            if r.state:  # == DONE
                continue  # cancelled or failed meanwhile
            if not a and b == r.items:
                result = out
            else:
                if r.pieces is None:
                    r.pieces = []
                r.pieces.append((a, out))
                if r.offset < r.items or r.parts_pending:
                    continue
                r.pieces.sort(key=lambda p: p[0])
                result = self.codec.join([p[1] for p in r.pieces])
                r.pieces = None
            r.state = DONE
            append((r, result, None))
        if self.recorder.discards:
            return done
        arrivals = [r.arrival_s for r, _, _ in done]
        starts = [now if r.start_s is None else r.start_s for r, _, _ in done]
        self.recorder.served(now, arrivals, starts)
        return done

    def fail(self, batch: Batch, exc: BaseException, now: float) -> list[Outcome]:
        """A batch (or half of one) failed: each of its requests gets its own typed error."""
        done: list[Outcome] = []
        n_requests = len(batch.parts)
        for r, _a, _b in batch.parts:
            r.parts_pending -= 1
            if r.state == DONE:
                continue
            self._settle(r)
            # Each caller gets its own exception object: they may raise it on different threads.
            err: BaseException
            if isinstance(exc, LabServeError):
                err = copy.copy(exc)
                err.__cause__ = exc.__cause__
            else:
                err = ModelError(self.label, exc, n_requests)
                err.__cause__ = exc
            done.append((r, None, err))
        self.recorder.failed(now, len(done))
        return done

    def answered(self, batch: Batch, now: float) -> None:
        """A batch's callers were handed their results at ``now`` (after the hand-off).

        With a latency target, the latency of its oldest request (the longest in the
        batch) tunes the margin the adaptive strategy keeps: it learns there what it cannot
        predict (hand-off, cost jitter, arrivals beyond the expected). Cheap: once a batch.
        """
        target = self._target_s
        if target <= 0.0 or not batch.parts:
            return
        missed = now - batch.parts[0][0].arrival_s > target
        step = _STEP * target * (self._miss_allowed - missed)
        self._budget_s = min(max(self._budget_s + step, _MIN_BUDGET * target), target)

    def release(self, batch: Batch, now: float, *, ok: bool) -> None:
        """The batch's slot is free again; record it (and its duration if it ran cleanly).

        If every slot was busy, requests whose deadline passed meanwhile could not start in
        time: with ``on_overload="reject"`` they are rejected now (the next :meth:`poll`
        reports them) rather than fired late into the freed slot.
        """
        cfg = self._config
        all_busy = self._in_flight >= cfg.max_concurrent_batches
        self._in_flight -= 1
        del self._running[batch.id]
        if self._stuck:
            self._stuck.discard(batch.id)
        reject = cfg.on_overload == "reject"
        if all_busy and self._queued_requests and reject and self._may_expire(now):
            expired = Step()
            self._expire(now, expired)
            self._expired += expired.rejected
        duration = now - batch.start_s
        if ok:
            self.cost_model.observe(batch.items, duration, batch.tokens)
        if self.recorder.discards:
            return
        tokens = batch.tokens
        self.recorder.batch(
            BatchRecord(
                batch.start_s,
                duration,
                batch.items,
                len(batch.parts),
                batch.reason,
                tokens,
                tokens - batch.true_tokens if tokens else 0,
            )
        )

    # -- internals --------------------------------------------------------------------

    @property
    def label(self) -> str:
        """``runner.method``, as errors and warnings name it."""
        return f"{self.runner}.{self.name}" if self.runner else self.name

    def _oldest_group(self, skip: list[_Group]) -> _Group | None:
        if len(self._groups) == 1 and not skip:
            group = next(iter(self._groups.values()))
            if group.head() is not None:
                return group
        best: _Group | None = None
        best_t = 0.0
        for key in list(self._groups):
            group = self._groups[key]
            head = group.head()
            if head is None:
                del self._groups[key]
                continue
            if group in skip:
                continue
            if best is None or head.arrival_s < best_t:
                best, best_t = group, head.arrival_s
        return best

    def _form(self, group: _Group, reason: Reason, now: float) -> Batch:
        cap = self._config.max_batch_size
        one_request = self._one_request
        parts: list[tuple[Request, int, int]] = []
        append = parts.append
        total = taken = 0  # items, and requests taken whole (off the queue)
        q = group.queue
        if group.items <= cap and not one_request:
            # Everything queued fits: the same batch as the loop below would form, and
            # every request leaves the queue whole (its rest, if it was split before).
            for r in q:
                if r.state == DONE:
                    continue
                start = r.offset
                r.offset = stop = r.items
                r.parts_pending += 1
                if r.start_s is None:
                    r.start_s = now
                append((r, start, stop))
            q.clear()
            total, taken = group.items, len(parts)
        while q:
            r = q[0]
            if r.state == DONE:
                q.popleft()
                continue
            start = r.offset
            take = r.items - start
            room = cap - total
            if take > room:
                if total:
                    break
                take = room
            r.offset = start + take
            r.parts_pending += 1
            if r.start_s is None:
                r.start_s = now
            append((r, start, start + take))
            total += take
            if r.offset < r.items:
                break  # a request larger than the cap: the rest waits at the head
            q.popleft()
            taken += 1
            if one_request or total >= cap:
                break
        group.items -= total
        group.requests -= taken
        self._queued_items -= total
        self._queued_requests -= taken
        group.hold_start = group.hold_until = None
        self._in_flight += 1
        self._next_batch += 1
        batch = self._running[self._next_batch] = Batch(self._next_batch, reason, now, parts, total)
        if self.codec.padding is not None:
            _pad_batch(self.codec, batch)
        if self._config.on_overload == "reject":  # admission predicts with it
            batch.due_s = now + self.cost_model.fit.predict_s(total)
        return batch

    def _settle(self, r: Request) -> None:
        """Mark ``r`` done and take whatever of it is still queued off the counts."""
        if r.offset < r.items:
            rest = r.items - r.offset
            group = self._groups.get(r.key)
            if group is not None:
                group.items -= rest
                group.requests -= 1
            self._queued_items -= rest
            self._queued_requests -= 1
            r.offset = r.items
        r.state = DONE
        r.pieces = None

    def _may_expire(self, now: float) -> bool:
        """False if :meth:`_expire` would surely reject nothing now.

        So it is with one group whose head has not started and is before its deadline:
        the queue is FIFO, so nothing behind the head expired either.
        """
        if len(self._groups) != 1:
            return True
        head = next(iter(self._groups.values())).head()
        return not (
            head is not None
            and head.start_s is None
            and head.arrival_s + self._config.max_latency_s > now
        )

    def _reject_overdue(self, now: float, step: Step) -> None:
        """With a slot free but a poll that came late, reject what is already past its cap.

        A slot freed in time, but the owner polled too late (a stalled loop): firing the
        overdue requests now would serve them after a wait over ``max_latency_ms``, which
        ``on_overload="reject"`` promises not to do. A holding strategy's own deadline
        timer firing a little late is not a stall: _OVERDUE_GRACE_S is allowed.
        """
        cfg = self._config
        limit = now - cfg.max_latency_s - _OVERDUE_GRACE_S
        for group in self._groups.values():
            head = group.head()
            if head is None or head.start_s is not None or head.arrival_s > limit:
                continue  # the usual case, at the cost of one comparison
            for r in group.queue:
                if r.state == DONE or r.start_s is not None:
                    continue
                if r.arrival_s > limit:
                    break  # FIFO: everything behind it is in time too
                self._settle(r)
                self.recorder.rejected(now)
                cfg = self._config
                err = OverloadError(
                    self.label, now - r.arrival_s, cfg.max_latency_s, cfg.retry_after_s
                )
                step.rejected.append((r, None, err))

    def _expire(self, now: float, step: Step) -> bool:
        """Reject queued requests whose deadline passed while no batch slot was free.

        Returns True if a queued request is still waiting to start (its deadline ahead).
        """
        cfg = self._config
        max_wait = cfg.max_latency_s
        waiting = False
        for group in list(self._groups.values()):
            head = group.head()  # drops finished requests off the front
            if head is None:
                continue
            if head.start_s is None and head.arrival_s + max_wait > now:
                step.wake_s = _earliest(step.wake_s, head.arrival_s + max_wait)
                waiting = True
                continue  # the usual case: nothing expired (FIFO, so nothing behind it either)
            for r in group.queue:
                if r.state == DONE or r.start_s is not None:
                    continue  # done, or part of it already runs: it has started
                deadline = r.arrival_s + max_wait
                if deadline > now:
                    step.wake_s = _earliest(step.wake_s, deadline)
                    waiting = True
                    break
                self._settle(r)
                self.recorder.rejected(now)
                err = OverloadError(self.label, now - r.arrival_s, max_wait, cfg.retry_after_s)
                step.rejected.append((r, None, err))
        return waiting

    def _check_timeouts(self, now: float, step: Step) -> None:
        """Time out requests past ``request_timeout_ms``; mark batches running past it stuck.

        Runs only when :attr:`_timeout_check_s` (the earliest such moment) has come, and
        sets the next one.
        """
        timeout = self._config.request_timeout_s
        if not timeout:
            self._timeout_check_s = math.inf
            return
        earliest = math.inf
        for group in self._groups.values():
            for r in group.queue:  # FIFO: the first still in time ends the scan
                if r.state == DONE:
                    continue
                if r.arrival_s + timeout > now:
                    earliest = min(earliest, r.arrival_s + timeout)
                    break
                self._time_out(r, now, timeout, step)
        for batch in self._running.values():
            for r, _, _ in batch.parts:
                if r.state == DONE:
                    continue
                if r.arrival_s + timeout > now:
                    earliest = min(earliest, r.arrival_s + timeout)
                else:
                    self._time_out(r, now, timeout, step)
            if batch.start_s + timeout <= now:
                self._stuck.add(batch.id)
            else:
                earliest = min(earliest, batch.start_s + timeout)
        self._timeout_check_s = earliest

    def _time_out(self, r: Request, now: float, timeout: float, step: Step) -> None:
        self._settle(r)
        self.recorder.timed_out(now)
        step.timed_out.append(
            (r, None, RequestTimeoutError(self.label, now - r.arrival_s, timeout))
        )

    def snapshot(self, now: float) -> Snapshot:
        """An immutable picture of this method now (O(window) work)."""
        self._count_arrivals()
        fit = self.cost_model.fit
        items, _ = self.cost_model.observations()
        low, high = (int(items.min()), int(items.max())) if len(items) else (0, 0)
        return self.recorder.snapshot(
            now,
            runner=self.runner,
            method=self.name,
            config=self._config,
            queue_requests=self._queued_requests,
            queue_items=self._queued_items,
            in_flight_batches=self._in_flight,
            stuck_batches=len(self._stuck),
            budget_s=self._budget_s,
            cost_fit=CostFitView(
                fit.a_s * 1000.0,
                fit.b_s * 1000.0,
                fit.samples,
                low,
                high,
                fit.c_s * 1000.0,
                fit.width,
            ),
        )


class BulkQueue(BatchQueue):
    """A BatchQueue that can also admit many arrivals at once: the simulator's fast path.

    The real driver polls after every arrival; the simulator knows every arrival ahead
    and, between decisions, admits those that the last poll's :attr:`Step.quiet_items`
    says cannot change anything, in one call. Same queue, same strategies, the same
    decisions: only the bookkeeping is done in bulk.
    """

    def admit_many(self, request: Request, times: Sequence[float], handles: Sequence[Any]) -> int:
        """Queue a copy of ``request`` (from :meth:`new_request`) at each of ``times``.

        The same as :meth:`admit` once per time with no :meth:`poll` in between, except
        that each arrival is counted in the rate estimate at its own time rather than at
        the last one. ``times`` must not decrease; ``handles`` holds each copy's handle.
        Returns how many were admitted: the first ones, since nothing leaves the queue
        without a poll. The rest were refused (QueueFullError or RunnerStoppedError) and
        get no other outcome. Admitting no more than the last poll's
        :attr:`Step.quiet_items` allow leaves every batching decision as it would be with
        a poll after each arrival (with ``on_overload="reject"`` and every slot busy that
        is one at a time: each arrival is then judged at admission, as :meth:`admit`
        does). The rate estimate keeps ``times`` until it is next read: do not change the
        sequence afterwards.
        """
        n = len(times)
        cfg = self._config
        stuck = self._stuck and len(self._stuck) >= cfg.max_concurrent_batches
        room = 0 if self._closed or stuck else max(cfg.max_queue_size - self._queued_requests, 0)
        k = n if n <= room else room
        if k < n:
            for t in times[k:]:
                self.recorder.refused(t)
            if k == 0:
                return 0
            times, handles = times[:k], handles[:k]
        if self._timeout_check_s == math.inf and cfg.request_timeout_s:
            self._timeout_check_s = times[0] + cfg.request_timeout_s
        if k == 1 and self._adaptive_admission():
            try:
                self._refuse_if_late(request, times[0])
            except OverloadError:
                request.state = QUEUED  # the prototype is copied again for the next arrival
                return 0
        args, items, key = request.args, request.items, request.key
        rid = self._next_request
        self._next_request = rid + k
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(key)
        if k == 1:
            group.queue.append(Request(rid, args, items, key, handles[0], times[0]))
        else:
            group.queue.extend(
                map(
                    Request,
                    range(rid, rid + k),
                    repeat(args),
                    repeat(items),
                    repeat(key),
                    handles,
                    times,
                )
            )
        group.items += k * items
        group.requests += k
        self._queued_items += k * items
        self._queued_requests += k
        if self._new_requests:
            self._count_arrivals()  # earlier single admissions first, in order
        self.rate.observe_each(times, items)
        self.recorder.arrived(times[-1], k)
        return k


def _pad_batch(codec: Codec, batch: Batch) -> None:
    """Set a padded batch's width and true tokens from its parts' rows."""
    batch.width, batch.true_tokens = codec.measure([(r.lengths, a, b) for r, a, b in batch.parts])


def _earliest(a: float | None, b: float) -> float:
    return b if a is None or b < a else a
