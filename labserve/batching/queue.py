"""The sans-IO batch queue: admission, the queue, decisions, and result splitting.

It never reads a clock, sleeps, locks or touches a loop: its owner (the asyncio driver
or the simulator) feeds it events with their time — :meth:`BatchQueue.admit`,
:meth:`BatchQueue.cancel`, :meth:`BatchQueue.complete`, :meth:`BatchQueue.fail`,
:meth:`BatchQueue.release` — and after each one calls :meth:`BatchQueue.poll`, which says
which batches to fire now, which requests to reject, and when to wake up next.

Every admitted request leaves with exactly one outcome: a result (``complete``), a
typed error (``fail``, or rejected by ``poll``), or cancelled (``cancel``).
Not thread-safe: one owner calls everything.

The queue's parts live beside it: shape groups and taking a batch from one
(:mod:`.groups`), deadlines and overload (:mod:`.deadlines`), the strategies
(:mod:`.policy`) and the latency target's budget they plan to (:mod:`.budget`).
"""

from __future__ import annotations

import copy
import math
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
    TokenBudgetError,
)
from labserve.batching import deadlines, ragged
from labserve.batching.budget import LatencyBudget
from labserve.batching.containers import Codec
from labserve.batching.estimators import CostFit, CostModel, RateEstimator
from labserve.batching.groups import Part, ShapeGroup
from labserve.batching.margin import OverloadMargin
from labserve.batching.policy import Decision, Fire, HeadView, decide
from labserve.batching.requests import Batch, Outcome, Request, RequestState, Step
from labserve.config.batching import BatchingConfig
from labserve.metrics.recorder import Recorder
from labserve.metrics.snapshot import BatchRecord, CostFitView, Snapshot

__all__ = ["BatchQueue", "BulkQueue"]

_DONE = RequestState.DONE
_NO_FIT = CostFit(0.0, 0.0, 0)
_NO_RATES = (0.0, 0.0)


