"""Tokens per batch and the padding fraction: in batch records, snapshots and /metrics."""

import math

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from labserve import SnapshotCollector
from labserve.batching.containers import Codec, Padding
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig


def padded_queue(lengths_per_batch, multiple=None):
    """Run one batch per list of lengths (rows of ones); return the queue at t=1 s."""
    codec = Codec("embed", padding=Padding(axis=1, pad_to_multiple_of=multiple, lengths_arg=None))
    q = BatchQueue("embed", codec, BatchingConfig(strategy="greedy"), runner="lm")
    t = 0.0
    for lengths in lengths_per_batch:
        for n in lengths:
            q.admit((np.ones((1, n)),), now=t)
        (batch,) = q.poll(now=t).fire
        out = np.zeros((batch.items, 1))
        q.complete(batch, batch.split(codec, out), now=t + 0.01)
        q.release(batch, now=t + 0.01, ok=True)
        t += 0.1
    return q


def test_each_batch_records_its_padded_and_padding_tokens():
    q = padded_queue([[2, 8, 3], [5]])
    first, second = q.snapshot(now=1.0).recent_batches
    assert (first.items, first.tokens, first.padding_tokens) == (3, 24, 11)
    assert (second.tokens, second.padding_tokens) == (5, 0)


def test_the_snapshot_shows_tokens_per_batch_and_the_padding_fraction():
    snap = padded_queue([[2, 8, 3], [5]], multiple=4).snapshot(now=1.0)
    # Widths 8 and 8 (5 rounds up to 8): tokens 24 and 8, padding 11 and 3.
    assert snap.tokens_total == 32 and snap.padding_tokens_total == 14
    assert snap.tokens_per_batch == 16.0
    assert math.isclose(snap.padding_fraction, 14 / 32)
    as_dict = snap.as_dict()
    assert as_dict["padding_fraction"] == snap.padding_fraction
    assert as_dict["recent_batches"][0]["padding_tokens"] == 11


def test_a_method_without_a_ragged_axis_shows_no_tokens():
    q = BatchQueue("m", Codec("m"), BatchingConfig(strategy="greedy"))
    q.admit((np.ones((2, 3)),), now=0.0)
    (batch,) = q.poll(now=0.0).fire
    q.complete(batch, q.codec.split(np.ones((2, 1)), batch.counts), now=0.01)
    q.release(batch, now=0.01, ok=True)
    snap = q.snapshot(now=1.0)
    assert snap.tokens_total == 0 and math.isnan(snap.padding_fraction)
    assert "labserve_padding_ratio" not in scrape([snap])


def test_metrics_export_tokens_padding_and_the_ratio():
    snap = padded_queue([[2, 8, 3], [5]]).snapshot(now=1.0)
    samples = scrape([snap])
    labels = (("method", "embed"), ("runner", "lm"))
    assert samples["labserve_batch_tokens_total"][labels] == 29
    assert samples["labserve_padding_tokens_total"][labels] == 11
    assert math.isclose(samples["labserve_padding_ratio"][labels], 11 / 29)
    assert samples["labserve_tokens_per_batch"][labels] == 14.5


def scrape(snapshots):
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshots))
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def test_the_queue_fits_batch_time_against_items_and_padded_tokens():
    codec = Codec("embed", padding=Padding(axis=1, lengths_arg=None))
    q = BatchQueue("embed", codec, BatchingConfig(strategy="greedy"), runner="lm")
    rng = np.random.default_rng(0)
    t = 0.0
    for _ in range(40):
        for n in rng.integers(1, 64, size=int(rng.integers(1, 8))):
            q.admit((np.ones((1, int(n))),), now=t)
        (batch,) = q.poll(now=t).fire
        took = 0.001 + 0.00002 * batch.items + 0.00001 * batch.tokens  # 10 µs per token
        q.complete(batch, batch.split(codec, np.zeros((batch.items, 1))), now=t + took)
        q.release(batch, now=t + took, ok=True)
        t += 0.1
    fit = q.snapshot(now=t).cost_fit
    assert math.isclose(fit.a_ms, 1.0, rel_tol=1e-6)
    assert math.isclose(fit.b_ms, 0.02, rel_tol=1e-4)
    assert math.isclose(fit.c_ms, 0.01, rel_tol=1e-6)
    assert fit.width > 1
