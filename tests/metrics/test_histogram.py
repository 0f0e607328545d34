import math

import numpy as np
import pytest

from labserve.metrics.histogram import LogHistogram

QS = (50.0, 95.0, 99.0, 99.9)


def lognormal(seed, n=10_000):
    return np.random.default_rng(seed).lognormal(mean=math.log(0.005), sigma=0.8, size=n)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_percentiles_are_within_one_percent_of_numpy(seed):
    samples = lognormal(seed)
    hist = LogHistogram()
    hist.add_many(samples)
    for got, want in zip(hist.percentiles(QS), np.percentile(samples, QS), strict=True):
        assert got == pytest.approx(want, rel=0.01)


def test_add_and_add_many_agree():
    samples = lognormal(5, n=2000)
    one, many = LogHistogram(), LogHistogram()
    for v in samples:
        one.add(float(v))
    many.add_many(samples)
    np.testing.assert_array_equal(one.counts, many.counts)
    assert one.total == many.total == len(samples)


def test_values_outside_the_range_land_in_the_end_buckets():
    hist = LogHistogram(low=1e-3, high=1.0)
    hist.add_many(np.array([0.0, 1e-9, 5.0, 1e9]))
    hist.add(-1.0)
    assert hist.counts[0] == 3
    assert hist.counts[-1] == 2
    assert hist.total == 5


def test_an_empty_histogram_has_nan_percentiles():
    assert all(math.isnan(v) for v in LogHistogram().percentiles(QS))


def test_memory_is_fixed_however_many_values_are_added():
    hist = LogHistogram()
    size = hist.counts.size
    for seed in range(5):
        hist.add_many(lognormal(seed))
    assert hist.counts.size == size
    assert hist.total == 50_000


def test_copy_is_independent():
    hist = LogHistogram()
    hist.add_many(lognormal(0, n=100))
    snap = hist.copy()
    hist.add_many(lognormal(1, n=100))
    assert snap.total == 100
    assert snap.counts.sum() == 100
    assert hist.total == 200
