"""Deadlines and overload: which queued or running requests are out of time, and when next.

Three limits, each a scan over the queue's shape groups (FIFO, so a scan stops at the first
request still in time) or its running batches:

- **the wait cap under overload** (``on_overload="reject"``): a request that could not
  start within ``max_latency_ms`` for want of a free batch slot is refused at admission
  when the cost model predicts it (:func:`admission_overload`), rejected as soon as the
  cost model predicts it once queued (:func:`predicted_late`), or at its deadline
  (:func:`expired`, :func:`overdue`);
- **the request timeout** (``request_timeout_ms``): a request past it, queued or running,
  times out, and a batch running past it is stuck (:func:`timeouts`).

Pure functions of what they are shown: the queue settles the requests they name, records
them and hands their errors to its owner.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable

from labserve.base.errors import OverloadError
from labserve.batching.estimators import CostFit
from labserve.batching.groups import ShapeGroup
from labserve.batching.margin import OverloadMargin
from labserve.batching.requests import Batch, Request, RequestState
from labserve.config.batching import BatchingConfig

__all__ = [
    "OVERDUE_GRACE_S",
    "RECHECK_S",
    "admission_overload",
    "expired",
    "may_expire",
    "overdue",
    "predicted_late",
    "timeouts",
]

RECHECK_S = 0.001
"""While a batch runs late, the least time between two checks of the queued requests'
predicted starts (:func:`predicted_late`): each walks the queue."""

OVERDUE_GRACE_S = 0.002
"""A request this far past its wait cap when a free slot is finally polled is rejected
(reject mode), not served late; within it, a deadline timer that fired late still fires the
batch."""

_DONE = RequestState.DONE


def admission_overload(
    label: str,
    config: BatchingConfig,
    fit: CostFit,
    free_at: float,
    queued_items: int,
    target_s: float,
    now: float,
    margin: OverloadMargin | None = None,
) -> tuple[OverloadError | None, float]:
    """Whether a request arriving now is predicted to start in time, and until when.

    It starts when the next batch slot frees (``free_at``: the first running batch's due
    time, or now if a slot is free), plus one full batch's time (per slot) for each full
    batch of the ``queued_items`` ahead of it. "In time"
    is within ``max_latency_ms`` less the ``margin`` for as many batches ahead (how late such
    predictions have come true: :mod:`.margin`) and, with a latency target (``target_s`` >
    0), early enough to meet it.
    A wrong prediction errs both ways; :func:`predicted_late` and the deadline check stay
    the backstop.

    Returns (the error, or None if it is predicted to start in time; the time from which,
    were the running batch still running, :func:`predicted_late` would find it late).
    The fit must be ready.
    """
    cap, slots = config.max_batch_size, config.max_concurrent_batches
    full_s = fit.predict_s(cap) / slots
    ahead = queued_items // cap
    ahead_s = ahead * full_s
    late_at = now + config.max_latency_s - ahead_s
    wait = max(free_at - now, 0.0) + ahead_s
    limit = config.max_latency_s
    if target_s > 0.0:
        limit = min(limit, target_s - fit.predict_s(min(cap, queued_items % cap + 1)))
    margin_s = 0.0 if margin is None else margin.margin_s(ahead)
    # At most what leaves one full batch's time of the limit: every arrival while the
    # running batch ends is still let in, so the next batch still fills.
    margin_s = min(margin_s, max(limit - full_s, 0.0))
    if wait <= limit - margin_s:
        return None, late_at
    drain = max(free_at - now, 0.0) + (queued_items / cap) * full_s
    error = OverloadError(label, 0.0, limit, max(drain, 0.001), predicted_wait_s=wait)
    return error, late_at


def predicted_late(
    groups: Collection[ShapeGroup],
    free_at: float,
    now: float,
    full_s: float,
    cap: int,
    wait_s: float,
) -> tuple[list[Request], float | None]:
    """Queued requests not yet started that the cost model now predicts cannot start in time.

    Every slot is busy; the next frees at ``free_at`` (or after now, if that is past: the
    batch runs late), and each full batch of ``cap`` items queued ahead takes ``full_s``
    more, as admission predicts. A request predicted to start after its deadline (arrival
    + ``wait_s``) leaves (the ones behind it move up), as does one whose deadline came
    while every slot stayed busy; the rest keep their place. Returns them, in queue order,
    and the earliest time another would be predicted late if the running batch runs on
    past ``free_at`` (None: no request waits to start).
    """
    # A batch past its due time is still running: the next starts after now, not at it.
    overrun = free_at <= now
    base = now if overrun else free_at
    late: list[Request] = []
    wake: float | None = None
    ahead = 0  # items queued ahead of the request, of those staying
    queue: Iterable[Request]
    if len(groups) == 1:
        queue = next(iter(groups)).queue
    else:  # batches are taken group by group; in arrival order is what admission assumed
        queue = heapq.merge(*(g.queue for g in groups), key=_arrival)
    for r in queue:
        if r.state is _DONE:
            continue
        if r.start_s is None:
            chunk_s = (ahead // cap) * full_s
            deadline = r.arrival_s + wait_s
            start = base + chunk_s
            if start > deadline or (overrun and start >= deadline):
                late.append(r)
                continue
            at = deadline - chunk_s  # from then on, a batch still running makes it late
            if at > now and (wake is None or at < wake):
                wake = at
        ahead += r.items - r.offset
    return late, wake


def _arrival(r: Request) -> float:
    return r.arrival_s


def may_expire(groups: Collection[ShapeGroup], now: float, wait_s: float) -> bool:
    """False if :func:`expired` would surely find nothing now.

    So it is with one group whose head has not started and is before its deadline: the
    queue is FIFO, so nothing behind the head expired either.
    """
    if len(groups) != 1:
        return True
    head = next(iter(groups)).head()
    return not (head is not None and head.start_s is None and head.arrival_s + wait_s > now)


def expired(
    groups: Iterable[ShapeGroup], now: float, wait_s: float
) -> tuple[list[Request], float | None]:
    """Queued requests not yet started whose deadline (arrival + ``wait_s``) has passed.

    Returns them, oldest first in each group, and the earliest deadline still ahead of a
    request waiting to start (None: no request waits for one).
    """
    late: list[Request] = []
    next_deadline: float | None = None
    for group in list(groups):
        head = group.head()  # drops finished requests off the front
        if head is None:
            continue
        deadline: float | None
        if head.start_s is None and head.arrival_s + wait_s > now:
            deadline = head.arrival_s + wait_s  # the usual case: FIFO, nothing behind expired
        else:
            deadline = _scan_expired(group, now, wait_s, late)
        if deadline is not None and (next_deadline is None or deadline < next_deadline):
            next_deadline = deadline
    return late, next_deadline


def _scan_expired(
    group: ShapeGroup, now: float, wait_s: float, late: list[Request]
) -> float | None:
    """Add the group's expired requests to ``late``; return the first deadline ahead."""
    for r in group.queue:
        if r.state is _DONE or r.start_s is not None:
            continue  # done, or part of it already runs: it has started
        deadline = r.arrival_s + wait_s
        if deadline > now:
            return deadline
        late.append(r)
    return None


