"""What the batch queue hands its owner: requests, fired batches, outcomes and decisions.

Plain data, no behaviour beyond stacking a batch's inputs; the queue
(:mod:`labserve.batching.queue`) creates and updates them, its owner (the asyncio driver
or the simulator) reads them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from labserve.base.vocabulary import Reason
from labserve.batching.containers import Codec

__all__ = ["Batch", "Outcome", "Request", "RequestState", "Step"]


class RequestState(IntEnum):
    """Where a request is: still waiting (wholly or in part), or given its outcome."""

    QUEUED = 0
    """Admitted and waiting, or part of it still waits or runs."""
    DONE = 1
    """Given its outcome (result, error, cancelled), or refused at admission."""


class Request:
    """One caller's request as the queue tracks it; ``handle`` is the owner's (a future)."""

    __slots__ = (
        "args",
        "arrival_s",
        "handle",
        "id",
        "items",
        "key",
        "lengths",
        "offset",
        "parts_pending",
        "pieces",
        "start_s",
        "state",
    )

    def __init__(
        self,
        rid: int,
        args: tuple[Any, ...],
        items: int,
        key: Hashable,
        handle: Any,
        arrival_s: float = 0.0,
    ):
        self.id = rid
        self.args = args
        self.items = items
        self.key = key
        self.handle = handle
        self.arrival_s = arrival_s
        self.start_s: float | None = None  # when its first batch fired
        self.offset = 0  # items already taken into batches
        self.parts_pending = 0  # taken parts whose batch has not finished
        self.pieces: list[tuple[int, Any]] | None = None  # outputs of a split request
        self.state = RequestState.QUEUED
        self.lengths: Any = None  # a ragged request's rows' true lengths (numpy int64)

    @property
    def done(self) -> bool:
        """True once the request has its outcome."""
        return self.state is RequestState.DONE


@dataclass(slots=True)
class Batch:
    """A fired batch: parts ``(request, start, stop)`` of one group, stacked by :meth:`stack`."""

    id: int
    reason: Reason
    start_s: float
    parts: list[tuple[Request, int, int]]
    items: int
    due_s: float = 0.0
    """When the cost model expects it to end (reject mode, once the model is fitted; else 0)."""
    width: int = 0
    """A padded batch's width on the ragged axis (0: the method has none)."""
    true_tokens: int = 0
    """A padded batch's tokens before padding: its rows' true lengths, summed."""

    @property
    def tokens(self) -> int:
        """Padded tokens computed: items x width (0 when the method has no ragged axis)."""
        return self.items * self.width

    def stack(self, codec: Codec) -> tuple[Any, ...]:
        """The model's input: the parts stacked along the batch axis (pure; any thread)."""
        parts = [
            r.args if (a == 0 and b == r.items) else codec.slice(r.args, a, b)
            for r, a, b in self.parts
        ]
        if codec.padding is not None:
            return codec.stack_padded(parts, self.width)
        return codec.stack(parts)

    def split(self, codec: Codec, output: Any) -> list[Any]:
        """The model's output split into each part's share (cut back if padded; pure)."""
        if codec.padding is None:
            return codec.split(output, self.counts)
        cuts = [
            (r.lengths[a:b], codec.sent_rows(r.args), int(r.lengths.max()))
            for r, a, b in self.parts
        ]
        return codec.split_padded(output, self.counts, cuts, self.width)

    @property
    def counts(self) -> list[int]:
        """Items of each part, in order (how the output is split)."""
        return [b - a for _, a, b in self.parts]

    def halves(self) -> tuple[Batch, Batch]:
        """Two batches with the first and second half of the parts (to isolate an error)."""
        mid = len(self.parts) // 2
        left, right = self.parts[:mid], self.parts[mid:]
        return self._part(left), self._part(right)

    def _part(self, parts: list[tuple[Request, int, int]]) -> Batch:
        items = sum(b - a for _, a, b in parts)
        return Batch(self.id, self.reason, self.start_s, parts, items, width=self.width)


Outcome = tuple[Request, Any, BaseException | None]
"""(request, result, error): exactly one of result and error is meaningful."""


@dataclass(slots=True)
class Step:
    """What the owner must do after an event."""

    fire: list[Batch] = field(default_factory=list)
    """Batches to run now (each holds one batch slot until :meth:`BatchQueue.release`)."""
    rejected: list[Outcome] = field(default_factory=list)
    """Requests rejected for overload, with their error."""
    timed_out: list[Outcome] = field(default_factory=list)
    """Requests past their request timeout (queued or in a running batch), with their error."""
    wake_s: float | None = None
    """Call :meth:`BatchQueue.poll` again at this time, unless another event comes first."""
    timeout_check_s: float | None = None
    """Call :meth:`BatchQueue.poll` by this time too (unless ``wake_s`` comes first): a
    request may time out or a batch become stuck then (``request_timeout_ms``)."""
