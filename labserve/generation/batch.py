"""What a generative method is called with: one step's sequences and their new tokens.

A step gives each sequence the tokens it has not computed yet (a prefill chunk, or the
token it produced last) from position ``starts[i]``; the model appends them to that
sequence's state and returns, for each sequence with ``samples[i]``, the logits of its
next token (one row each, in order), or the token ids themselves (a 1-D int array).

Where the K/V live is one of two contracts. A model that keeps its own caches (keyed by
``seq_ids``) gets ``block_tables == ()``. A model that stores K/V in labserve's blocks (vLLM's
split between the cache manager and the model runner) gets, for every sequence, its block
table: the ids of the pool blocks that hold its positions ``0 .. starts[i] + len(tokens[i])
- 1``, ``block_size`` positions each, in order; position ``p`` of sequence ``i`` lives in
block ``block_tables[i][p // block_size]`` at offset ``p % block_size``, i.e. at the flat
slot :meth:`slot_mapping` gives. The model writes the new tokens' K/V at their slots and
reads a sequence's earlier K/V through its table; labserve owns which block is whose.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["SeqBatch"]


@dataclass(frozen=True, slots=True)
class SeqBatch:
    """One step of a generative method: a batch of sequences and their new tokens.

    >>> b = SeqBatch((7,), (np.array([1, 2, 3]),), (0,), (True,))
    >>> [(i, t.tolist(), s) for i, t, s, _ in b]
    [(7, [1, 2, 3], 0)]
    """

    seq_ids: tuple[int, ...]
    tokens: tuple[npt.NDArray[np.int64], ...]
    """Each sequence's new tokens (1-D int64): a prefill chunk, or its last output."""
    starts: tuple[int, ...]
    """Each sequence's tokens already in the model's state: the first new token's position."""
    samples: tuple[bool, ...]
    """Whether the step must return that sequence's next-token logits (its prefill is done)."""
    block_tables: tuple[tuple[int, ...], ...] = ()
    """Each sequence's pool blocks, covering every position up to its last new token; ``()``
    for a model that keeps its own caches."""
    block_size: int = 0
    """Positions a block holds (0 when ``block_tables`` is empty)."""

    def __len__(self) -> int:
        return len(self.seq_ids)

    def __iter__(self) -> Iterator[tuple[int, npt.NDArray[np.int64], int, bool]]:
        return iter(zip(self.seq_ids, self.tokens, self.starts, self.samples, strict=True))

    @property
    def num_tokens(self) -> int:
        """New tokens in the step (what ``max_num_batched_tokens`` counts)."""
        return sum(len(t) for t in self.tokens)

    @property
    def num_sampling(self) -> int:
        """Rows the model returns: sequences that sample."""
        return sum(self.samples)

    def slots(self, row: int) -> npt.NDArray[np.int64]:
        """Flat K/V slots (``block * block_size + offset``) of row ``row``'s new tokens.

        >>> b = SeqBatch((7,), (np.array([5, 6, 7]),), (3,), (True,), ((9, 2),), 4)
        >>> b.slots(0).tolist()
        [39, 8, 9]
        """
        if not self.block_tables:
            raise ValueError("this step carries no block tables (the model keeps its own caches)")
        positions = self.starts[row] + np.arange(len(self.tokens[row]), dtype=np.int64)
        table = np.asarray(self.block_tables[row], dtype=np.int64)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def slot_mapping(self) -> npt.NDArray[np.int64]:
        """Every new token's flat slot, the rows' tokens packed in order (vLLM's slot_mapping).

        >>> b = SeqBatch((1, 2), (np.array([1, 2]), np.array([3])), (0, 5), (True, True),
        ...              ((0,), (3, 1)), 4)
        >>> b.slot_mapping().tolist()
        [0, 1, 5]
        """
        if not self.seq_ids:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([self.slots(i) for i in range(len(self.seq_ids))])

    def subset(self, rows: list[int]) -> SeqBatch:
        """The same step for the sequences at ``rows`` only (bisecting a failed step)."""
        return SeqBatch(
            tuple(self.seq_ids[i] for i in rows),
            tuple(self.tokens[i] for i in rows),
            tuple(self.starts[i] for i in rows),
            tuple(self.samples[i] for i in rows),
            tuple(self.block_tables[i] for i in rows) if self.block_tables else (),
            self.block_size,
        )
