"""The KV block pool, sans-IO: which block ids are free, and how many holders each has.

vLLM's split: the scheduler's block manager owns the ids, a model that stores K/V in
labserve's blocks owns the memory behind them (``allocate_kv``). A sequence's block table
(its :class:`~labserve.generation.sequence.SeqState`'s ``block_table``) lists the ids that
hold its positions, ``block_size`` each, in order.

Prefix caching (issue 33, vLLM's semantics): each block has a reference count; a full
block whose contents a step has written may be *registered* under a hash of its parent
block's hash and its token ids (:func:`block_hashes`). A block whose count drops to 0 joins
the free queue at its end and keeps its hash: it stays cached, and a sequence whose prompt
starts with the same blocks takes it back out of the queue (:meth:`BlockPool.take`, O(1):
an ``OrderedDict``). New blocks come from the queue's front, the least recently freed first;
taking a cached one evicts it (its hash is dropped). A freed block with no hash holds
nothing anyone can hit, so it goes to the queue's *front* instead (vLLM queues it at the end
with the rest): it is reused before any cached block is evicted. A sequence's blocks are
queued last block first, so that a prefix's tail is evicted before its head (vLLM's order:
the head is what more prompts share).

A table that grows takes the block after its last one when that block is free and holds
no hash, so that a sequence's positions often stay one run of slots, which a model can
read as a view instead of gathering them (TinyLM does, for a prefill chunk). A cached block
there is left where the LRU order puts it: contiguity saves a gather, a hit saves a prefill.

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

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from labserve.base.errors import ConfigError

__all__ = ["BlockPool", "block_hashes", "pool_blocks"]

_ROOT = b"labserve-prefix-v1"  # the first block's parent: a version, so a change of scheme shows


def block_hashes(
    token_ids: Sequence[int], block_size: int, parent: int | None = None, start: int = 0
) -> list[int]:
    """The hashes of the full blocks of ``token_ids`` from block ``start`` on.

    Each is blake2b (16 bytes, as an int) of its parent's hash and its ids packed as
    little-endian int64: the same in every process, Python version and machine, so that a
    router in another process computes the same keys. (Python's ``hash`` of a tuple of ints
    is not randomised either, but its algorithm changed in 3.8 and is 64-bit; blake2b costs
    about 1 us per 16-token block here.) ``parent``: the hash of block ``start - 1``.

    >>> a = block_hashes([1, 2, 3, 4, 5], 2)
    >>> len(a), a == block_hashes([1, 2, 3, 4], 2), a[1] == block_hashes([3, 4], 2, a[0], 0)[0]
    (2, True, True)
    """
    out: list[int] = []
    prev = _ROOT if parent is None else parent.to_bytes(16, "little")
    for b in range(start, len(token_ids) // block_size):
        ids = token_ids[b * block_size : (b + 1) * block_size]
        digest = hashlib.blake2b(prev, digest_size=16)
        digest.update(struct.pack(f"<{block_size}q", *ids))
        prev = digest.digest()
        out.append(int.from_bytes(prev, "little"))
    return out


class BlockPool:
    """Block ids, their reference counts and the free queue. Not thread-safe (its scheduler's).

    Args:
        capacity: blocks in the pool (0: no limit).
        caching: prefix caching on (see the module docstring); off, the free queue is
            plain LRU in the order blocks are freed, and nothing is registered.
    """

    __slots__ = (
        "_block_of",
        "_caching",
        "_capacity",
        "_free",
        "_hash_of",
        "_in_step",
        "_minted",
        "_parked",
        "_refs",
        "_used",
        "num_evicted",
    )

    def __init__(self, capacity: int = 0, *, caching: bool = False) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be an integer >= 0, got {capacity}")
        self._capacity = capacity
        self._refs: list[int] = [0] * capacity  # holders of each minted id
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(capacity))
        self._minted = capacity  # ids 0 .. _minted - 1 exist
        self._used = 0  # ids with at least one holder
        self._parked: list[int] = []  # freed while a step is in flight
        self._in_step = False
        self._hash_of: dict[int, int] = {}  # block -> its hash, while it is cached
        self._block_of: dict[int, int] = {}  # hash -> the one block cached under it
        self._caching = caching
        self.num_evicted = 0
        """Cached blocks whose hash was dropped to give the block to a new use."""

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

    @property
    def num_cached(self) -> int:
        """Blocks registered under a hash (held or free)."""
        return len(self._hash_of)

    def hash_of(self, block: int) -> int | None:
        """The hash ``block`` is cached under, or None."""
        return self._hash_of.get(block)

    def cached(self) -> dict[int, int]:
        """A copy of the cache: hash -> block."""
        return dict(self._block_of)

    # -- the prefix cache ----------------------------------------------------------------------

    def lookup(self, hashes: Iterable[int]) -> list[int]:
        """The blocks cached under the longest run of ``hashes`` from the first (none taken)."""
        found = []
        block_of = self._block_of
        for h in hashes:
            block = block_of.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def can_take(self, blocks: Sequence[int], n: int) -> bool:
        """Whether ``blocks`` (found by :meth:`lookup`) and ``n`` new blocks can be held now."""
        if not self._capacity:
            return True
        free_hits = sum(1 for b in blocks if self._refs[b] == 0)
        return self._used + free_hits + n <= self._capacity and len(self._free) >= free_hits + n

    def take(self, table: list[int], blocks: Iterable[int]) -> None:
        """Append cached ``blocks`` (from :meth:`lookup`) to ``table``, one more holder each."""
        refs = self._refs
        for block in blocks:
            if refs[block] == 0:
                if block in self._free:
                    del self._free[block]
                else:  # parked: not when a step is planned, but exact all the same
                    self._parked.remove(block)
                self._used += 1
            refs[block] += 1
            table.append(block)

    def register(self, block: int, block_hash: int) -> bool:
        """Cache held ``block`` under ``block_hash`` (its contents written); False if not.

        Not when the hash is cached already under another block (two sequences computed
        the same prefix at once: the first one's stays, vLLM's rule) or the block has one.
        """
        if not self._caching or block_hash in self._block_of or block in self._hash_of:
            return False
        self._block_of[block_hash] = block
        self._hash_of[block] = block_hash
        return True

    @property
    def caching(self) -> bool:
        """Whether prefix caching is on."""
        return self._caching

    def set_caching(self, on: bool) -> None:
        """Turn prefix caching on or off; off drops every hash (the blocks stay as they are)."""
        self._caching = on
        if not on:
            self._hash_of.clear()
            self._block_of.clear()

    def _evict(self, block: int) -> None:
        block_hash = self._hash_of.pop(block, None)
        if block_hash is not None:
            del self._block_of[block_hash]
            self.num_evicted += 1

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
        free, refs, hashed = self._free, self._refs, self._hash_of
        for _ in range(n):
            after = table[-1] + 1 if table else -1
            if after in free and after not in hashed:  # a context stays one run
                del free[after]
                block = after
            elif free and (self._capacity or next(iter(free)) not in hashed):
                block = free.popitem(last=False)[0]
                if block in hashed:
                    self._evict(block)
            else:  # unlimited (or forced): a new id; an unlimited pool never evicts a hit
                block = self._minted
                self._minted += 1
                refs.append(0)
            refs[block] = 1
            table.append(block)
        self._used += n

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one holder of each block; a block left with none is freed (or parked).

        Caching, last block first: a table's tail reaches the free queue (and eviction) first.
        """
        refs = self._refs
        for block in reversed(blocks) if self._caching else blocks:
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
        if self._capacity and block >= self._capacity:
            self._evict(block)  # a retired id past a shrunk end is dropped, hash and all
            return
        self._free[block] = None
        if self._caching and block not in self._hash_of:  # nothing to hit: reused first
            self._free.move_to_end(block, last=False)

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
            self._evict(block)
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
