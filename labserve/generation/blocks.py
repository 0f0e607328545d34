"""The KV block pool, sans-IO: which block ids are free, and how many holders each has.

vLLM's split: the scheduler's block manager owns the ids, a model that stores K/V in
labserve's blocks owns the memory behind them (``allocate_kv``). A sequence's block table
(its :class:`~labserve.generation.sequence.SeqState`'s ``block_table``) lists the ids that
hold its positions, ``block_size`` each, in order.

Made so that a block can later be shared (prefix caching, issue 33): each block has a
reference count, and a block whose count drops to 0 joins the free queue at its end; new
blocks are taken from its front (the least recently freed first), and a block can be taken
back out of the middle in O(1) (an ``OrderedDict``). A table that grows takes the block after
its last one when that block is free, so that a sequence's positions often stay one run of
slots, which a model can read as a view instead of gathering them (TinyLM does).

A block freed while a step is in flight (:meth:`BlockPool.step_started`) is *parked*, not
freed: that step's model call may still be writing into it (a sequence aborted, timed out
or failed mid-step), so no other sequence may be given it until :meth:`BlockPool.step_ended`.

Capacity: ``capacity`` blocks, ids ``0 .. capacity - 1``; 0 means no limit (ids are minted
on demand: the accounting of a model that keeps its own caches). A live shrink below what
is held (``num_kv_blocks`` lowered, for such a model) keeps the held ids past the end
until they are freed, then retires them; no new block is given while the pool is over.

>>> pool = BlockPool(4)
>>> table: list[int] = []
>>> pool.allocate(table, 3); table
[0, 1, 2]
>>> pool.can_allocate(2), pool.num_free
(False, 1)
>>> pool.free(table[1:]); del table[1:]; pool.num_used, pool.num_free
(1, 3)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from labserve.base.errors import ConfigError

__all__ = ["BlockPool", "pool_blocks"]


class BlockPool:
    """Block ids, their reference counts and the free queue. Not thread-safe (its scheduler's).

    Args:
        capacity: blocks in the pool (0: no limit).
    """

    __slots__ = ("_capacity", "_free", "_in_step", "_minted", "_parked", "_refs", "_used")

    def __init__(self, capacity: int = 0) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be an integer >= 0, got {capacity}")
        self._capacity = capacity
        self._refs: list[int] = [0] * capacity  # holders of each minted id
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(capacity))
        self._minted = capacity  # ids 0 .. _minted - 1 exist
        self._used = 0  # ids with at least one holder
        self._parked: list[int] = []  # freed while a step is in flight
        self._in_step = False

    # -- what is counted ----------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Blocks in the pool (0: no limit)."""
        return self._capacity

    @property
    def num_used(self) -> int:
        """Blocks held by at least one sequence."""
        return self._used

    @property
    def num_free(self) -> int:
        """Blocks on the free queue (unlimited pools mint more when it is empty)."""
        return len(self._free)

    @property
    def num_parked(self) -> int:
        """Blocks freed during the step in flight, free once it ends."""
        return len(self._parked)

    def refcount(self, block: int) -> int:
        """Holders of ``block`` (0: free, parked, or never minted)."""
        return self._refs[block] if block < self._minted else 0

    def is_free(self, block: int) -> bool:
        """Whether ``block`` is on the free queue."""
        return block in self._free

    # -- taking and giving back ---------------------------------------------------------------

    def can_allocate(self, n: int) -> bool:
        """Whether ``n`` more blocks can be held now."""
        if not self._capacity:
            return True
        return self._used + n <= self._capacity and len(self._free) >= n

    def allocate(self, table: list[int], n: int, *, force: bool = False) -> None:
        """Append ``n`` new blocks (one holder each) to ``table``.

        ``force``: past the capacity if need be (ids minted past the end, retired when
        freed): re-counting an account after a live ``block_size`` change.

        Raises:
            RuntimeError: the pool cannot give them (check :meth:`can_allocate` first).
        """
        if not force and not self.can_allocate(n):
            raise RuntimeError(f"{n} KV blocks asked, {self.num_free} free: check can_allocate")
        free, refs = self._free, self._refs
        for _ in range(n):
            after = table[-1] + 1 if table else -1
            if after in free:  # the block after the table's last: a context stays one run
                del free[after]
                block = after
            elif free:
                block = free.popitem(last=False)[0]
            else:  # unlimited (or forced): a new id
                block = self._minted
                self._minted += 1
                refs.append(0)
            refs[block] = 1
            table.append(block)
        self._used += n

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one holder of each block; a block left with none is freed (or parked)."""
        refs = self._refs
        for block in blocks:
            refs[block] -= 1
            if refs[block] == 0:
                self._used -= 1
                if self._in_step:
                    self._parked.append(block)
                else:
                    self._release(block)
            elif refs[block] < 0:
                raise RuntimeError(f"KV block {block} freed more often than it was taken")

    def _release(self, block: int) -> None:
        if not self._capacity or block < self._capacity:
            self._free[block] = None  # a retired id past a shrunk end is dropped

    # -- steps ----------------------------------------------------------------------------------

    def step_started(self) -> None:
        """A step's model call runs from now: park what is freed until :meth:`step_ended`."""
        self._in_step = True

    def step_ended(self) -> None:
        """The step's model call is over: the blocks parked during it are free."""
        self._in_step = False
        parked, self._parked = self._parked, []
        for block in parked:
            self._release(block)

    # -- live resizing (models that keep their own caches only) ---------------------------------

    def resize(self, capacity: int) -> None:
        """Make the pool ``capacity`` blocks (0: no limit); held blocks stay held.

        Raises:
            RuntimeError: a step is in flight (a model may be writing into the pool).
        """
        if self._in_step:
            raise RuntimeError("the KV pool cannot be resized while a step is in flight")
        self._capacity = capacity
        if not capacity:
            return
        for block in [b for b in self._free if b >= capacity]:
            del self._free[block]
        if self._minted < capacity:
            self._refs.extend([0] * (capacity - self._minted))
            self._minted = capacity
        refs, free = self._refs, self._free
        for block in range(capacity):
            if refs[block] == 0 and block not in free:
                free[block] = None


def pool_blocks(
    *,
    num_kv_blocks: int,
    kv_cache_bytes: int,
    block_size: int,
    kv_bytes_per_token: int,
    max_num_seqs: int,
    max_model_len: int,
) -> int:
    """The pool's size in blocks for a model that stores K/V in labserve's blocks.

    ``num_kv_blocks`` when set; else ``kv_cache_bytes // (kv_bytes_per_token * block_size)``;
    else room for ``max_num_seqs`` sequences of ``max_model_len`` tokens (so that the
    default never preempts at the concurrency set at start).

    Raises:
        ConfigError: both sizes set; a byte budget smaller than one block; neither set
            and the model declares no ``max_model_len``.
    """
    if num_kv_blocks and kv_cache_bytes:
        raise ConfigError(
            "kv_cache_bytes",
            kv_cache_bytes,
            f"left at 0 when num_kv_blocks is set ({num_kv_blocks}): give the pool's size once",
        )
    if num_kv_blocks:
        return num_kv_blocks
    if kv_cache_bytes:
        per_block = kv_bytes_per_token * block_size
        blocks = kv_cache_bytes // per_block
        if blocks < 1:
            raise ConfigError(
                "kv_cache_bytes",
                kv_cache_bytes,
                f"at least one block, {per_block} bytes (kv_bytes_per_token "
                f"{kv_bytes_per_token} x block_size {block_size})",
            )
        return blocks
    if not max_model_len:
        raise ConfigError(
            "num_kv_blocks",
            0,
            "set (or kv_cache_bytes) for a model that stores K/V in labserve's blocks and "
            "declares no max_model_len to size the pool from",
        )
    return max_num_seqs * -(-max_model_len // block_size)
