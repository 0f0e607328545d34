"""Forming padded batches: length groups, the token budget, arrival order kept."""

from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.batching.padding import Padding
from labserve.batching.ragged import bucket_of, budget_binds, length_key, take
from labserve.batching.requests import Request


def requests(*rows):
    """One request per tuple of row lengths."""
    out = deque()
    for i, lengths in enumerate(rows):
        r = Request(i, (), len(lengths), "k", None)
        r.lengths = np.asarray(lengths, dtype=np.int64)
        out.append(r)
    return out


def batch(q, cap=64, budget=0, multiple=None):
    parts, items, _ = take(q, cap, budget, Padding(pad_to_multiple_of=multiple), False, 0.0)
    return [(r.id, a, b) for r, a, b in parts], items


def test_buckets_and_exact_lengths_make_the_group_keys():
    assert [bucket_of(n, [16, 32, 64]) for n in (1, 16, 17, 64, 65)] == [0, 0, 1, 2, 3]
    assert length_key("k", 20, (), pad=True) == "k"
    assert length_key("k", 20, (16, 32), pad=True) == ("k", "bucket", 1)
    assert length_key("k", 20, (16, 32), pad=False) == ("k", "length", 20)


def test_without_a_budget_a_batch_takes_requests_in_order_up_to_the_cap():
    q = requests((3,), (50,), (2, 2))
    assert batch(q, cap=3) == ([(0, 0, 1), (1, 0, 1)], 2)  # the next would be split: it waits
    assert batch(q, cap=3) == ([(2, 0, 2)], 2)


def test_the_budget_stops_a_batch_before_a_request_that_would_widen_it_too_far():
    q = requests((10,), (12,), (100,), (8,))
    # 2 x 12 = 24 tokens; with the 100-long one: 3 x 100 = 300 > 128.
    assert batch(q, budget=128) == ([(0, 0, 1), (1, 0, 1)], 2)
    assert batch(q, budget=128) == ([(2, 0, 1)], 1)  # 100 fits alone; 2 x 100 would not
    assert batch(q, budget=128) == ([(3, 0, 1)], 1)


def test_the_budget_counts_rows_rounded_up_to_the_multiple():
    q = requests((9,), (9,), (9,))
    # Width 9 rounds to 16: 2 x 16 = 32 fits, 3 x 16 = 48 does not.
    assert batch(q, budget=40, multiple=8) == ([(0, 0, 1), (1, 0, 1)], 2)


def test_a_request_over_the_budget_on_its_own_is_split_rows_first():
    q = requests((30, 30, 30, 30, 30))
    assert batch(q, budget=64) == ([(0, 0, 2)], 2)
    assert batch(q, budget=64) == ([(0, 2, 4)], 2)
    assert batch(q, budget=64) == ([(0, 4, 5)], 1)


def test_the_budget_binds_when_the_queue_would_not_fit_in_one_batch():
    padding = Padding()
    assert budget_binds(requests((10,), (100,)), 64, 128, padding)
    assert not budget_binds(requests((10,), (20,)), 64, 128, padding)
    assert not budget_binds(requests((10,), (20,), (30,)), 2, 128, padding)  # the cap binds


rows = st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=5), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(rows=rows, cap=st.integers(1, 16), budget=st.integers(40, 400))
def test_batches_respect_cap_and_budget_and_take_every_row_once_in_order(rows, cap, budget):
    q = requests(*[tuple(r) for r in rows])
    seen = []
    while q:
        parts, items, _ = take(q, cap, budget, Padding(), False, 0.0)
        assert parts, "the head always makes progress"
        width = max(int(r.lengths[a:b].max()) for r, a, b in parts)
        assert items <= cap and items * width <= budget
        seen += [(r.id, i) for r, a, b in parts for i in range(a, b)]
    assert seen == [(i, j) for i, r in enumerate(rows) for j in range(len(r))]
