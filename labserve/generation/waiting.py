"""The waiting queue: sequences not yet running, in FCFS, priority or longest-prefix order.

``lpm`` keeps arrival order until its owner sorts it (:meth:`WaitingQueue.sort_by`), each
step, by how much of each prompt the prefix cache holds.

Removal is lazy: a waiting sequence that is cancelled or times out is marked done and
skipped when it reaches the head, so that both take O(1) (FCFS) or O(log n) (priority).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from labserve.config.generation import SchedulingPolicy
from labserve.generation.sequence import SeqState

__all__ = ["WaitingQueue"]


def _key(seq: SeqState) -> tuple[int, float, int, SeqState]:
    return (seq.priority, seq.arrival_s, seq.order, seq)


class WaitingQueue:
    """Waiting sequences; ``len()`` counts the live ones."""

    def __init__(self, policy: SchedulingPolicy) -> None:
        self.policy = policy
        self._fifo: deque[SeqState] = deque()
        self._heap: list[tuple[int, float, int, SeqState]] = []
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def push(self, seq: SeqState) -> None:
        """Queue a newly admitted sequence (at the back, in FCFS)."""
        self._live += 1
        if self.policy != "priority":
            self._fifo.append(seq)
        else:
            heapq.heappush(self._heap, _key(seq))

    def push_front(self, seq: SeqState) -> None:
        """Queue a preempted sequence: at the front in FCFS; by priority where its key puts it."""
        self._live += 1
        if self.policy != "priority":
            self._fifo.appendleft(seq)
        else:
            heapq.heappush(self._heap, _key(seq))

    def peek(self) -> SeqState | None:
        """The next live sequence, or None."""
        if self.policy != "priority":
            while self._fifo and self._fifo[0].finished:
                self._fifo.popleft()
            return self._fifo[0] if self._fifo else None
        while self._heap and self._heap[0][3].finished:
            heapq.heappop(self._heap)
        return self._heap[0][3] if self._heap else None

    def pop(self) -> SeqState:
        """Remove and return the next live sequence (call after ``peek`` returned it)."""
        seq = self.peek()
        if seq is None:
            raise IndexError("pop from an empty waiting queue")
        if self.policy != "priority":
            self._fifo.popleft()
        else:
            heapq.heappop(self._heap)
        self._live -= 1
        return seq

    def sort_by(self, key: Callable[[SeqState], int]) -> None:
        """Order the live sequences by ``key``, lowest first, ties kept in order (``lpm``)."""
        if self.policy == "priority":
            raise RuntimeError("a priority queue keeps its own order")
        live = sorted((s for s in self._fifo if not s.finished), key=key)
        self._fifo = deque(live)

    def forget(self) -> None:
        """Count one waiting sequence gone (the caller marked it done; it is skipped later)."""
        self._live -= 1

    def live(self) -> list[SeqState]:
        """The live sequences, in queue order (O(n log n): for snapshots and a policy change)."""
        if self.policy != "priority":
            return [s for s in self._fifo if not s.finished]
        return [k[3] for k in sorted(self._heap) if not k[3].finished]

    def reorder(self, policy: SchedulingPolicy) -> None:
        """Switch the order (a live config change); the live sequences are kept."""
        if policy == self.policy:
            return
        seqs = self.live()
        self.policy = policy
        self._fifo.clear()
        self._heap.clear()
        self._live = 0
        for seq in sorted(seqs, key=lambda s: (s.arrival_s, s.order)):
            self.push(seq)
