"""The KV block pool: ids, reference counts, the free queue, parking under a step in flight."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.base.errors import ConfigError
from labserve.generation.blocks import BlockPool, pool_blocks


def test_blocks_come_from_the_front_of_the_free_queue_and_go_back_to_its_end():
    pool = BlockPool(6)
    a: list[int] = []
    b: list[int] = []
    pool.allocate(a, 2)
    pool.allocate(b, 2)
    assert (a, b) == ([0, 1], [2, 3])
    pool.free(a)  # 0 and 1 join the queue behind 4 and 5
    c: list[int] = []
    pool.allocate(c, 3)
    assert c == [4, 5, 0]
    assert (pool.num_used, pool.num_free) == (5, 1)


def test_a_growing_table_takes_the_block_after_its_last_when_it_is_free():
    pool = BlockPool(8)
    a: list[int] = []
    b: list[int] = []
    pool.allocate(a, 1)
    pool.allocate(b, 1)  # takes 1: a's next is gone
    pool.allocate(a, 1)
    assert a == [0, 2]
    pool.allocate(a, 1)  # 3 is free: a stays one run from 2
    assert a == [0, 2, 3]


def test_a_block_freed_during_a_step_is_parked_until_the_step_ends():
    pool = BlockPool(2)
    table: list[int] = []
    pool.allocate(table, 2)
    pool.step_started()
    pool.free(table)
    assert (pool.num_used, pool.num_parked, pool.num_free) == (0, 2, 0)
    assert not pool.can_allocate(1)  # the model may still write into them
    pool.step_ended()
    assert (pool.num_parked, pool.num_free) == (0, 2) and pool.can_allocate(2)


def test_a_shared_block_is_freed_when_its_last_holder_lets_go():
    pool = BlockPool(3)
    table: list[int] = []
    pool.allocate(table, 1)
    block = table[0]
    pool._refs[block] += 1  # a second holder (prefix caching will do this)
    pool.free([block])
    assert pool.refcount(block) == 1 and not pool.is_free(block)
    pool.free([block])
    assert pool.refcount(block) == 0 and pool.is_free(block)
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free([block])


def test_an_unlimited_pool_mints_ids_and_reuses_freed_ones():
    pool = BlockPool(0)
    table: list[int] = []
    pool.allocate(table, 3)
    assert table == [0, 1, 2] and pool.can_allocate(10**6)
    pool.free(table[:1])
    other: list[int] = []
    pool.allocate(other, 2)
    assert other == [0, 3]


def test_a_shrunk_pool_keeps_held_blocks_and_retires_them_when_freed():
    pool = BlockPool(4)
    table: list[int] = []
    pool.allocate(table, 4)
    pool.resize(2)
    assert pool.num_used == 4 and not pool.can_allocate(1)
    pool.free(table[2:])  # ids 2 and 3 are past the end: retired
    assert pool.num_free == 0 and not pool.can_allocate(1)
    pool.free(table[:1])
    assert pool.num_free == 1 and pool.can_allocate(1)
    pool.resize(4)  # 2 and 3 are back
    assert sorted(b for b in range(4) if pool.is_free(b)) == [0, 2, 3]
    pool.step_started()
    with pytest.raises(RuntimeError, match="in flight"):
        pool.resize(8)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 12),
    ops=st.lists(
        st.tuples(st.sampled_from(["take", "free", "step", "end"]), st.integers(0, 5)),
        max_size=60,
    ),
)
def test_every_block_is_free_parked_or_held_once_under_any_order(capacity, ops):
    pool = BlockPool(capacity)
    tables: list[list[int]] = [[] for _ in range(6)]
    for op, i in ops:
        if op == "take" and pool.can_allocate(1):
            pool.allocate(tables[i], 1)
        elif op == "free":
            pool.free(tables[i])
            tables[i] = []
        elif op == "step":
            pool.step_started()
        elif op == "end":
            pool.step_ended()
        held = [b for t in tables for b in t]
        assert len(held) == len(set(held)) == pool.num_used
        free = [b for b in range(capacity) if pool.is_free(b)]
        assert not set(free) & set(held)
        assert len(free) + pool.num_parked + len(held) == capacity


def test_the_pool_is_sized_from_blocks_a_byte_budget_or_the_models_context():
    common = dict(block_size=16, kv_bytes_per_token=3072, max_num_seqs=32, max_model_len=1024)
    assert pool_blocks(num_kv_blocks=100, kv_cache_bytes=0, **common) == 100
    assert pool_blocks(num_kv_blocks=0, kv_cache_bytes=10 * 16 * 3072 + 5, **common) == 10
    assert pool_blocks(num_kv_blocks=0, kv_cache_bytes=0, **common) == 32 * 64
    with pytest.raises(ConfigError, match="num_kv_blocks is set"):
        pool_blocks(num_kv_blocks=100, kv_cache_bytes=1 << 20, **common)
    with pytest.raises(ConfigError, match="at least one block, 49152 bytes"):
        pool_blocks(num_kv_blocks=0, kv_cache_bytes=1000, **common)
    with pytest.raises(ConfigError, match="max_model_len"):
        pool_blocks(num_kv_blocks=0, kv_cache_bytes=0, **{**common, "max_model_len": 0})
