"""What a batch queue holds: the requests waiting in shape groups, and the batches in slots.

Two plain containers with their counts, shared by the queue and its collaborators
(:mod:`.overload`, :mod:`.tally`): :class:`Waiting` (queued requests, grouped by the
shape they stack with, oldest first) and :class:`Slots` (fired batches not yet released,
and which of them are stuck). They decide nothing; the queue changes them and the
collaborators read them. Not thread-safe: the queue's one owner calls everything.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from labserve.batching.groups import ShapeGroup
from labserve.batching.requests import Batch, Request, RequestState

__all__ = ["Slots", "Waiting"]

_DONE = RequestState.DONE


class Waiting:
    """The requests waiting to start (wholly or with a rest), in shape groups, and their counts."""

    __slots__ = ("groups", "items", "next_id", "requests")

    def __init__(self) -> None:
        self.groups: dict[Hashable, ShapeGroup] = {}
        self.requests = 0
        """Requests queued (wholly or with a rest still to take)."""
        self.items = 0
        """Items queued (of requests not yet given their outcome)."""
        self.next_id = 0
        """The id the next admitted request gets."""

    def group(self, key: Hashable) -> ShapeGroup:
        """The group of ``key``, made if there is none."""
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = ShapeGroup(key)
        return group

    def add(
        self,
        requests: Sequence[Request],
        now: float,
        length_key: Callable[[Request], Hashable] | None,
    ) -> int:
        """File requests, in order, into their groups as arrived at ``now``; return their items.

        ``length_key`` gives a padded request's group (None: the method has no ragged axis).
        """
        rid = self.next_id
        items = 0
        key: Hashable = None
        group: ShapeGroup | None = None
        for request in requests:
            request.id = rid
            rid += 1
            request.arrival_s = now
            if length_key is not None:
                request.key = length_key(request)
            if group is None or request.key != key:
                key = request.key
                group = self.group(key)
            group.queue.append(request)
            group.items += request.items
            group.requests += 1
            items += request.items
        self.next_id = rid
        self.items += items
        self.requests += len(requests)
        return items

    def oldest(self, skip: list[ShapeGroup]) -> tuple[ShapeGroup, Request] | None:
        """The group whose head arrived first, and that head, among those not in ``skip``.

        Empty groups are dropped on the way.
        """
        groups = self.groups
        if len(groups) == 1 and not skip:
            # One shape (the usual case): no scan, and the group stays for the next arrival.
            group = next(iter(groups.values()))
            head = group.head()
            if head is not None:
                return group, head
        best: tuple[ShapeGroup, Request] | None = None
        for key in list(groups):
            group = groups[key]
            head = group.head()
            if head is None:
                del groups[key]
            elif group not in skip and (best is None or head.arrival_s < best[1].arrival_s):
                best = group, head
        return best

    def settle(self, r: Request) -> None:
        """Mark ``r`` done and take whatever of it is still queued off the counts."""
        if r.offset < r.items:
            rest = r.items - r.offset
            group = self.groups.get(r.key)
            if group is not None:
                group.items -= rest
                group.requests -= 1
            self.items -= rest
            self.requests -= 1
            r.offset = r.items
        r.state = _DONE
        r.pieces = None

    def requests_left(self) -> list[Request]:
        """Every request still in a group's deque (some may be done already)."""
        return [r for g in self.groups.values() for r in g.queue]


class Slots:
    """The batches fired and not yet released (each holds one batch slot), by id."""

    __slots__ = ("in_flight", "last_id", "running", "stuck")

    def __init__(self) -> None:
        self.running: dict[int, Batch] = {}
        self.in_flight = 0
        """How many batches hold a slot (``len(running)``, kept as a count for the hot path)."""
        self.stuck: set[int] = set()
        """Running batches past the request timeout."""
        self.last_id = 0
        """The id of the last batch fired."""

    def fire(self, batch: Batch) -> None:
        """``batch`` takes a slot."""
        self.in_flight += 1
        self.running[batch.id] = batch

    def free(self, batch: Batch) -> None:
        """``batch``'s slot is free again (it is no longer stuck)."""
        self.in_flight -= 1
        del self.running[batch.id]
        if self.stuck:
            self.stuck.discard(batch.id)

    def first_due_s(self) -> float:
        """The earliest time a running batch is expected to end (reject mode's ``due_s``)."""
        return min(b.due_s for b in self.running.values())

    def oldest_stuck_s(self) -> float:
        """When the oldest stuck batch started."""
        return min(b.start_s for b in self.running.values() if b.id in self.stuck)

    def requests(self) -> list[Request]:
        """Every request with a part in a running batch."""
        return [r for b in self.running.values() for r, _, _ in b.parts]
