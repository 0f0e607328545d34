import math

import numpy as np
import pytest

from labserve.metrics.recorder import Recorder
from labserve.metrics.snapshot import BatchRecord

QS = (50.0, 95.0, 99.0, 99.9)


def serve(rec, now, latencies_s, waits_s=None):
    """Record requests answered at ``now`` with the given latencies (and queue waits)."""
    latencies_s = np.asarray(latencies_s, dtype=float)
    waits_s = latencies_s / 2 if waits_s is None else np.asarray(waits_s, dtype=float)
    arrivals = now - latencies_s
    rec.served(now, arrivals.tolist(), (arrivals + waits_s).tolist())


def lognormal(seed, n):
    return np.random.default_rng(seed).lognormal(mean=np.log(0.004), sigma=0.7, size=n)


def test_window_percentiles_equal_numpys_on_the_same_samples():
    rec = Recorder(window_s=10.0)
    lat = lognormal(0, 3000)
    for i, chunk in enumerate(np.array_split(lat, 30)):
        serve(rec, 100.0 + i * 0.1, chunk)
    lat_w, wait_w = rec.window_percentiles(103.0)
    np.testing.assert_allclose(lat_w, np.percentile(lat, QS) * 1000, rtol=1e-9)
    np.testing.assert_allclose(wait_w, np.percentile(lat / 2, QS) * 1000, rtol=1e-9)


def test_window_percentiles_leave_out_requests_served_before_the_window():
    rec = Recorder(window_s=10.0)
    serve(rec, 1.0, np.full(500, 2.0))  # slow, long ago
    recent = lognormal(1, 500)
    serve(rec, 20.0, recent)
    lat_w, _ = rec.window_percentiles(20.5)
    np.testing.assert_allclose(lat_w, np.percentile(recent, QS) * 1000, rtol=1e-9)
    lat_all, _ = rec.overall_percentiles()
    assert lat_all.p99 == pytest.approx(2000.0, rel=0.01)


def test_overall_percentiles_are_within_one_percent_of_numpys():
    rec = Recorder(window_s=1.0, capacity=1024)  # the window keeps only a fraction
    lat = lognormal(2, 10_000)
    waits = lat * np.random.default_rng(3).uniform(0.1, 0.9, size=lat.size)
    for i, k in enumerate(range(0, lat.size, 100)):
        serve(rec, 10.0 + i, lat[k : k + 100], waits[k : k + 100])
    lat_o, wait_o = rec.overall_percentiles()
    for got, want in zip(lat_o, np.percentile(lat, QS) * 1000, strict=True):
        assert got == pytest.approx(want, rel=0.01)
    for got, want in zip(wait_o, np.percentile(waits, QS) * 1000, strict=True):
        assert got == pytest.approx(want, rel=0.01)


def test_empty_recorder_has_nan_percentiles():
    rec = Recorder()
    lat_w, wait_w = rec.window_percentiles(1.0)
    lat_o, _ = rec.overall_percentiles()
    assert all(math.isnan(v) for v in (*lat_w, *wait_w, *lat_o))


def test_sample_rings_keep_their_size_and_the_latest_samples():
    rec = Recorder(window_s=1000.0, capacity=1000, batch_capacity=20)
    sizes = (rec._latency.size, rec._wait.size, rec._finish.size, len(rec._batches))
    lat = lognormal(4, 25_000)
    for i, k in enumerate(range(0, lat.size, 700)):
        serve(rec, 1.0 + i, lat[k : k + 700])
        rec.batch(BatchRecord(1.0 + i, 0.001, 7, 7, "full"))
    assert (rec._latency.size, rec._wait.size, rec._finish.size, len(rec._batches)) == sizes
    lat_w, _ = rec.window_percentiles(100.0)
    np.testing.assert_allclose(lat_w, np.percentile(lat[-1000:], QS) * 1000, rtol=1e-9)
    assert len(rec.batch_records()) == 20
    assert rec.batches == math.ceil(lat.size / 700)


def test_a_burst_larger_than_the_ring_keeps_its_latest_samples():
    rec = Recorder(window_s=10.0, capacity=100)
    lat = lognormal(5, 1000)
    serve(rec, 1.0, lat)
    lat_w, _ = rec.window_percentiles(1.0)
    np.testing.assert_allclose(lat_w, np.percentile(lat[-100:], QS) * 1000, rtol=1e-9)


