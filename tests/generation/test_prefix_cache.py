"""The prefix cache in the block pool: hashes, hits, LRU eviction, and a state machine."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from labserve.generation.blocks import BlockPool, block_hashes

SIZE = 2  # tokens per block in these tests


def _admit(pool: BlockPool, tokens: list[int]) -> tuple[list[int], int]:
    """Take a prompt's cached blocks and new ones for the rest: (table, blocks hit)."""
    hashes = block_hashes(tokens, SIZE)
    limit = (len(tokens) - 1) // SIZE
    hits = pool.lookup(hashes[:limit])
    table: list[int] = []
    pool.take(table, hits)
    pool.allocate(table, -(-len(tokens) // SIZE) - len(hits))
    return table, len(hits)


def _register(pool: BlockPool, table: list[int], tokens: list[int]) -> None:
    for block, h in zip(table, block_hashes(tokens, SIZE), strict=False):
        pool.register(block, h)


def test_hashes_depend_on_the_whole_prefix_and_are_stable() -> None:
    a = block_hashes([1, 2, 3, 4], SIZE)
    b = block_hashes([9, 2, 3, 4], SIZE)
    assert a[0] != b[0] and a[1] != b[1]  # same tokens in block 1, other parent
    # blake2b of fixed bytes: the first block's key, as a router in another process sees it
    assert block_hashes([1, 2], SIZE) == [a[0]] == block_hashes([1, 2, 3], SIZE)


def test_a_freed_block_stays_cached_and_is_hit() -> None:
    pool = BlockPool(4, caching=True)
    prompt = [1, 2, 3, 4, 5]
    table, hit = _admit(pool, prompt)
    assert hit == 0
    _register(pool, table, prompt)
    pool.free(table)
    assert pool.num_cached == 2 and pool.num_free == 4
    again, hit = _admit(pool, prompt)
    assert hit == 2 and again[:2] == table[:2]


def test_an_unlimited_pool_mints_a_new_block_rather_than_evict_a_cached_one() -> None:
    # The simulator's default pool (num_kv_blocks 0): overlapping sessions of one tenant
    # evicted each other's history (hit rate 63% where the live server's pool gave 84%).
    pool = BlockPool(0, caching=True)
    prompt = [1, 2, 3, 4, 5]
    table, _ = _admit(pool, prompt)
    _register(pool, table, prompt)
    pool.free(table)
    other: list[int] = []
    pool.allocate(other, 3)
    assert set(other).isdisjoint(table[:2]) and pool.num_cached == 2  # table[2]: uncached
    _, hit = _admit(pool, prompt)
    assert hit == 2


def test_the_last_prompt_token_is_always_computed() -> None:
    pool = BlockPool(4, caching=True)
    prompt = [1, 2, 3, 4]
    table, _ = _admit(pool, prompt)
    _register(pool, table, prompt)
    pool.free(table)
    _, hit = _admit(pool, prompt)
    assert hit == 1  # block 2 holds the last token: computed again for its logits


def test_eviction_is_least_recently_freed_tail_first_and_spares_uncached_blocks() -> None:
    pool = BlockPool(6, caching=True)
    a, _ = _admit(pool, [1, 2, 3, 4, 5])  # blocks 0, 1 full; 2 partial
    _register(pool, a, [1, 2, 3, 4, 5])
    b, _ = _admit(pool, [7, 8, 9, 10, 11])
    _register(pool, b, [7, 8, 9, 10, 11])
    pool.free(a)
    pool.free(b)
    # Uncached blocks first (a's and b's partial ones), then a's tail, a's head, b's tail.
    new: list[int] = []
    pool.allocate(new, 3)
    assert pool.num_evicted == 1 and pool.hash_of(a[1]) is None and pool.hash_of(a[0]) is not None
    assert set(new) == {a[2], b[2], a[1]}
    _, hit = _admit(pool, [7, 8, 9, 10, 11])
    assert hit == 2


def test_the_block_after_a_table_is_not_taken_when_it_is_cached() -> None:
    pool = BlockPool(4, caching=True)
    first, _ = _admit(pool, [1, 2, 3, 4])  # blocks 0 and 1, both full
    _register(pool, first, [1, 2, 3, 4])
    pool.free(first)
    table, hit = _admit(pool, [1, 2, 9])  # hits block 0; block 1 after it is cached
    assert hit == 1 and table == [0, 2] and pool.hash_of(1) is not None


def test_caching_off_drops_every_hash() -> None:
    pool = BlockPool(4, caching=True)
    table, _ = _admit(pool, [1, 2, 3, 4, 5])
    _register(pool, table, [1, 2, 3, 4, 5])
    pool.set_caching(False)
    assert pool.num_cached == 0 and pool.lookup(block_hashes([1, 2, 3, 4], SIZE)) == []
    assert not pool.register(table[0], 1)


def test_a_hash_is_cached_under_one_block() -> None:
    pool = BlockPool(6, caching=True)
    a, _ = _admit(pool, [1, 2, 3])
    b, _ = _admit(pool, [1, 2, 3])  # admitted before a's step registered anything
    _register(pool, a, [1, 2, 3])
    _register(pool, b, [1, 2, 3])
    assert pool.cached() == {block_hashes([1, 2], SIZE)[0]: a[0]}


class PoolMachine(RuleBasedStateMachine):
    """Sequences admitted, stepped, failed, freed (also mid-step) and caching toggled."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(8, caching=True)
        self.seqs: dict[int, tuple[list[int], list[int]]] = {}  # id -> (tokens, table)
        self.written: dict[int, int] = {}  # block -> the key of the tokens written into it
        self.next_id = 0
        self.in_step = False
        self.prompts: list[list[int]] = []  # every prompt admitted or tried

    @precondition(lambda self: not self.in_step and bool(self.prompts))
    @rule(data=st.data())
    def admit_sharing(self, data: st.DataObject) -> None:
        """A prompt that starts as an earlier one and goes its own way (hits, then misses)."""
        earlier = data.draw(st.sampled_from(self.prompts))
        keep = data.draw(st.integers(0, len(earlier)))
        tail = data.draw(st.lists(st.integers(3, 4), min_size=1, max_size=5))
        self.admit(earlier[:keep] + tail)

    @precondition(lambda self: not self.in_step)
    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=9))
    def admit(self, tokens: list[int]) -> None:
        self.prompts.append(tokens)
        pool = self.pool
        hashes = block_hashes(tokens, SIZE)
        limit = (len(tokens) - 1) // SIZE
        hits = pool.lookup(hashes[:limit])
        more = -(-len(tokens) // SIZE) - len(hits)
        if not pool.can_take(hits, more):
            return
        for block, h in zip(hits, hashes, strict=False):
            assert self.written[block] == h  # a hit holds what its key says
        table: list[int] = []
        pool.take(table, hits)
        pool.allocate(table, more)
        for i in range(len(hits), len(table)):  # the step writes these
            self.written[table[i]] = hashes[i] if i < len(hashes) else -1
        self.seqs[self.next_id] = (tokens, table)
        self.next_id += 1

    @precondition(lambda self: not self.in_step)
    @rule()
    def start_step(self) -> None:
        self.pool.step_started()
        self.in_step = True

    @precondition(lambda self: self.in_step)
    @rule(ok=st.booleans())
    def end_step(self, ok: bool) -> None:
        self.pool.step_ended()
        self.in_step = False
        if ok:  # a failed step registers nothing
            for tokens, table in self.seqs.values():
                _register(self.pool, table, tokens)

    @precondition(lambda self: bool(self.seqs))
    @rule(data=st.data())
    def end_sequence(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.seqs)))
        _, table = self.seqs.pop(seq_id)
        self.pool.free(table)

    @rule(on=st.sampled_from([True, True, True, False]))  # off drops all: not too often
    def toggle(self, on: bool) -> None:
        self.pool.set_caching(on)

    @invariant()
    def counts_add_up(self) -> None:
        pool = self.pool
        assert pool.num_used + pool.num_free + pool.num_parked == pool.capacity
        holders: dict[int, int] = {}
        for _, table in self.seqs.values():
            for block in table:
                holders[block] = holders.get(block, 0) + 1
        for block in range(pool.capacity):
            assert pool.refcount(block) == holders.get(block, 0) >= 0
            assert not (pool.is_free(block) and block in holders)
        assert pool.num_used == len(holders)

    @invariant()
    def a_held_block_is_never_given_away(self) -> None:
        for tokens, table in self.seqs.values():
            hashes = block_hashes(tokens, SIZE)
            for i, block in enumerate(table):
                assert self.written[block] == (hashes[i] if i < len(hashes) else -1)

    @invariant()
    def every_hash_names_one_block_holding_its_tokens(self) -> None:
        cached = self.pool.cached()
        assert len(set(cached.values())) == len(cached)
        for h, block in cached.items():
            assert self.written[block] == h and self.pool.hash_of(block) == h


PoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_pool_state_machine = PoolMachine.TestCase
