"""Deadlines and overload: which queued or running requests are out of time, and when next.

Three limits, each a scan over the queue's shape groups (FIFO, so a scan stops at the first
request still in time) or its running batches:

- **the wait cap under overload** (``on_overload="reject"``): a request that could not
  start within ``max_latency_ms`` for want of a free batch slot is rejected
  (:func:`expired`, :func:`overdue`), or refused at admission when the cost model predicts
  it (:func:`admission_overload`);
- **the request timeout** (``request_timeout_ms``): a request past it, queued or running,
  times out, and a batch running past it is stuck (:func:`timeouts`).

Pure functions of what they are shown: the queue settles the requests they name, records
them and hands their errors to its owner.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from labserve.base.errors import OverloadError
from labserve.batching.estimators import CostFit
from labserve.batching.groups import ShapeGroup
from labserve.batching.requests import Batch, Request, RequestState
from labserve.config.batching import BatchingConfig

__all__ = [
    "OVERDUE_GRACE_S",
    "admission_overload",
    "expired",
    "may_expire",
    "overdue",
    "timeouts",
]

OVERDUE_GRACE_S = 0.002
"""A request this far past its wait cap when a free slot is finally polled is rejected
(reject mode), not served late; within it, a deadline timer that fired late still fires the
batch."""

_DONE = RequestState.DONE


def admission_overload(
    label: str,
    config: BatchingConfig,
    fit: CostFit,
    running: Iterable[Batch],
    queued_items: int,
    target_s: float,
    now: float,
) -> OverloadError | None:
    """The error for a request arriving now that the cost model predicts cannot start in time.

    Every slot is busy: it starts when the first running batch is due to end, plus one
    full batch's time (per slot) for each full batch of items queued ahead of it. "In time"
    is within ``max_latency_ms`` and, with a latency target (``target_s`` > 0), early
    enough to meet it. A wrong prediction errs both ways; the deadline check stays the
    backstop. None: it is predicted to start in time (or there is no fit to predict with).
    """
    if not fit.ready:
        return None
    cap, slots = config.max_batch_size, config.max_concurrent_batches
    full_s = fit.predict_s(cap) / slots
    free_at = min(b.due_s for b in running)
    wait = max(free_at - now, 0.0) + (queued_items // cap) * full_s
    limit = config.max_latency_s
    if target_s > 0.0:
        limit = min(limit, target_s - fit.predict_s(min(cap, queued_items % cap + 1)))
    if wait <= limit:
        return None
    drain = max(free_at - now, 0.0) + (queued_items / cap) * full_s
    return OverloadError(label, 0.0, limit, max(drain, 0.001), predicted_wait_s=wait)


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
