"""Block tables a paged model keeps itself when the step it is handed carries none.

A model that stores K/V in labserve's blocks is normally handed each sequence's block table
by the scheduler. Called without (by a runtime that keeps no tables, or directly by
:func:`~labserve.lab.steps.profile_steps`), it still needs a table per sequence: this is
that small allocator, with the same two hooks a self-caching model has (free, and cut back
after a step that raised). Pure Python: the model owns the memory the ids point into.
"""

from __future__ import annotations

from collections.abc import Iterable

from labserve.generation.batch import SeqBatch

__all__ = ["OwnBlocks"]


class OwnBlocks:
    """Block ids ``0 .. num_blocks - 1`` and a table per sequence, ``block_size`` positions a block.

    >>> own = OwnBlocks(4, block_size=2)
    >>> import numpy as np
    >>> step = SeqBatch((7,), (np.array([1, 2, 3]),), (0,), (True,))
    >>> own.blocks_needed(step), own.extend(step)
    (2, ((0, 1),))
    >>> own.ran(step); own.num_free
    2
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.num_blocks = 0
        self._free: list[int] = []
        self._tables: dict[int, list[int]] = {}
        self._held: dict[int, int] = {}  # tokens each sequence's blocks hold
        self.add_blocks(num_blocks)

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds."""
        return len(self._free)

    def add_blocks(self, n: int) -> None:
        """``n`` more block ids (the model grew its pool to hold them)."""
        self._free.extend(range(self.num_blocks + n - 1, self.num_blocks - 1, -1))
        self.num_blocks += n

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def blocks_needed(self, batch: SeqBatch) -> int:
        """New blocks the step takes; raises before anything changes if a start is wrong.

        Raises:
            RuntimeError: a sequence's step starts elsewhere than where its K/V end.
        """
        need = 0
        for seq_id, tokens, start, _ in batch:
            held = self._held.get(seq_id, 0) if start else 0
            if start and seq_id not in self._held:
                raise RuntimeError(f"sequence {seq_id} has no cache for its {start} tokens")
            if held != start:
                raise RuntimeError(
                    f"sequence {seq_id}'s cache holds {held} tokens; its step starts at {start}"
                )
            have = len(self._tables.get(seq_id, ())) if start else 0
            need += max(0, self._blocks_for(start + len(tokens)) - have)
        return need

    def extend(self, batch: SeqBatch) -> tuple[tuple[int, ...], ...]:
        """Each sequence's table, grown to cover its new tokens (a start of 0 starts afresh)."""
        tables = []
        for seq_id, tokens, start, _ in batch:
            if start == 0:
                self.release([seq_id])
            table = self._tables.setdefault(seq_id, [])
            self._held.setdefault(seq_id, 0)
            while len(table) < self._blocks_for(start + len(tokens)):
                table.append(self._free.pop())
            tables.append(tuple(table))
        return tuple(tables)

    def ran(self, batch: SeqBatch) -> None:
        """The step's K/V are written: each sequence now holds its new tokens too."""
        for seq_id, tokens, start, _ in batch:
            self._held[seq_id] = start + len(tokens)

    def cut(self, batch: SeqBatch) -> None:
        """After a step that raised: each sequence back to its ``start`` tokens."""
        for seq_id, _, start, _ in batch:
            if start == 0:
                self.release([seq_id])
                continue
            table = self._tables.get(seq_id)
            if table is None:
                continue
            keep = self._blocks_for(start)
            self._free.extend(reversed(table[keep:]))
            del table[keep:]
            self._held[seq_id] = min(self._held.get(seq_id, 0), start)

    def release(self, seq_ids: Iterable[int]) -> None:
        """Give the sequences' blocks back."""
        for seq_id in seq_ids:
            self._free.extend(reversed(self._tables.pop(seq_id, [])))
            self._held.pop(seq_id, None)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._tables
