"""Admission and overload: who may enter a batch queue, and who is turned away for lateness.

:class:`Overload` owns every decision that refuses or rejects a request for want of room or
time, and the times those decisions are next due:

- **at admission**: room (the queue cap, a close, every slot held by a stuck batch) and, in
  reject mode with a fitted cost model, whether a request is predicted to start in time;
- **while queued** (reject mode): requests past their wait cap, or predicted late again when
  a batch starts or one runs late, are rejected; so are those whose deadline passed while
  every slot was busy;
- **the request timeout**: requests past ``request_timeout_ms`` time out and batches running
  past it are marked stuck.

The scans themselves are pure functions in :mod:`.deadlines`; this class holds their state
(the next check times, the margin of admission's predictions, the rejections waiting for the
next poll), settles the requests they name and records them. It reads the queue's
:class:`~.occupancy.Waiting` and :class:`~.occupancy.Slots` and is handed the config in
force with each call. Not thread-safe: the queue's one owner calls everything.
"""

from __future__ import annotations

import math

from labserve.base.errors import (
    LabServeError,
    ModelStuckError,
    OverloadError,
    QueueFullError,
    RequestTimeoutError,
    RunnerStoppedError,
)
from labserve.batching import deadlines
from labserve.batching.budget import LatencyBudget
from labserve.batching.estimators import CostModel
from labserve.batching.margin import OverloadMargin
from labserve.batching.occupancy import Slots, Waiting
from labserve.batching.requests import Batch, Outcome, Request, Step
from labserve.batching.tally import Tally
from labserve.config.batching import BatchingConfig

__all__ = ["Overload", "earliest"]