def overdue(groups: Iterable[ShapeGroup], cutoff_s: float) -> list[Request]:
    """Queued requests not yet started that arrived at or before ``cutoff_s``.

    For a free slot polled late (a stalled loop): ``cutoff_s`` is now less the wait cap and
    :data:`OVERDUE_GRACE_S`. A group whose head has started (the rest of a split request)
    is passed over: its head runs, and those behind it follow.
    """
    late: list[Request] = []
    for group in groups:
        head = group.head()
        if head is None or head.start_s is not None or head.arrival_s > cutoff_s:
            continue  # the usual case, at the cost of one comparison
        for r in group.queue:
            if r.state is _DONE or r.start_s is not None:
                continue
            if r.arrival_s > cutoff_s:
                break  # FIFO: everything behind it is in time too
            late.append(r)
    return late


def timeouts(
    groups: Iterable[ShapeGroup], running: Iterable[Batch], now: float, timeout_s: float
) -> tuple[list[Request], list[int], float]:
    """Requests past ``timeout_s`` since admission, and batches running past it.

    Returns (the requests, queued or in a running batch, each once), the ids of the
    batches now stuck, and the earliest moment another request can time out or batch
    become stuck (inf: none can).
    """
    late: list[Request] = []
    seen: set[int] = set()  # a split request can be queued and running, or in two batches
    earliest = math.inf
    for group in groups:
        for r in group.queue:  # FIFO: the first still in time ends the scan
            if r.state is _DONE:
                continue
            if r.arrival_s + timeout_s > now:
                earliest = min(earliest, r.arrival_s + timeout_s)
                break
            late.append(r)
            seen.add(r.id)
    stuck: list[int] = []
    for batch in running:
        for r, _, _ in batch.parts:
            if r.state is _DONE or r.id in seen:
                continue
            if r.arrival_s + timeout_s > now:
                earliest = min(earliest, r.arrival_s + timeout_s)
            else:
                late.append(r)
                seen.add(r.id)
        if batch.start_s + timeout_s <= now:
            stuck.append(batch.id)
        else:
            earliest = min(earliest, batch.start_s + timeout_s)
    return late, stuck, earliest