def test_batch_records_are_oldest_first_and_bounded():
    rec = Recorder(batch_capacity=4)
    for i in range(10):
        rec.batch(BatchRecord(float(i), 0.001, i + 1, 1, "idle"))
    assert [r.items for r in rec.batch_records()] == [7, 8, 9, 10]
    assert [r.items for r in rec.batch_records(last=2)] == [9, 10]
    assert rec.batch_size_counts == {i + 1: 1 for i in range(10)}
    assert rec.fire_reasons == {"idle": 10}


def test_rates_over_the_window_match_a_steady_stream():
    rec = Recorder(window_s=10.0)
    rate = 120.0
    for i in range(int(30 * rate)):
        t = i / rate
        rec.arrived(t)
        if i % 4 == 0:
            rec.rejected(t)
    rates = rec.rates(30.0)
    assert rates["arrived"] == pytest.approx(rate, rel=0.02)
    assert rates["rejected"] == pytest.approx(rate / 4, rel=0.02)
    assert rates["served"] == 0.0


def test_rates_early_on_are_over_the_time_elapsed_not_the_whole_window():
    rec = Recorder(window_s=10.0)
    for i in range(100):
        rec.arrived(5.0 + i / 100)  # 100/s for one second
    assert rec.rates(6.0)["arrived"] == pytest.approx(100.0, rel=0.02)


def test_rates_fall_to_zero_once_traffic_is_older_than_the_window():
    rec = Recorder(window_s=10.0)
    for i in range(1000):
        rec.arrived(i / 100)
    assert rec.rates(10.0)["arrived"] > 0
    assert rec.rates(21.0)["arrived"] == 0.0


def test_counted_failures_and_serves_feed_their_rates_and_counters():
    rec = Recorder(window_s=10.0)
    rec.failed(1.0, 3)
    serve(rec, 1.0, [0.01, 0.02])
    rec.cancelled(1.0)
    rec.refused(1.0)
    rec.timed_out(1.0)
    assert rec.counters() == {
        "arrived": 0,
        "served": 2,
        "rejected": 0,
        "failed": 3,
        "cancelled": 1,
        "refused": 1,
        "timeout": 1,
    }
    rates = rec.rates(2.0)
    assert rates["failed"] == pytest.approx(3.0)
    assert rates["served"] == pytest.approx(2.0)


def test_window_mean_batch_counts_only_batches_in_the_window():
    rec = Recorder(window_s=10.0)
    rec.batch(BatchRecord(0.0, 0.001, 100, 1, "full"))
    rec.batch(BatchRecord(15.0, 0.001, 2, 1, "idle"))
    rec.batch(BatchRecord(16.0, 0.001, 4, 1, "idle"))
    assert rec.window_mean_batch(20.0) == pytest.approx(3.0)
    assert math.isnan(Recorder().window_mean_batch(1.0))


def test_reset_forgets_everything():
    rec = Recorder()
    rec.arrived(0.0)
    serve(rec, 0.1, [0.05])
    rec.batch(BatchRecord(0.0, 0.1, 1, 1, "idle"))
    rec.reset()
    assert set(rec.counters().values()) == {0}
    assert rec.batches == 0
    assert rec.batch_records() == []
    assert math.isnan(rec.overall_percentiles()[0].p50)


def test_batches_filed_later_give_the_same_figures_as_batches_filed_at_once():
    """Served batches are filed in bulk (at a read or every so many requests): no figure moves."""
    lat = lognormal(7, 64 * 40)
    small = lognormal(8, 40 * 3)
    lazy, eager = Recorder(window_s=2.0, capacity=1000), Recorder(window_s=2.0, capacity=1000)
    for i in range(40):
        now = 1.0 + i * 0.1
        for rec in (lazy, eager):
            serve(rec, now, lat[i * 64 : (i + 1) * 64])  # large: may wait to be filed
            serve(rec, now, small[i * 3 : (i + 1) * 3])  # small: filed after the large
        eager.window_percentiles(now)  # a read files everything at once
    assert lazy._unfiled, "a batch of 64 waits to be filed"
    for a, b in zip(
        lazy.window_percentiles(5.0) + lazy.overall_percentiles(),
        eager.window_percentiles(5.0) + eager.overall_percentiles(),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    assert lazy.latency_sum_s == pytest.approx(eager.latency_sum_s, rel=1e-12)
    assert lazy.buckets() == eager.buckets()
    assert lazy.slo_met(5.0, 0.004) == eager.slo_met(5.0, 0.004)
    assert not lazy._unfiled