class Overload:
    """Admission checks, overload rejections and request timeouts of one queue."""

    def __init__(
        self,
        label: str,
        owner: str,
        waiting: Waiting,
        slots: Slots,
        cost_model: CostModel,
        budget: LatencyBudget,
        tally: Tally,
    ) -> None:
        self.label = label
        self._owner = owner  # what RunnerStoppedError names
        self._waiting = waiting
        self._slots = slots
        self._cost_model = cost_model
        self._budget = budget
        self._tally = tally
        self.margin = OverloadMargin()  # how late admission's predicted starts come true
        self.expired: list[Outcome] = []  # rejected when a slot freed, reported by the next poll
        self.timeout_check_s = math.inf
        """The earliest time a request can time out or a batch become stuck (inf: none can)."""
        self.late_check_s = math.inf
        """When queued requests' predicted starts are next checked (reject mode, every slot
        busy): -inf once a batch fired (the next poll that fires nothing checks), else when
        a batch running past its due time would make one late (inf: none can)."""

    # -- at admission ---------------------------------------------------------------------

    def admission(self, cfg: BatchingConfig, closed: bool) -> tuple[int, bool]:
        """(room, judged): what admission looks like now, whatever a request holds.

        ``room``: how many more requests may be admitted; 0 when the queue is closed, every
        batch slot is held by a stuck batch, or it is full (:meth:`refusal` says which).
        ``judged``: each arrival is judged at admission (:meth:`overload_at`): in
        reject mode while every slot is busy and the cost model has a fit to predict with.
        """
        judged = (
            cfg.on_overload == "reject"
            and self._slots.in_flight >= cfg.max_concurrent_batches
            and self._cost_model.fit.ready
        )
        stuck = self._slots.stuck
        if closed or (stuck and len(stuck) >= cfg.max_concurrent_batches):
            return 0, judged
        free = cfg.max_queue_size - self._waiting.requests
        return (free if free > 0 else 0), judged

    def past_free_slots(self, cfg: BatchingConfig, items: int) -> bool:
        """True if ``items`` more would not all start in the batches free slots start now.

        Then, in reject mode with a fitted model, each arrival is judged at admission too.
        """
        if cfg.on_overload != "reject" or not self._cost_model.fit.ready:
            return False
        free = cfg.max_concurrent_batches - self._slots.in_flight
        return self._waiting.items + items > free * cfg.max_batch_size

    def refusal(self, cfg: BatchingConfig, closed: bool, now: float) -> LabServeError:
        """Why a request arriving at ``now`` finds no room (:meth:`admission` says 0)."""
        if closed:
            return RunnerStoppedError(self._owner)
        if self._waiting.requests >= cfg.max_queue_size:
            return QueueFullError(self.label, cfg.max_queue_size, cfg.retry_after_s)
        stuck = self._slots.stuck
        return ModelStuckError(self.label, len(stuck), now - self._slots.oldest_stuck_s())

    def overload_at(
        self, cfg: BatchingConfig, now: float, queued_items: int
    ) -> OverloadError | None:
        """The OverloadError for an arrival at ``now`` behind ``queued_items`` (None: in time).

        One predicted in time brings the next check of predicted starts (:meth:`while_busy`)
        forward to when a running batch that has not ended would make it late.
        """
        free = cfg.max_concurrent_batches - self._slots.in_flight
        if free > 0:  # the queue starts now, in the free slots' batches
            free_at = now
            queued_items = max(queued_items - (free - 1) * cfg.max_batch_size, 0)
        else:
            free_at = self._slots.first_due_s()
        refusal, late_at = deadlines.admission_overload(
            self.label,
            cfg,
            self._cost_model.fit,
            free_at,
            queued_items,
            self._budget.target_s,
            now,
            self.margin,
        )
        if refusal is None and late_at < self.late_check_s:
            self.late_check_s = late_at
        return refusal

    def admitted(self, cfg: BatchingConfig, first_s: float) -> None:
        """Requests were admitted, the first at ``first_s``: it may time out first."""
        if self.timeout_check_s == math.inf and cfg.request_timeout_s:
            self.timeout_check_s = first_s + cfg.request_timeout_s

    # -- batches ---------------------------------------------------------------------------

    def fired(self, cfg: BatchingConfig, batch: Batch, now: float) -> None:
        """``batch`` fired at ``now``: in reject mode with a fit, when it is due to end."""
        if cfg.on_overload == "reject":
            fitted = self._cost_model.fit
            if fitted.ready:  # admission predicts with it
                batch.due_s = now + fitted.predict_s(batch.items)
                self.late_check_s = -math.inf

    def released(
        self, cfg: BatchingConfig, batch: Batch, now: float, *, all_busy: bool, ok: bool
    ) -> None:
        """``batch`` freed its slot at ``now``; ``all_busy``: every slot was busy until then.

        In reject mode, requests whose deadline passed meanwhile could not start in time:
        they are rejected now (the next poll reports them) rather than fired late.
        """
        if all_busy and self._waiting.requests and cfg.on_overload == "reject":
            max_wait = cfg.max_latency_s
            groups = self._waiting.groups.values()
            if deadlines.may_expire(groups, now, max_wait):
                late, _ = deadlines.expired(groups, now, max_wait)
                expired = Step()
                self._reject(cfg, late, now, expired)
                self.expired += expired.rejected
        if ok and batch.due_s:  # reject mode: how far admission's prediction of its end was off
            self.margin.observe(now - batch.due_s)

    # -- at each poll ----------------------------------------------------------------------

    def check_timeouts(self, cfg: BatchingConfig, now: float, step: Step) -> None:
        """Hand over the rejections of :meth:`released`; time out what is past its timeout.

        Requests past ``request_timeout_ms`` time out and batches running past it are
        marked stuck, once :attr:`timeout_check_s` (the earliest such moment) has come;
        the next one is set, and given to ``step``.
        """
        if self.expired:
            step.rejected, self.expired = self.expired, []
        if now >= self.timeout_check_s:
            timeout = cfg.request_timeout_s
            if not timeout:
                self.timeout_check_s = math.inf
            else:
                late, stuck, self.timeout_check_s = deadlines.timeouts(
                    self._waiting.groups.values(), self._slots.running.values(), now, timeout
                )
                self._slots.stuck.update(stuck)
                for r in late:
                    self._waiting.settle(r)
                    self._tally.timed_out(now)
                    err = RequestTimeoutError(self.label, now - r.arrival_s, timeout)
                    step.timed_out.append((r, None, err))
        if self.timeout_check_s != math.inf:
            # Firing batches cannot bring it earlier: a batch becomes stuck no sooner than
            # its requests time out.
            step.timeout_check_s = self.timeout_check_s

    def reject_overdue(self, cfg: BatchingConfig, now: float, step: Step) -> None:
        """Reject mode: reject the queued requests past their wait cap (and its grace)."""
        cutoff = now - cfg.max_latency_s - deadlines.OVERDUE_GRACE_S
        late = deadlines.overdue(self._waiting.groups.values(), cutoff)
        if late:
            self._reject(cfg, late, now, step)

    def while_busy(self, cfg: BatchingConfig, closed: bool, now: float, step: Step) -> None:
        """Reject mode, every slot busy: reject what can no longer start in time; set the wake.

        With a fitted model, each queued request was predicted at admission to start in
        time; when a batch starts (and the running one is due at a new time), or the running
        one runs past the time at which some request could still start in time, the
        prediction is made again with the live cost model and those that can no longer
        start in time are rejected at once, not when their deadline comes. Made at the
        first poll after a batch fired that fires nothing itself, so that the check never
        delays a batch's start (a worker thread starting the next batch at once polls
        first). With no fit yet, requests are rejected at their deadline, and the queue
        wakes then.
        """
        if self.admission(cfg, closed)[1]:
            self._check_predicted(cfg, now, step)
        elif self._waiting.requests:
            late, next_deadline = deadlines.expired(
                self._waiting.groups.values(), now, cfg.max_latency_s
            )
            if late:
                self._reject(cfg, late, now, step)
            if next_deadline is not None:
                step.wake_s = earliest(step.wake_s, next_deadline)

    def _check_predicted(self, cfg: BatchingConfig, now: float, step: Step) -> None:
        if not self._waiting.requests:
            self.late_check_s = math.inf
            return
        if step.fire or now < self.late_check_s:
            if now < self.late_check_s < math.inf:  # (-inf: due at the next poll)
                step.wake_s = earliest(step.wake_s, self.late_check_s)
            return
        fit = self._cost_model.fit
        late, wake = deadlines.predicted_late(
            self._waiting.groups.values(),
            self._slots.first_due_s(),
            now,
            fit.predict_s(cfg.max_batch_size) / cfg.max_concurrent_batches,
            cfg.max_batch_size,
            cfg.max_latency_s,
        )
        if late:
            self._reject(cfg, late, now, step)
        if wake is None:
            self.late_check_s = math.inf
            return
        # Each check walks the queue: while a batch runs late, at most one a RECHECK_S.
        self.late_check_s = max(wake, now + deadlines.RECHECK_S)
        step.wake_s = earliest(step.wake_s, self.late_check_s)

    def _reject(self, cfg: BatchingConfig, late: list[Request], now: float, step: Step) -> None:
        """Reject ``late`` requests for overload (they could not start in time)."""
        for r in late:
            self._waiting.settle(r)
            self._tally.rejected(now)
            err = OverloadError(self.label, now - r.arrival_s, cfg.max_latency_s, cfg.retry_after_s)
            step.rejected.append((r, None, err))


def earliest(a: float | None, b: float) -> float:
    """The earlier of a wake time (None: none yet) and ``b``."""
    return b if a is None or b < a else a