class BatchQueue:
    """The batching state machine of one runner method.

    ``recorder`` keeps its traffic for snapshots (None: a new one); ``record=False`` keeps
    none, for an owner whose run is recorded elsewhere (the simulator's RunResult):
    :attr:`recorder` and :meth:`snapshot` are then unavailable.

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
        record: bool = True,
        cost_model: CostModel | None = None,
        rate: RateEstimator | None = None,
    ) -> None:
        self.name = name
        self.runner = runner
        self.label = f"{runner}.{name}" if runner else name
        """``runner.method``, as errors and warnings name it."""
        self.codec = codec
        self._padding = codec.padding  # None: no ragged axis (every padded path is skipped)
        self._config = config
        self._pending_config: BatchingConfig | None = None
        self._budget = LatencyBudget()
        self._margin = OverloadMargin()  # how late admission's predicted starts come true
        self._use(config)
        self._recorder: Recorder | None = None
        if record:
            self._recorder = recorder if recorder is not None else Recorder()
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.rate = rate if rate is not None else RateEstimator()
        self._groups: dict[Hashable, ShapeGroup] = {}
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
        # When queued requests' predicted starts are next checked (reject mode, every slot
        # busy): -inf once a batch fired (the next poll that fires nothing checks), else
        # when a batch running past its due time would make one late (inf: none can).
        self._late_check_s = math.inf

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
        self._budget.use(config)

    def configure(self, config: BatchingConfig) -> None:
        """Swap in ``config`` at the next batch boundary (the next :meth:`poll`)."""
        self._pending_config = config

    # -- admission --------------------------------------------------------------------

    def new_request(self, args: tuple[Any, ...], handle: Any = None) -> Request:
        """Check a call's arguments and wrap them; raises InputError. Pure: any thread."""
        args, items, key = self.codec.admit(args)
        request = Request(-1, args, items, key, handle)
        if self._padding is not None:
            request.lengths = self.codec.lengths(args)
        return request

    def admit(self, request: Request | tuple[Any, ...], now: float) -> Request:
        """Queue a request (or raw call arguments); raises if it is refused.

        Raises InputError (bad arguments), QueueFullError, RunnerStoppedError,
        ModelStuckError, or OverloadError when ``on_overload="reject"``, it cannot start
        in a batch a free slot would start now and the cost model predicts it cannot start
        in time. A refused request is never admitted and gets no other outcome.
        """
        if not isinstance(request, Request):
            request = self.new_request(request)
        if self._padding is not None and self._config.max_batch_tokens:
            self._check_tokens(request)
        refusal: LabServeError | None = None
        room, judged = self._admission()
        if not room:
            refusal = self._refusal(now)
        elif judged or self._past_free_slots(request.items):
            refusal = self._overload_at(now, self._queued_items)
        if refusal is not None:
            self._refuse(now)
            request.state = _DONE  # refused: never admitted, so a later cancel is a no-op
            raise refusal
        self._enqueue((request,), now)
        return request

    def admit_all(self, requests: list[Request], now: float) -> list[Outcome]:
        """Admit ``requests`` (from :meth:`new_request`) at ``now``, in order; return the refused.

        The same as :meth:`admit` once per request with no :meth:`poll` in between (the
        arrivals of one event-loop iteration), but cheaper when there is room for all and
        none is judged at admission: then the checks are made once. Each refused request
        comes back with its error (as :meth:`admit` raises it), is never admitted and gets
        no other outcome.
        """
        room, judged = self._admission()
        budget = self._padding is not None and self._config.max_batch_tokens
        if len(requests) <= room and not judged and not budget:
            # In reject mode, a burst larger than the free slots start now (a loop that
            # stalled, catching up) is judged one by one: it must not queue unbounded.
            if self._config.on_overload != "reject" or not self._past_free_slots(
                sum(r.items for r in requests)
            ):
                self._enqueue(requests, now)
                return []
        refused: list[Outcome] = []
        for request in requests:
            try:
                self.admit(request, now)
            except LabServeError as exc:
                refused.append((request, None, exc))
        return refused

    def _check_tokens(self, request: Request) -> None:
        """Refuse (TokenBudgetError) a request whose longest row alone exceeds the budget."""
        assert self._padding is not None
        budget = self._config.max_batch_tokens
        longest = int(request.lengths.max())
        padded = self._padding.round_width(longest)
        if padded > budget:
            request.state = _DONE
            raise TokenBudgetError(self.label, longest, padded, budget)

    def _admission(self) -> tuple[int, bool]:
        """(room, judged): what admission looks like now, whatever a request holds.

        ``room``: how many more requests may be admitted; 0 when the queue is closed, every
        batch slot is held by a stuck batch, or it is full (:meth:`_refusal` says which).
        ``judged``: each arrival is judged at admission (:meth:`_overload_at`): in
        reject mode while every slot is busy and the cost model has a fit to predict with.
        """
        cfg = self._config
        judged = (
            cfg.on_overload == "reject"
            and self._in_flight >= cfg.max_concurrent_batches
            and self.cost_model.fit.ready
        )
        if self._closed or (self._stuck and len(self._stuck) >= cfg.max_concurrent_batches):
            return 0, judged
        free = cfg.max_queue_size - self._queued_requests
        return (free if free > 0 else 0), judged

    def _past_free_slots(self, items: int) -> bool:
        """True if ``items`` more would not all start in the batches free slots start now.

        Then, in reject mode with a fitted model, each arrival is judged at admission too.
        """
        cfg = self._config
        if cfg.on_overload != "reject" or not self.cost_model.fit.ready:
            return False
        free = cfg.max_concurrent_batches - self._in_flight
        return self._queued_items + items > free * cfg.max_batch_size

    def _refusal(self, now: float) -> LabServeError:
        """Why a request arriving at ``now`` finds no room (:meth:`_admission` says 0)."""
        cfg = self._config
        if self._closed:
            return RunnerStoppedError(self.runner or self.name)
        if self._queued_requests >= cfg.max_queue_size:
            return QueueFullError(self.label, cfg.max_queue_size, cfg.retry_after_s)
        oldest = min(b.start_s for b in self._running.values() if b.id in self._stuck)
        return ModelStuckError(self.label, len(self._stuck), now - oldest)

    def _overload_at(self, now: float, queued_items: int) -> OverloadError | None:
        """The OverloadError for an arrival at ``now`` behind ``queued_items`` (None: in time).

        One predicted in time brings the next check of predicted starts (:meth:`_check_predicted`)
        forward to when a running batch that has not ended would make it late.
        """
        cfg = self._config
        free = cfg.max_concurrent_batches - self._in_flight
        if free > 0:  # the queue starts now, in the free slots' batches
            free_at = now
            queued_items = max(queued_items - (free - 1) * cfg.max_batch_size, 0)
        else:
            free_at = min(b.due_s for b in self._running.values())
        refusal, late_at = deadlines.admission_overload(
            self.label,
            cfg,
            self.cost_model.fit,
            free_at,
            queued_items,
            self._budget.target_s,
            now,
            self._margin,
        )
        if refusal is None and late_at < self._late_check_s:
            self._late_check_s = late_at
        return refusal

    def _refuse(self, now: float) -> None:
        if self._recorder is not None:
            self._recorder.refused(now)

    def _enqueue(self, requests: Sequence[Request], now: float) -> None:
        """File admitted requests, in order, into their shape groups as arrived at ``now``."""
        rid = self._next_request
        items = 0
        key: Hashable = None
        group: ShapeGroup | None = None
        for request in requests:
            request.id = rid
            rid += 1
            request.arrival_s = now
            if self._padding is not None:
                request.key = self._length_key(request)
            if group is None or request.key != key:
                key = request.key
                group = self._group(key)
            group.queue.append(request)
            group.items += request.items
            group.requests += 1
            items += request.items
        n = len(requests)
        self._next_request = rid
        self._queued_items += items
        self._queued_requests += n
        if self._timeout_check_s == math.inf and self._config.request_timeout_s:
            self._timeout_check_s = now + self._config.request_timeout_s
        # Arrivals are counted in bulk at the next poll or snapshot: they come in bursts
        # (one loop iteration's worth).
        self._new_requests += n
        self._new_items += items
        self._new_at = now

    def _length_key(self, request: Request) -> Hashable:
        """A padded request's group: by bucket, by exact length, or one for all lengths."""
        cfg = self._config
        longest = int(request.lengths.max())
        return ragged.length_key(request.key, longest, cfg.length_buckets, cfg.padding)

    def _group(self, key: Hashable) -> ShapeGroup:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = ShapeGroup(key)
        return group

    def _count_arrivals(self) -> None:
        if self._new_requests:
            self.rate.observe(self._new_at, self._new_items, self._new_requests)
            if self._recorder is not None:
                self._recorder.arrived(self._new_at, self._new_requests)
            self._new_requests = self._new_items = 0

    # -- outcomes ---------------------------------------------------------------------

    def cancel(self, request: Request, now: float) -> bool:
        """The caller gave up: withdraw the request. False if it already has its outcome.

        A request whose batch is running is counted cancelled and its result dropped.
        """
        if request.state is _DONE:
            return False
        self._settle(request)
        if self._recorder is not None:
            self._recorder.cancelled(now)
        return True

    def abort(self, exc: LabServeError, now: float) -> list[Outcome]:
        """Fail every request without an outcome, queued or in a running batch, with ``exc``.

        For when stopping cannot wait any longer: a running batch keeps its slot until it
        returns, and its late results are dropped. Returns the outcomes to deliver.
        """
        done: list[Outcome] = []
        running = [r for b in self._running.values() for r, _, _ in b.parts]
        for r in (*(r for g in self._groups.values() for r in g.queue), *running):
            if r.state is not _DONE:
                self._settle(r)
                done.append((r, None, copy.copy(exc)))
        self._expired, expired = [], self._expired
        if self._recorder is not None:
            self._recorder.failed(now, len(done))
        return done + expired

    def close(self) -> None:
        """Refuse new requests; :meth:`poll` fires what is queued with reason ``drain``."""
        self._closed = True

    @property
    def idle(self) -> bool:
        """True when nothing is queued or running."""
        return self._queued_requests == 0 and self._in_flight == 0

    def complete(self, batch: Batch, outputs: Sequence[Any], now: float) -> list[Outcome]:
        """A batch (or half of one) ran: ``outputs`` holds each part's slice, in order."""
        done: list[Outcome] = []
        for (r, a, b), out in zip(batch.parts, outputs, strict=True):
            r.parts_pending -= 1
            if r.state is _DONE:
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
            r.state = _DONE
            done.append((r, result, None))
        if self._recorder is not None:
            arrivals = [r.arrival_s for r, _, _ in done]
            starts = [now if r.start_s is None else r.start_s for r, _, _ in done]
            self._recorder.served(now, arrivals, starts)
        return done

    def fail(self, batch: Batch, exc: BaseException, now: float) -> list[Outcome]:
        """A batch (or half of one) failed: each of its requests gets its own typed error."""
        done: list[Outcome] = []
        n_requests = len(batch.parts)
        for r, _a, _b in batch.parts:
            r.parts_pending -= 1
            if r.state is _DONE:
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
        if self._recorder is not None:
            self._recorder.failed(now, len(done))
        return done

    def answered(self, batch: Batch, now: float) -> None:
        """A batch's callers were handed their results at ``now`` (after the hand-off).

        With a latency target, the latency of its oldest request (the longest in the
        batch) tunes the margin the adaptive strategy keeps (:mod:`.budget`). Cheap: once
        a batch.
        """
        if batch.parts:
            self._budget.answered(batch.parts[0][0].arrival_s, now)

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
        if all_busy and self._queued_requests and cfg.on_overload == "reject":
            self._expire_while_busy(now)
        duration = now - batch.start_s
        if ok:
            if batch.due_s:  # reject mode: how far admission's prediction of its end was off
                self._margin.observe(now - batch.due_s)
            self.cost_model.observe(batch.items, duration, batch.tokens)
        if self._recorder is not None:
            tokens = batch.tokens
            padding = tokens - batch.true_tokens if tokens else 0
            record = BatchRecord(
                batch.start_s,
                duration,
                batch.items,
                len(batch.parts),
                batch.reason,
                tokens,
                padding,
            )
            self._recorder.batch(record)

    # -- deciding ---------------------------------------------------------------------

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
            self._late_check_s = -math.inf  # new caps: predict the queued starts anew
        step = Step()
        if self._expired:
            step.rejected, self._expired = self._expired, []
        if now >= self._timeout_check_s:
            self._check_timeouts(now, step)
        if self._timeout_check_s != math.inf:
            # Firing batches cannot bring it earlier: a batch becomes stuck no sooner than
            # its requests time out.
            step.timeout_check_s = self._timeout_check_s
        if not self._queued_requests:
            return step
        cfg = self._config
        if cfg.on_overload == "reject":
            cutoff = now - cfg.max_latency_s - deadlines.OVERDUE_GRACE_S
            late = deadlines.overdue(self._groups.values(), cutoff)
            if late:
                self._reject(late, now, step)
        if self._in_flight < cfg.max_concurrent_batches:
            self._fill_slots(now, now if due_s is None or due_s < now else due_s, step)
        if self._in_flight >= cfg.max_concurrent_batches and cfg.on_overload == "reject":
            if self._admission()[1]:
                self._check_predicted(now, step)
            else:
                self._wait_for_slot(now, step)
        return step

    def _fill_slots(self, now: float, at: float, step: Step) -> None:
        """Ask the strategy about each group, oldest head first, while a slot is free.

        The strategy decides as of ``at`` (``now``, or the due time of the timer that woke
        the owner a tick early); batches fire at ``now``.

        A group the strategy fires leaves a batch in ``step.fire``; one it holds keeps its
        hold (until a time, and while it has fewer items than the hold allows).
        """
        held: list[ShapeGroup] = []
        cfg = self._config
        # Only a latency target reads the fit and the rates: without one, no refit.
        planning = self._budget.target_s > 0.0
        fit = self.cost_model.fit if planning else _NO_FIT
        while self._queued_requests and self._in_flight < cfg.max_concurrent_batches:
            oldest = self._oldest_group(held)
            if oldest is None:
                break
            group, head = oldest
            decision: Decision
            if self._closed:
                decision = Fire("drain")
            else:
                items = group.items
                if self._padding is not None and cfg.max_batch_tokens:
                    items = self._items_seen(group)
                view = HeadView(
                    items, group.requests, head.arrival_s, group.hold_start, group.hold_until
                )
                rates = self.rate.rates(now) if planning else _NO_RATES
                decision = decide(view, at, cfg, fit, rates, self._budget.budget_s)
            if isinstance(decision, Fire):
                # Take the batch off the group: it holds a slot until release().
                if self._padding is None:
                    parts, total, taken = group.take(cfg.max_batch_size, self._one_request, now)
                else:
                    parts, total, taken = self._take_padded(group, now)
                self._queued_items -= total
                self._queued_requests -= taken
                self._in_flight += 1
                self._next_batch += 1
                batch = Batch(self._next_batch, decision.reason, now, parts, total)
                if self._padding is not None:
                    batch.width, batch.true_tokens = self.codec.measure(
                        [(r.lengths, a, b) for r, a, b in parts]
                    )
                if cfg.on_overload == "reject":
                    fitted = self.cost_model.fit
                    if fitted.ready:  # admission predicts with it
                        batch.due_s = now + fitted.predict_s(total)
                        self._late_check_s = -math.inf
                self._running[batch.id] = batch
                step.fire.append(batch)
                continue
            if group.hold_start is None:
                group.hold_start = now
            group.hold_until = decision.until_s
            group.hold_items = decision.until_items
            step.wake_s = _earliest(step.wake_s, decision.until_s)
            held.append(group)

    def _items_seen(self, group: ShapeGroup) -> int:
        """What a strategy sees of a padded group: full (the cap) once the budget binds."""
        assert self._padding is not None
        cfg = self._config
        budget, cap = cfg.max_batch_tokens, cfg.max_batch_size
        if ragged.budget_binds(group.queue, cap, budget, self._padding):
            return cap
        return group.items

    def _take_padded(self, group: ShapeGroup, now: float) -> tuple[list[Part], int, int]:
        """ShapeGroup.take for a padded method: in order, within the cap and the budget."""
        assert self._padding is not None
        cfg = self._config
        group.hold_start = group.hold_until = None
        parts, total, taken = ragged.take(
            group.queue,
            cfg.max_batch_size,
            cfg.max_batch_tokens,
            self._padding,
            self._one_request,
            now,
        )
        group.items -= total
        group.requests -= taken
        return parts, total, taken

    def _oldest_group(self, skip: list[ShapeGroup]) -> tuple[ShapeGroup, Request] | None:
        """The group whose head arrived first, and that head, among those not in ``skip``.

        Empty groups are dropped on the way.
        """
        if len(self._groups) == 1 and not skip:
            # One shape (the usual case): no scan, and the group stays for the next arrival.
            group = next(iter(self._groups.values()))
            head = group.head()
            if head is not None:
                return group, head
        best: tuple[ShapeGroup, Request] | None = None
        for key in list(self._groups):
            group = self._groups[key]
            head = group.head()
            if head is None:
                del self._groups[key]
            elif group not in skip and (best is None or head.arrival_s < best[1].arrival_s):
                best = group, head
        return best

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
        r.state = _DONE
        r.pieces = None

    # -- deadlines (the scans are in .deadlines) --------------------------------------

    def _check_predicted(self, now: float, step: Step) -> None:
        """Every slot is busy and arrivals are judged: reject what is now predicted late.

        A queued request was predicted at admission to start in time; when a batch starts
        (and the running one is due at a new time), or the running one runs past the time
        at which some request could still start in time, the prediction is made again with
        the live cost model and those that can no longer start in time are rejected at
        once, not when their deadline comes. Made at the first poll after a batch fired
        that fires nothing itself, so that the check never delays a batch's start (a
        worker thread starting the next batch at once polls first).
        """
        if not self._queued_requests:
            self._late_check_s = math.inf
            return
        if step.fire or now < self._late_check_s:
            if now < self._late_check_s < math.inf:  # (-inf: due at the next poll)
                step.wake_s = _earliest(step.wake_s, self._late_check_s)
            return
        cfg = self._config
        fit = self.cost_model.fit
        late, wake = deadlines.predicted_late(
            self._groups.values(),
            min(b.due_s for b in self._running.values()),
            now,
            fit.predict_s(cfg.max_batch_size) / cfg.max_concurrent_batches,
            cfg.max_batch_size,
            cfg.max_latency_s,
        )
        if late:
            self._reject(late, now, step)
        if wake is None:
            self._late_check_s = math.inf
            return
        # Each check walks the queue: while a batch runs late, at most one a RECHECK_S.
        self._late_check_s = max(wake, now + deadlines.RECHECK_S)
        step.wake_s = _earliest(step.wake_s, self._late_check_s)

    def _wait_for_slot(self, now: float, step: Step) -> None:
        """Every slot is busy (reject mode, no fit yet): reject what can no longer start in time.

        And wake at the next deadline.
        """
        if not self._queued_requests:
            return
        late, next_deadline = deadlines.expired(
            self._groups.values(), now, self._config.max_latency_s
        )
        if late:
            self._reject(late, now, step)
        if next_deadline is not None:
            step.wake_s = _earliest(step.wake_s, next_deadline)

    def _expire_while_busy(self, now: float) -> None:
        """Every slot was busy until now: reject what passed its deadline meanwhile."""
        max_wait = self._config.max_latency_s
        if deadlines.may_expire(self._groups.values(), now, max_wait):
            late, _ = deadlines.expired(self._groups.values(), now, max_wait)
            expired = Step()
            self._reject(late, now, expired)
            self._expired += expired.rejected

    def _reject(self, late: list[Request], now: float, step: Step) -> None:
        """Reject ``late`` requests for overload (they could not start in time)."""
        cfg = self._config
        for r in late:
            self._settle(r)
            if self._recorder is not None:
                self._recorder.rejected(now)
            err = OverloadError(self.label, now - r.arrival_s, cfg.max_latency_s, cfg.retry_after_s)
            step.rejected.append((r, None, err))

    def _check_timeouts(self, now: float, step: Step) -> None:
        """Time out requests past ``request_timeout_ms``; mark batches running past it stuck.

        Runs only when :attr:`_timeout_check_s` (the earliest such moment) has come, and
        sets the next one.
        """
        timeout = self._config.request_timeout_s
        if not timeout:
            self._timeout_check_s = math.inf
            return
        late, stuck, self._timeout_check_s = deadlines.timeouts(
            self._groups.values(), self._running.values(), now, timeout
        )
        self._stuck.update(stuck)
        for r in late:
            self._settle(r)
            if self._recorder is not None:
                self._recorder.timed_out(now)
            err = RequestTimeoutError(self.label, now - r.arrival_s, timeout)
            step.timed_out.append((r, None, err))

    # -- reading ----------------------------------------------------------------------

    @property
    def recorder(self) -> Recorder:
        """Where this queue's traffic is recorded; LookupError if it keeps none."""
        if self._recorder is None:
            raise LookupError(f"{self.label} keeps no records (built with record=False)")
        return self._recorder

    def snapshot(self, now: float) -> Snapshot:
        """An immutable picture of this method now (O(window) work)."""
        recorder = self.recorder
        self._count_arrivals()
        fit = self.cost_model.fit
        items, _ = self.cost_model.observations()
        low, high = (int(items.min()), int(items.max())) if len(items) else (0, 0)
        return recorder.snapshot(
            now,
            runner=self.runner,
            method=self.name,
            config=self._config,
            queue_requests=self._queued_requests,
            queue_items=self._queued_items,
            in_flight_batches=self._in_flight,
            stuck_batches=len(self._stuck),
            budget_s=self._budget.budget_s,
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
    and, between decisions, admits in one call those that :attr:`quiet_items` says cannot
    change anything. Same queue, same strategies, the same decisions: only the
    bookkeeping is done in bulk. What each :meth:`poll` leaves for the arrivals after it
    is in :attr:`quiet_items` and :attr:`arrival_wake_s`, not in its Step: no other
    driver needs them.
    """

    quiet_items: int | None = 0
    """Set by each :meth:`poll`: items that may still arrive, into the group(s) already
    queued, before its decision can change (None: no limit, as every batch slot is busy).
    Until then, or until its ``wake_s``, a batch finishes or the config changes,
    :meth:`poll` would decide nothing new: that many may be admitted with no poll."""
    arrival_wake_s: float | None = None
    """Set by each :meth:`poll` when every batch slot is busy and no queued request waits
    for its deadline (``quiet_items`` is None; reject mode): the first request admitted
    after it, at time t, makes the next :meth:`poll` decide only ``wake_s = t +
    arrival_wake_s``. The simulator sets that timer itself instead of polling."""

    def poll(self, now: float, due_s: float | None = None) -> Step:
        """:meth:`BatchQueue.poll`; it also sets :attr:`quiet_items` and :attr:`arrival_wake_s`."""
        step = super().poll(now, due_s)
        cfg = self._config
        self.arrival_wake_s = None
        if self._in_flight < cfg.max_concurrent_batches:
            # A free slot: only a hold of the one group stands, until it has enough items.
            quiet = 0
            if self._queued_requests and len(self._groups) == 1:
                for group in self._groups.values():  # the one group
                    if group.hold_until is not None and group.hold_items is not None:
                        quiet = max(group.hold_items - 1 - group.items, 0)
            self.quiet_items = quiet
        elif cfg.on_overload != "reject":
            self.quiet_items = None  # no slot: arrivals only queue
        elif self._admission()[1]:
            self.quiet_items = 0  # each arrival is judged at admission: one by one
        elif step.wake_s is not None:
            self.quiet_items = None  # a queued deadline comes first: arrivals only queue
        elif not self._closed:
            # Nothing waits for a deadline: the next arrival's own deadline is the wake.
            self.quiet_items = None
            self.arrival_wake_s = cfg.max_latency_s
        else:
            self.quiet_items = 0
        return step

    def admit_many(self, request: Request, times: Sequence[float], handles: Sequence[Any]) -> int:
        """Queue a copy of ``request`` (from :meth:`new_request`) at each of ``times``.

        The same as :meth:`admit` once per time with no :meth:`poll` in between, except
        that each arrival is counted in the rate estimate at its own time rather than at
        the last one. ``times`` must not decrease; ``handles`` holds each copy's handle.
        Returns how many were admitted: the first ones, since nothing leaves the queue
        without a poll. The rest were refused (QueueFullError, RunnerStoppedError,
        ModelStuckError, OverloadError) and get no other outcome. Admitting no more than
        the last poll's :attr:`quiet_items` allow leaves every batching decision as it
        would be with a poll after each arrival. The rate estimate keeps ``times`` until
        it is next read: do not change the sequence afterwards.
        """
        room, judged = self._admission()
        n = k = len(times)
        if judged or self._past_free_slots(n * request.items):
            # Each arrival is judged as admit() judges it, behind the ones before it; the
            # first predicted late ends the call.
            for i, t in enumerate(times):
                if self._overload_at(t, self._queued_items + i * request.items) is not None:
                    k = i
                    break
        if k > room:
            k = room
        if k < n:
            for t in times[k:]:
                self._refuse(t)  # with the first: nothing leaves the queue without a poll
            if not k:
                return 0
            times, handles = times[:k], handles[:k]
        args, items, key = request.args, request.items, request.key
        rid = self._next_request
        self._next_request = rid + k
        group = self._groups.get(key) or self._group(key)
        if k == 1:  # the usual call at low load: no map to set up
            group.queue.append(Request(rid, args, items, key, handles[0], times[0]))
        else:
            # map builds the copies in one C-level loop: the fixed strategy's 60 s trace at
            # 5,000 req/s simulates in 0.58 s this way and 0.67 s with a list comprehension
            # (fastest of four alternating runs each, load average 7, 2026-12-02).
            new = map(
                Request,
                range(rid, rid + k),
                repeat(args),
                repeat(items),
                repeat(key),
                handles,
                times,
            )
            group.queue.extend(new)
        group.items += k * items
        group.requests += k
        self._queued_items += k * items
        self._queued_requests += k
        if self._timeout_check_s == math.inf and self._config.request_timeout_s:
            self._timeout_check_s = times[0] + self._config.request_timeout_s
        if self._new_requests:
            self._count_arrivals()  # earlier single admissions first, in order
        self.rate.observe_each(times, items)
        if self._recorder is not None:
            self._recorder.arrived(times[-1], k)
        return k


def _earliest(a: float | None, b: float) -> float:
    return b if a is None or b < a else a
