"""The sans-IO batch queue: admission, the queue, decisions, and result splitting.

It never reads a clock, sleeps, locks or touches a loop: its owner (the asyncio driver
or the simulator) feeds it events with their time — :meth:`BatchQueue.admit`,
:meth:`BatchQueue.cancel`, :meth:`BatchQueue.complete`, :meth:`BatchQueue.fail`,
:meth:`BatchQueue.release` — and after each one calls :meth:`BatchQueue.poll`, which says
which batches to fire now, which requests to reject, and when to wake up next.

Every admitted request leaves with exactly one outcome: a result (``complete``), a
typed error (``fail``, or rejected by ``poll``), or cancelled (``cancel``).
Not thread-safe: one owner calls everything.

The queue is a front over parts it owns: what it holds (:mod:`.occupancy`; shape groups
in :mod:`.groups`), who is refused or rejected and when (:mod:`.overload`; the scans in
:mod:`.deadlines`), what it records (:mod:`.tally`), callers' outcomes (:mod:`.outcomes`),
the strategies (:mod:`.policy`) and their latency budget (:mod:`.budget`). It keeps the
config and decides: each poll asks the strategy about each group, fires it or holds it.
The simulator's bulk admission is :class:`~.bulk.BulkQueue`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Hashable, Sequence
from typing import Any

from labserve.base.errors import LabServeError
from labserve.batching import outcomes, ragged
from labserve.batching.budget import LatencyBudget
from labserve.batching.containers import Codec
from labserve.batching.estimators import CostFit, CostModel, RateEstimator
from labserve.batching.groups import ShapeGroup
from labserve.batching.occupancy import Slots, Waiting
from labserve.batching.overload import Overload, earliest
from labserve.batching.policy import Decision, Fire, HeadView, decide
from labserve.batching.requests import Batch, Outcome, Request, RequestState, Step
from labserve.batching.tally import Tally
from labserve.config.batching import BatchingConfig
from labserve.metrics.recorder import Recorder
from labserve.metrics.snapshot import Snapshot

__all__ = ["BatchQueue"]

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
        self._pending_config: BatchingConfig | None = None
        self._budget = LatencyBudget()
        self._use(config)
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.rate = rate if rate is not None else RateEstimator()
        if record:
            recorder = recorder if recorder is not None else Recorder()
        self._tally = Tally(self.label, recorder if record else None, self.rate)
        self._waiting = Waiting()
        self._slots = Slots()
        self._closed = False
        self._overload = Overload(
            self.label,
            runner or name,
            self._waiting,
            self._slots,
            self.cost_model,
            self._budget,
            self._tally,
        )

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

    # -- admission (the checks are in .overload) --------------------------------------

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
        cfg = self._config
        if self._padding is not None and cfg.max_batch_tokens:
            ragged.check_tokens(self.label, request, self._padding, cfg.max_batch_tokens)
        overload = self._overload
        refusal: LabServeError | None = None
        room, judged = overload.admission(cfg, self._closed)
        if not room:
            refusal = overload.refusal(cfg, self._closed, now)
        elif judged or overload.past_free_slots(cfg, request.items):
            refusal = overload.overload_at(cfg, now, self._waiting.items)
        if refusal is not None:
            self._tally.refused(now)
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
        cfg = self._config
        room, judged = self._overload.admission(cfg, self._closed)
        budget = self._padding is not None and cfg.max_batch_tokens
        if len(requests) <= room and not judged and not budget:
            # In reject mode, a burst larger than the free slots start now (a loop that
            # stalled, catching up) is judged one by one: it must not queue unbounded.
            if cfg.on_overload != "reject" or not self._overload.past_free_slots(
                cfg, sum(r.items for r in requests)
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

    def _enqueue(self, requests: Sequence[Request], now: float) -> None:
        """File admitted requests, in order, into their shape groups as arrived at ``now``."""
        length_key = None if self._padding is None else self._length_key
        items = self._waiting.add(requests, now, length_key)
        self._overload.admitted(self._config, now)
        self._tally.arrived(now, len(requests), items)

    def _length_key(self, request: Request) -> Hashable:
        """A padded request's group: by bucket, by exact length, or one for all lengths."""
        cfg = self._config
        longest = int(request.lengths.max())
        return ragged.length_key(request.key, longest, cfg.length_buckets, cfg.padding)

    # -- outcomes ---------------------------------------------------------------------

    def cancel(self, request: Request, now: float) -> bool:
        """The caller gave up: withdraw the request. False if it already has its outcome.

        A request whose batch is running is counted cancelled and its result dropped.
        """
        if request.state is _DONE:
            return False
        self._waiting.settle(request)
        self._tally.cancelled(now)
        return True

    def abort(self, exc: LabServeError, now: float) -> list[Outcome]:
        """Fail every request without an outcome, queued or in a running batch, with ``exc``.

        For when stopping cannot wait any longer: a running batch keeps its slot until it
        returns, and its late results are dropped. Returns the outcomes to deliver.
        """
        done: list[Outcome] = []
        for r in (*self._waiting.requests_left(), *self._slots.requests()):
            if r.state is not _DONE:
                self._waiting.settle(r)
                done.append((r, None, copy.copy(exc)))
        self._overload.expired, expired = [], self._overload.expired
        self._tally.failed(now, len(done))
        return done + expired

    def close(self) -> None:
        """Refuse new requests; :meth:`poll` fires what is queued with reason ``drain``."""
        self._closed = True

    @property
    def idle(self) -> bool:
        """True when nothing is queued or running."""
        return self._waiting.requests == 0 and self._slots.in_flight == 0

    def complete(self, batch: Batch, outputs: Sequence[Any], now: float) -> list[Outcome]:
        """A batch (or half of one) ran: ``outputs`` holds each part's slice, in order."""
        done = outcomes.results(batch, outputs, self.codec)
        self._tally.served(now, done)
        return done

    def fail(self, batch: Batch, exc: BaseException, now: float) -> list[Outcome]:
        """A batch (or half of one) failed: each of its requests gets its own typed error."""
        done = outcomes.errors(batch, exc, self.label, self._waiting.settle)
        self._tally.failed(now, len(done))
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
        all_busy = self._slots.in_flight >= cfg.max_concurrent_batches
        self._slots.free(batch)
        if cfg.on_overload == "reject" or batch.due_s:
            self._overload.released(cfg, batch, now, all_busy=all_busy, ok=ok)
        duration = now - batch.start_s
        if ok:
            self.cost_model.observe(batch.items, duration, batch.tokens)
        self._tally.batch(batch, duration)

    # -- deciding ---------------------------------------------------------------------

    def poll(self, now: float, due_s: float | None = None) -> Step:
        """Decide: the batches to fire now, the requests to reject, and when to wake next.

        ``due_s`` is the ``wake_s`` an owner's timer was set for, when that timer is why it
        polls: a hold ending by then ends now. An event loop's timer wakes in the tick of its
        due time, not at it (asyncio up to a millisecond after, uvloop up to one before), so a
        driver arms it a tick early and says for when: the batch then fires in time, and its
        requests' recorded waits, taken at ``now``, stay within ``max_latency_ms``.
        """
        # Guards skip calls that would do nothing: "off" polls once per request.
        if self._tally.new_requests:
            self._tally.flush()
        overload = self._overload
        if self._pending_config is not None:
            self._use(self._pending_config)
            self._pending_config = None
            overload.late_check_s = -math.inf  # new caps: predict the queued starts anew
        step = Step()
        cfg = self._config
        if overload.expired or overload.timeout_check_s != math.inf:
            overload.check_timeouts(cfg, now, step)
        if not self._waiting.requests:
            return step
        reject = cfg.on_overload == "reject"
        if reject:
            overload.reject_overdue(cfg, now, step)
        if self._slots.in_flight < cfg.max_concurrent_batches:
            self._fill_slots(now, now if due_s is None or due_s < now else due_s, step)
        if reject and self._slots.in_flight >= cfg.max_concurrent_batches:
            overload.while_busy(cfg, self._closed, now, step)
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
        waiting, slots, padding = self._waiting, self._slots, self._padding
        # Only a latency target reads the fit and the rates: without one, no refit.
        planning = self._budget.target_s > 0.0
        fit = self.cost_model.fit if planning else _NO_FIT
        while waiting.requests and slots.in_flight < cfg.max_concurrent_batches:
            oldest = waiting.oldest(held)
            if oldest is None:
                break
            group, head = oldest
            decision: Decision
            if self._closed:
                decision = Fire("drain")
            else:
                items = group.items
                tokens = cfg.max_batch_tokens
                if padding is not None and tokens:  # seen as full once the token budget binds
                    if ragged.budget_binds(group.queue, cfg.max_batch_size, tokens, padding):
                        items = cfg.max_batch_size
                view = HeadView(
                    items, group.requests, head.arrival_s, group.hold_start, group.hold_until
                )
                rates = self.rate.rates(now) if planning else _NO_RATES
                decision = decide(view, at, cfg, fit, rates, self._budget.budget_s)
            if isinstance(decision, Fire):
                # Take the batch off the group: it holds a slot until release().
                if padding is None:
                    parts, total, taken = group.take(cfg.max_batch_size, self._one_request, now)
                else:
                    parts, total, taken = group.take_padded(
                        cfg.max_batch_size, cfg.max_batch_tokens, padding, self._one_request, now
                    )
                waiting.items -= total
                waiting.requests -= taken
                slots.last_id += 1
                batch = Batch(slots.last_id, decision.reason, now, parts, total)
                if padding is not None:
                    batch.width, batch.true_tokens = self.codec.measure(
                        [(r.lengths, a, b) for r, a, b in parts]
                    )
                if cfg.on_overload == "reject":
                    self._overload.fired(cfg, batch, now)
                slots.fire(batch)
                step.fire.append(batch)
                continue
            # The strategy holds the group open: until a time, or fewer items than it allows.
            if group.hold_start is None:
                group.hold_start = now
            group.hold_until = decision.until_s
            group.hold_items = decision.until_items
            step.wake_s = earliest(step.wake_s, decision.until_s)
            held.append(group)

    # -- reading ----------------------------------------------------------------------

    @property
    def recorder(self) -> Recorder:
        """Where this queue's traffic is recorded; LookupError if it keeps none."""
        return self._tally.kept()

    def snapshot(self, now: float) -> Snapshot:
        """An immutable picture of this method now (O(window) work)."""
        return self._tally.snapshot(
            now,
            self.cost_model,
            runner=self.runner,
            method=self.name,
            config=self._config,
            queue_requests=self._waiting.requests,
            queue_items=self._waiting.items,
            in_flight_batches=self._slots.in_flight,
            stuck_batches=len(self._slots.stuck),
            budget_s=self._budget.budget_s,
        )
