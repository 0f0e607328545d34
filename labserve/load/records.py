"""What a load run keeps per request, and the sender interface the drivers call. Loop-only.

A run's driver (open or closed loop, in :mod:`labserve.load.run`) owns one record (a
:class:`RunRecord` of its kind) and one :class:`Sender`; both live on the run's event loop
and are never touched from another thread while the run goes on.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from typing import Any, Generic, TypeVar

from labserve.base.vocabulary import CANCELLED

clock_s = time.monotonic
"""The clock of load records and schedules: ``time.monotonic``, as the runner's
MonotonicClock (a request's batch start is compared with its send and finish). Not
``loop.time()``: uvloop's is libuv's, in whole milliseconds, read once per loop iteration."""

__all__ = ["Control", "Record", "RunRecord", "Sender"]

RecordT = TypeVar("RecordT", bound="RunRecord")

_DISTINCT = 64  # distinct error messages kept per run (a message per request would grow)
_OTHERS = "(other messages)"


class RunRecord:
    """What every load run keeps, whatever it sends: intended times, lateness, errors. Loop-only.

    Times are seconds from ``t0``. Each kind of run adds its own per-request columns
    (:class:`Record` for request batching; a generation run's
    :class:`~labserve.load.generation.stream.GenRecord`) and a ``new_slot`` for them.
    """

    def __init__(self) -> None:
        self.t0 = 0.0
        """The time (:data:`clock_s`) the run's clock starts from."""
        self.arrival: list[float] = []
        """Intended send time."""
        self.lag: list[float] = []
        """Open loop: how late each request went out after its intended time."""
        self.track_lag = False
        """Open loop: senders call :meth:`went_out` when a request is written."""
        self.last_sent = 0.0
        """Open loop: when (seconds from ``t0``) the latest request went out."""
        self.errors: collections.Counter[str] = collections.Counter()
        """Why requests got no result: each message and how many said it."""

    def note_error(self, message: str) -> None:
        """Count a request's error message (at most ``_DISTINCT`` kept; others pooled)."""
        if message not in self.errors and len(self.errors) >= _DISTINCT:
            message = _OTHERS
        self.errors[message] += 1

    def went_out(self, k: int, now: float) -> None:
        """Request ``k`` was written (or given up unsent) at ``now`` (on :data:`clock_s`)."""
        if self.track_lag:
            sent = now - self.t0
            self.lag.append(max(sent - self.arrival[k], 0.0))
            self.last_sent = max(self.last_sent, sent)


class Record(RunRecord):
    """Per-request records of a request-batching run, filled on the loop.

    A request's slot starts as ``cancelled`` with NaN times; its sender overwrites the
    outcome and the times when the request ends, so a request given up by an interrupted
    run stays ``cancelled``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.start: list[float] = []
        """Start of the request's batch (in-process runs only; NaN over HTTP)."""
        self.finish: list[float] = []
        self.outcome: list[int] = []
        self.items: list[int] = []
        self.waited_for_connection = 0
        """Open loop over HTTP: requests that found every connection busy when due."""

    def new_slot(self, intended_s: float) -> int:
        """Add a request intended at ``intended_s``; returns its index."""
        self.arrival.append(intended_s)
        self.start.append(math.nan)
        self.finish.append(math.nan)
        self.outcome.append(CANCELLED)
        self.items.append(0)
        return len(self.arrival) - 1


class Sender(Generic[RecordT]):
    """Sends one request and records its outcome in a record of its kind. Loop-only.

    ``send`` must record every way a request can end as an outcome and never raise for
    one (a raise is a bug, and ends the run with it).
    """

    def new_record(self) -> RecordT:
        """An empty record for a run (made on the loop, once the sender is open)."""
        raise NotImplementedError

    def new_slot(self, rec: RecordT, intended_s: float) -> int:
        """Add request number ``len(rec.arrival)``, intended at ``intended_s``; its index."""
        raise NotImplementedError

    async def open(self) -> None:
        """Get ready to send (on the loop, before the run's clock starts)."""

    async def close(self) -> None:
        """Release what :meth:`open` took (idempotent)."""

    async def send(self, rec: RecordT, k: int) -> None:
        """Send request ``k`` and record its outcome and finish time."""
        raise NotImplementedError

    def send_soon(self, rec: RecordT, k: int) -> asyncio.Future[Any] | None:
        """Send request ``k`` now without a task, if this sender can; None if not.

        The future ends when the request has ended and been recorded; cancelling it gives
        the request up (it stays ``cancelled``). The default never can.
        """
        return None

    def why_behind(self, rec: RecordT) -> str:
        """What the sender saw that explains sends behind schedule ('' if nothing)."""
        return ""


class Control:
    """Stops a run's sending, and gives up its requests in flight when interrupted. Loop-only."""

    def __init__(self) -> None:
        self.sent = 0
        self.stopped_at: float | None = None
        """When stop() was called, on :data:`clock_s` (None while running)."""
        self.sending: asyncio.Task[None] | None = None
        self.in_flight: set[asyncio.Future[Any]] = set()
        self.error: BaseException | None = None
        """A sender's unexpected exception (a bug): the run raises it at its end."""

    def stop(self, abandon: bool = False) -> None:
        """Send no more; with ``abandon``, also give up the requests in flight (cancelled)."""
        if self.stopped_at is None:
            self.stopped_at = clock_s()
            if self.sending is not None:
                self.sending.cancel()
        if abandon:
            for task in list(self.in_flight):
                task.cancel()

    def track(self, task: asyncio.Future[Any]) -> None:
        """Keep ``task`` (or a future) until it ends; remember its exception for the run."""
        self.in_flight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[Any]) -> None:
        self.in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None and self.error is None:
            self.error = task.exception()
