"""What a generative method is called with: one step's sequences and their new tokens.

The model owns its state (the KV cache, keyed by ``seq_ids``); labserve owns the schedule.
A step gives each sequence the tokens it has not computed yet (a prefill chunk, or the
token it produced last) from position ``starts[i]``; the model appends them to that
sequence's state and returns, for each sequence with ``samples[i]``, the logits of its
next token (one row each, in order), or the token ids themselves (a 1-D int array).
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

    def subset(self, rows: list[int]) -> SeqBatch:
        """The same step for the sequences at ``rows`` only (bisecting a failed step)."""
        return SeqBatch(
            tuple(self.seq_ids[i] for i in rows),
            tuple(self.tokens[i] for i in rows),
            tuple(self.starts[i] for i in rows),
            tuple(self.samples[i] for i in rows),
        )
