"""How far overload predictions run late: the margins admission keeps in reject mode.

With ``on_overload="reject"`` and every batch slot busy, admission predicts when each
arrival would start (:func:`.deadlines.admission_overload`): when the running batch is due
to end, plus the fitted time of each full batch queued ahead. It refuses at once what would
start past the wait cap. A prediction that comes true late lets through a request that then
cannot start in time: it is shed all the same, only later, after its caller waited (at best
when the queue is checked again, :func:`.deadlines.predicted_late`; at worst at its
deadline). Model time varies (a sleep that overshoots, a thread waiting for the GIL or the
CPU), and the requests admitted at the edge of the cap, two or three batches ahead, are
the ones that pay: measured at 8,000 req/s offered, 15-25% of what was shed.

:class:`OverloadMargin` learns how late: each batch's end against its due time, summed over
consecutive batches. A request predicted to start ``j`` full batches after the running one
ends is late by the sum of ``j + 1`` such errors, so admission refuses what is predicted to
start within :meth:`OverloadMargin.margin_s` of the cap for its ``j``: a high quantile
(:data:`QUANTILE`) of the sums of ``j + 1`` consecutive errors over the last :data:`WINDOW`
batches. The largest, over a few seconds: the late sheds come from rare stalls (a thread
waiting for the GIL or a core), and a margin that left out the top 2% of a second's batches
(an earlier version) still let 0.4-1.9% of what was shed through, on a quiet machine; the
largest over 512 batches, 0-0.8% (benchmarks/HISTORY.md, issue 24). Batch ends are
measured, not the starts of the requests that were served, since
those are what remains after the late ones were shed. Refusing a little early costs no
throughput while the queue still holds a full batch when the slot frees: the next batch's
requests (``j = 0``) need the smallest margin, so the batch that matters for throughput
fills, and it is the deeper ones that are refused early. Sans-IO like the queue that owns
it: durations are given.
"""

from __future__ import annotations

import bisect
from collections import deque

__all__ = ["MAX_SPANS", "QUANTILE", "WINDOW", "OverloadMargin"]

WINDOW = 512
"""Batches whose errors are kept (about four seconds at 8 ms a batch)."""
QUANTILE = 1.0
"""Which of the summed errors sets a margin: the largest in the window."""
MAX_SPANS = 8
"""The longest run of batches whose summed errors are kept; a prediction spanning more is
given that margin scaled up in proportion (errors add up at worst linearly)."""


class OverloadMargin:
    """How late predicted starts come true: high quantiles of recent errors, in seconds.

    >>> margin = OverloadMargin()
    >>> for late_s in [0.0001] * 60 + [0.0009] * 4:  # batch ends against their due times
    ...     margin.observe(late_s)
    >>> round(margin.margin_s(0), 6)  # the next batch: the largest error in the window
    0.0009
    >>> round(margin.margin_s(1), 6)  # one more full batch ahead: two errors add up
    0.0018
    >>> for late_s in [-0.001] * 600:  # every batch early, for a whole window: no margin
    ...     margin.observe(late_s)
    >>> margin.margin_s(2)
    0.0
    """

    __slots__ = ("_last", "_margins", "_order", "_sums")

    def __init__(self) -> None:
        self._last: deque[float] = deque(maxlen=MAX_SPANS)  # the latest errors, newest last
        # For each run length n (1..MAX_SPANS): the sums of n consecutive errors, oldest
        # first, and the same sorted.
        self._sums: list[deque[float]] = [deque() for _ in range(MAX_SPANS)]
        self._order: list[list[float]] = [[] for _ in range(MAX_SPANS)]
        self._margins = [0.0] * MAX_SPANS

    def observe(self, late_s: float) -> None:
        """A batch ended ``late_s`` after its due time (negative: early). O(MAX_SPANS)."""
        last = self._last
        last.append(late_s)
        total = 0.0
        for n, error in enumerate(reversed(last)):  # the sums ending with this batch
            total += error
            sums, order = self._sums[n], self._order[n]
            sums.append(total)
            bisect.insort(order, total)
            if len(sums) > WINDOW:
                del order[bisect.bisect_left(order, sums.popleft())]
            k = min(int(QUANTILE * len(order)), len(order) - 1)
            self._margins[n] = max(order[k], 0.0)

    def margin_s(self, ahead: int) -> float:
        """The margin for a start predicted ``ahead`` full batches after the running one."""
        if ahead < MAX_SPANS:
            return self._margins[ahead]
        return self._margins[-1] * (ahead + 1) / MAX_SPANS
