import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from labserve import SnapshotCollector
from labserve.base.errors import OverloadError
from labserve.batching.containers import Codec
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig


def traffic():
    """A queue on virtual time with served, rejected and cancelled requests."""
    q = BatchQueue(
        "predict",
        Codec("predict"),
        BatchingConfig(
            strategy="greedy", max_batch_size=4, max_latency_ms=10, on_overload="reject"
        ),
        runner="scorer",
    )
    x = np.ones((1, 2))
    for i in range(6):
        q.admit((x,), now=0.0 + i * 1e-4)
    fired = q.poll(0.001).fire  # 6 queued, cap 4: one full batch; 2 wait
    cancelled = q.admit((x,), now=0.001)
    q.cancel(cancelled, now=0.001)
    rejected = q.poll(0.02).rejected  # the slot is still busy: the 2 waiting expire
    for batch in fired:
        q.complete(batch, q.codec.split(x.repeat(batch.items, 0), batch.counts), now=0.03)
        q.release(batch, now=0.03, ok=True)
    return q, rejected


def scrape(snapshots):
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshots))
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_follow_the_snapshot_they_are_scraped_from():
    q, rejected = traffic()
    assert all(isinstance(err, OverloadError) for _, _, err in rejected)
    snap = q.snapshot(0.03)
    samples = scrape([snap])

    def sample(name, **labels):
        labels = {"runner": "scorer", "method": "predict", **labels}
        return samples[(name, tuple(sorted(labels.items())))]

    def outcome(name):
        return sample("labserve_requests_total", outcome=name)

    assert outcome("served") == snap.served == 4
    assert outcome("rejected") == snap.rejected == 2
    assert outcome("cancelled") == snap.cancelled == 1
    assert sample("labserve_queue_requests") == snap.queue_requests == 0
    assert sample("labserve_max_batch_size_items") == 4
    assert sample("labserve_max_latency_seconds") == 0.01
    assert sample("labserve_batches_total", reason="full") == 1
    # Histograms: the batch held 4 items; 4 requests served, each within 30 ms.
    assert sample("labserve_batch_size_items_bucket", le="2.0") == 0
    assert sample("labserve_batch_size_items_bucket", le="4.0") == 1
    assert sample("labserve_batch_size_items_sum") == 4
    assert sample("labserve_request_latency_seconds_count") == 4
    assert sample("labserve_request_latency_seconds_bucket", le="0.02") == 0
    assert sample("labserve_request_latency_seconds_bucket", le="0.05") == 4
    assert abs(sample("labserve_request_latency_seconds_sum") - snap.latency_sum_s) < 1e-9


def test_each_runner_method_gets_its_own_labels():
    q1, _ = traffic()
    q2 = BatchQueue("embed", Codec("embed"), BatchingConfig(), runner="scorer")
    samples = scrape([q1.snapshot(0.03), q2.snapshot(0.03)])
    served = {
        labels: v
        for (name, labels), v in samples.items()
        if name == "labserve_requests_total" and ("outcome", "served") in labels
    }
    assert served == {
        (("method", "embed"), ("outcome", "served"), ("runner", "scorer")): 0,
        (("method", "predict"), ("outcome", "served"), ("runner", "scorer")): 4,
    }
