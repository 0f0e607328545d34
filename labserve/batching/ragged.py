"""Forming padded batches: length groups, the token budget, and taking requests in order.

Pure functions over the queue's requests, used by :class:`~labserve.batching.queue.BatchQueue`
for a method with a ragged axis. A batch's cost is its padded tokens (items x width, the
width being its longest row rounded up to ``pad_to_multiple_of``); ``max_batch_tokens``
bounds them, as ``max_batch_size`` bounds items.

Which requests may share a batch is decided when they are queued, by their group key:

* padding on, no buckets: every length shares one group (pad to the batch's longest);
* ``length_buckets=[16, 32, 64]``: one group per bucket (lengths up to 16, 17 to 32, 33
  to 64, and past the last), so a batch pads at most to its bucket's bound; the oldest
  request of every group still fires by ``max_latency_ms``;
* padding off: one group per exact length (what a batcher without padding does).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Hashable, Sequence

from labserve.base.errors import TokenBudgetError
from labserve.batching.padding import Padding
from labserve.batching.requests import Request, RequestState

__all__ = ["bucket_of", "budget_binds", "check_tokens", "length_key", "take"]


def bucket_of(length: int, buckets: Sequence[int]) -> int:
    """The index of the first bucket bound >= ``length`` (``len(buckets)``: past the last)."""
    return bisect_left(buckets, length)


def length_key(key: Hashable, length: int, buckets: Sequence[int], pad: bool) -> Hashable:
    """The group a request of longest row ``length`` joins (``key``: its signature)."""
    if not pad:
        return (key, "length", length)
    if buckets:
        return (key, "bucket", bucket_of(length, buckets))
    return key


def check_tokens(label: str, request: Request, padding: Padding, budget: int) -> None:
    """Refuse (TokenBudgetError) a request whose longest row alone exceeds the budget.

    Method ``label``'s budget is ``budget`` padded tokens; a refused request is marked done.
    """
    longest = int(request.lengths.max())
    padded = padding.round_width(longest)
    if padded > budget:
        request.state = RequestState.DONE
        raise TokenBudgetError(label, longest, padded, budget)


def take(
    q: deque[Request],
    cap: int,
    budget: int,
    padding: Padding,
    one_request: bool,
    now: float,
) -> tuple[list[tuple[Request, int, int]], int, int]:
    """Take the next batch's parts off the front of ``q``: (parts, items, whole requests).

    In arrival order, as the unpadded queue does, but a request joins only while the
    batch's padded tokens (its items x its width so far, or the newcomer's if wider) stay
    within ``budget`` (0: no budget). A request that does not fit waits for the next
    batch; one larger than the cap or the budget on its own is split, its first rows
    taken as far as they fit (the head of the queue is never left waiting for nothing).
    """
    parts: list[tuple[Request, int, int]] = []
    total = taken = longest = 0
    round_width = padding.round_width
    while q:
        r = q[0]
        if r.state is RequestState.DONE:
            q.popleft()
            continue
        start = r.offset
        take_n = min(r.items - start, cap - total)
        if take_n < r.items - start and total:
            break  # it would be split although the batch has others: let it lead the next
        lengths = r.lengths
        if budget:
            take_n = _within_budget(lengths, start, take_n, total, longest, budget, round_width)
            if take_n == 0:
                break
        longest = max(longest, int(lengths[start : start + take_n].max()))
        r.offset = start + take_n
        r.parts_pending += 1
        if r.start_s is None:
            r.start_s = now
        parts.append((r, start, start + take_n))
        total += take_n
        if r.offset < r.items:
            break  # split: the rest waits at the head
        q.popleft()
        taken += 1
        if one_request or total >= cap:
            break
    return parts, total, taken


def _within_budget(
    lengths: Sequence[int],
    start: int,
    want: int,
    total: int,
    longest: int,
    budget: int,
    round_width: Callable[[int], int],
) -> int:
    """How many of a request's rows from ``start`` (at most ``want``) fit the budget."""
    n = 0
    for i in range(start, start + want):
        wider = max(longest, int(lengths[i]))
        if (total + n + 1) * round_width(wider) > budget:
            break
        longest = wider
        n += 1
    if n == 0 and total == 0:
        n = 1  # a single row within the budget was checked at admission: it always fits
    if n < want and total:
        return 0  # only part of it fits beside the others: it leads the next batch instead
    return n


def budget_binds(q: deque[Request], cap: int, budget: int, padding: Padding) -> bool:
    """True if the budget (not the cap) stops the queued requests from all sharing a batch.

    A strategy sees such a group as full: its next batch is as large as it can be.
    Walks from the head only as far as one batch reaches.
    """
    total = longest = 0
    round_width = padding.round_width
    for r in q:
        if r.state is RequestState.DONE:
            continue
        n = r.items - r.offset
        longest = max(longest, int(r.lengths[r.offset :].max()))
        if (total + min(n, cap - total)) * round_width(longest) > budget:
            return True
        total += n
        if total >= cap:
            return False
    return False
