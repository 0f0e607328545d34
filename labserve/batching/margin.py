"""How far overload predictions run late: the margin admission keeps in reject mode.

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
as many consecutive batches as a prediction spans, and admission refuses what is predicted
to start within that margin of the cap. It is a high quantile (:data:`QUANTILE`) of those
sums over the last :data:`WINDOW` batches. Batch ends are measured, not the starts of the
requests that were served, since those are what remains after the late ones were shed.
Refusing a little early costs no throughput while the queue still holds a full batch when
the slot frees, and admission caps the margin so that it does. Sans-IO like the queue that
owns it: durations are given.
"""

from __future__ import annotations

import bisect
from collections import deque

__all__ = ["QUANTILE", "WINDOW", "OverloadMargin"]

WINDOW = 128
"""Batches whose errors are kept (about a second at 8 ms a batch)."""
QUANTILE = 0.98
"""Which of the summed errors sets the margin: the 3rd largest of 128."""


class OverloadMargin:
    """How late predictions of a start come true: a high quantile of recent errors, seconds.

    >>> margin = OverloadMargin()
    >>> for late_s in [0.0001] * 60 + [0.0009] * 4:  # one batch end each, 2 spanned
    ...     margin.observe(late_s, spans=2)
    >>> round(margin.margin_s, 6)  # the largest sums of two, but for the top 2%
    0.0018
    >>> for late_s in [-0.001] * 128:  # every batch early: no margin
    ...     margin.observe(late_s, spans=2)
    >>> margin.margin_s
    0.0
    """

    __slots__ = ("_last", "_order", "_sums", "margin_s")

    def __init__(self) -> None:
        self._last: deque[float] = deque()  # the latest batches' errors, newest last
        self._sums: deque[float] = deque()  # summed errors, oldest first
        self._order: list[float] = []  # the same sums, sorted
        self.margin_s = 0.0
        """The summed error not exceeded by :data:`QUANTILE` of recent batches (0 if
        negative), in seconds."""

    def observe(self, late_s: float, spans: int) -> None:
        """A batch ended ``late_s`` after its due time; a prediction spans ``spans`` batches."""
        last = self._last
        last.append(late_s)
        while len(last) > spans:
            last.popleft()
        total = sum(last)
        sums, order = self._sums, self._order
        sums.append(total)
        bisect.insort(order, total)
        if len(sums) > WINDOW:
            del order[bisect.bisect_left(order, sums.popleft())]
        k = min(int(QUANTILE * len(order)), len(order) - 1)
        self.margin_s = max(order[k], 0.0)
