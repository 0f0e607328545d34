"""Length-aware batching in the queue: the token budget, length buckets, padding off."""

import numpy as np
import pytest

from labserve.base.errors import InputError, TokenBudgetError
from labserve.batching.containers import Codec, Padding
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig


def queue(multiple=None, **settings):
    codec = Codec("m", padding=Padding(axis=1, pad_to_multiple_of=multiple, lengths_arg=None))
    return BatchQueue("m", codec, BatchingConfig(**{"strategy": "greedy", **settings}))


def row(n, value=1.0):
    return (np.full((1, n), value),)


def fire_all(q, now):
    step = q.poll(now)
    for batch in step.fire:
        q.complete(batch, batch.split(q.codec, np.zeros((batch.items, 1))), now)
        q.release(batch, now, ok=True)
    return step.fire


def test_a_row_over_the_budget_fails_at_admission_naming_its_length_and_the_budget():
    q = queue(multiple=8, max_batch_tokens=64)
    kept = q.admit(row(10), now=0.0)
    with pytest.raises(TokenBudgetError, match=r"length 70 \(padded to 72\).*max_batch_tokens=64"):
        q.admit(row(70), now=0.0)
    err = TokenBudgetError("m", 70, 72, 64)
    assert isinstance(err, InputError) and err.status == 400
    assert (err.length, err.budget) == (70, 64)
    (batch,) = fire_all(q, 0.0)
    assert [r for r, _, _ in batch.parts] == [kept]  # nothing else harmed


def test_many_rows_may_exceed_the_budget_together_they_are_split_across_batches():
    q = queue(max_batch_tokens=40)
    q.admit((np.ones((5, 10)),), now=0.0)  # 50 tokens: 4 rows, then 1
    assert [b.tokens for b in fire_all(q, 0.0)] == [40]
    assert [b.tokens for b in fire_all(q, 0.0)] == [10]


def test_batches_stay_within_the_budget_and_a_full_budget_fires_as_full():
    q = queue(strategy="fixed", max_latency_ms=50, max_batch_tokens=100)
    for n in (10, 20, 30, 40):
        q.admit(row(n), now=0.0)
    fired = fire_all(q, 0.001)  # 4 x 40 = 160 > 100: the budget binds, no waiting
    assert [(b.items, b.width, b.reason) for b in fired] == [(3, 30, "full")]  # 90 tokens
    assert all(b.tokens <= 100 for b in fired)


def test_length_buckets_keep_lengths_apart_and_the_wait_cap_still_holds():
    q = queue(strategy="fixed", max_latency_ms=10, length_buckets=[16, 64])
    for t, n in ((0.0, 5), (0.001, 60), (0.002, 12), (0.003, 30), (0.004, 200)):
        q.admit(row(n), now=t)
    assert q.poll(0.005).fire == []  # held: nobody waited 10 ms yet
    fired = fire_all(q, 0.010)  # the oldest (length 5) waited 10 ms: its bucket fires
    assert [sorted(int(r.lengths[0]) for r, _, _ in b.parts) for b in fired] == [[5, 12]]
    assert [b.reason for b in fired] == ["timeout"]
    fired = fire_all(q, 0.011)
    assert [sorted(int(r.lengths[0]) for r, _, _ in b.parts) for b in fired] == [[30, 60]]
    assert [b.width for b in fire_all(q, 0.014)] == [200]  # past the last bound: its own


def test_padding_off_batches_only_one_length_together():
    q = queue(padding=False)
    for n in (4, 7, 4, 7, 4):
        q.admit(row(n), now=0.0)
    fired = fire_all(q, 0.0) + fire_all(q, 0.0)  # one slot: a batch per poll
    assert sorted((b.items, b.width, b.tokens - b.true_tokens) for b in fired) == [
        (2, 7, 0),
        (3, 4, 0),
    ]


def test_pad_to_longest_shares_one_batch_and_counts_its_padding():
    q = queue()
    for n in (4, 7, 4, 7, 4):
        q.admit(row(n), now=0.0)
    (batch,) = fire_all(q, 0.0)
    assert (batch.items, batch.width, batch.tokens, batch.true_tokens) == (5, 7, 35, 26)


def drain(q, now):
    fired = []
    while not q.idle:
        fired += fire_all(q, now)
    return fired


def test_live_changes_take_effect_at_the_next_batch_boundary():
    q = queue()
    q.admit(row(4), now=0.0)
    q.admit(row(12), now=0.0)
    q.configure(q.config.replace(max_batch_tokens=20, length_buckets=[8]))
    # The budget is in force from the next batch: 2 x 12 = 24 > 20, so two batches.
    assert [(b.items, b.width) for b in drain(q, 0.0)] == [(1, 4), (1, 12)]
    q.admit(row(3), now=0.1)  # filed in the buckets now in force: <= 8, and past 8
    q.admit(row(6), now=0.1)
    q.admit(row(12), now=0.1)
    assert sorted((b.items, b.width) for b in drain(q, 0.1)) == [(1, 12), (2, 6)]
    with pytest.raises(TokenBudgetError):
        q.admit(row(21), now=0.2)
    q.configure(q.config.replace(padding=False, length_buckets=[]))
    q.poll(0.3)
    q.admit(row(3), now=0.3)
    q.admit(row(6), now=0.3)
    assert sorted(b.width for b in drain(q, 0.3)) == [3, 6]


def test_a_request_cancelled_in_a_bucket_leaves_the_counts_right():
    q = queue(length_buckets=[8])
    a = q.admit(row(3), now=0.0)
    q.admit(row(30), now=0.0)
    assert q.cancel(a, now=0.0)
    fired = fire_all(q, 0.0)
    assert [b.width for b in fired] == [30]
    assert q.idle
