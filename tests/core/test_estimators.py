import numpy as np
import pytest

from labserve.batching.estimators import CostModel, RateEstimator

A_S, B_S = 0.002, 0.0001  # 2 ms per call + 0.1 ms per item


def feed_linear(model, rng, n, a_s=A_S, b_s=B_S, noise_s=5e-5, max_items=64):
    """Observe ``n`` batches of random sizes costing ``a_s + b_s * items`` plus noise."""
    for items in rng.integers(1, max_items + 1, size=n):
        model.observe(int(items), a_s + b_s * items + rng.normal(0.0, noise_s))


def test_cost_model_recovers_intercept_and_slope_from_noisy_linear_data():
    model = CostModel()
    feed_linear(model, np.random.default_rng(0), 128)
    fit = model.fit
    assert fit.samples == 128
    assert fit.a_s == pytest.approx(A_S, rel=0.03)
    assert fit.b_s == pytest.approx(B_S, rel=0.03)
    assert fit.predict_s(32) == pytest.approx(A_S + B_S * 32, rel=0.01)


@pytest.mark.parametrize("stall_items", [1, 32, 64])
def test_one_stalled_batch_barely_moves_the_fit(stall_items):
    rng = np.random.default_rng(stall_items)
    model = CostModel()
    feed_linear(model, rng, 60)
    model.observe(stall_items, 0.5)  # a 500 ms GC pause among ~5 ms batches
    feed_linear(model, rng, 67)  # 128 observations: a refit includes the stall
    fit = model.fit
    assert fit.samples == 128
    assert fit.a_s == pytest.approx(A_S, rel=0.05)
    assert fit.b_s == pytest.approx(B_S, rel=0.05)


def test_a_single_batch_size_gives_slope_zero_and_the_median_cost():
    model = CostModel()
    durations = [0.004, 0.005, 0.0045, 0.006, 0.0042, 0.0051, 0.0048, 0.0047]
    for d in durations:
        model.observe(16, d)
    assert model.fit.b_s == 0.0
    assert model.fit.a_s == pytest.approx(float(np.median(durations)))


def test_fit_is_ready_only_after_enough_batches():
    model = CostModel()
    for i in range(3):
        model.observe(i + 1, A_S + B_S * (i + 1))
        assert not model.fit.ready
    model.observe(4, A_S + B_S * 4)
    assert model.fit.ready


def test_fit_never_goes_negative():
    model = CostModel()
    for items in range(1, 17):
        model.observe(items, 0.01 - 0.0005 * items)  # cost falling with items
    assert model.fit.b_s >= 0.0
    assert model.fit.a_s >= 0.0


def test_cost_model_forgets_batches_older_than_its_window():
    rng = np.random.default_rng(3)
    model = CostModel(window=64)
    feed_linear(model, rng, 64, a_s=0.010, b_s=0.001)
    feed_linear(model, rng, 64)  # the model got faster: a full window of new data
    assert model.fit.a_s == pytest.approx(A_S, rel=0.05)
    assert model.fit.b_s == pytest.approx(B_S, rel=0.05)
    items, durations = model.observations()
    assert len(items) == len(durations) == 64


def test_observations_are_oldest_first():
    model = CostModel(window=4)
    for i in range(1, 7):
        model.observe(i, i / 1000)
    items, durations = model.observations()
    np.testing.assert_array_equal(items, [3, 4, 5, 6])
    np.testing.assert_allclose(durations, [0.003, 0.004, 0.005, 0.006])


def poisson_arrivals(rng, rate, duration_s):
    times = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * duration_s * 1.5)))
    return times[times < duration_s]


@pytest.mark.parametrize("rate", [200.0, 2000.0])
def test_rate_estimator_converges_to_a_constant_poisson_rate(rate):
    rng = np.random.default_rng(int(rate))
    est = RateEstimator()
    arrivals = poisson_arrivals(rng, rate, 6.0)
    checkpoints = iter(np.arange(1.0, 6.0, 0.5))
    check = next(checkpoints)
    for t in arrivals:
        while check is not None and t > check:
            requests, items = est.rates(check)
            assert requests == pytest.approx(rate, rel=0.10 if rate > 1000 else 0.25)
            assert items == pytest.approx(requests * 3)
            check = next(checkpoints, None)
        est.observe(float(t), 3)


def test_rate_estimate_averages_to_the_true_rate():
    rng = np.random.default_rng(11)
    rate = 500.0
    est = RateEstimator()
    arrivals = poisson_arrivals(rng, rate, 20.0)
    samples = []
    checkpoints = list(np.arange(1.0, 20.0, 0.1))
    i = 0
    for t in arrivals:
        while i < len(checkpoints) and t > checkpoints[i]:
            samples.append(est.rates(checkpoints[i])[0])
            i += 1
        est.observe(float(t), 1)
    assert np.mean(samples) == pytest.approx(rate, rel=0.03)


def test_rate_estimate_is_not_biased_low_soon_after_start():
    est = RateEstimator(tau_s=0.25)
    for i in range(100):  # 1000 req/s for 0.1 s
        est.observe(i / 1000, 1)
    assert est.rates(0.1)[0] == pytest.approx(1000.0, rel=0.1)


def test_rate_estimate_decays_when_arrivals_stop():
    est = RateEstimator(tau_s=0.25)
    for i in range(2000):
        est.observe(i / 1000, 1)
    busy = est.rates(2.0)[0]
    assert est.rates(3.0)[0] < busy * 0.05


def test_rate_is_zero_before_any_arrival():
    assert RateEstimator().rates(5.0) == (0.0, 0.0)


def test_observe_each_is_observe_per_arrival_to_the_last_bit():
    times = np.cumsum(np.random.default_rng(4).exponential(1e-3, 500)).tolist()
    one, each = RateEstimator(), RateEstimator()
    for t in times:
        one.observe(t, 3)
    each.observe_each(times[:1], 3)
    each.observe_each(times[1:200], 3)
    each.observe_each([], 3)
    each.observe_each(times[200:], 3)
    for now in (times[-1], times[-1] + 0.1):
        assert one.rates(now) == each.rates(now)


def test_refit_median_matches_numpy():
    from labserve.batching.estimators import _median

    rng = np.random.default_rng(5)
    for n in range(1, 130):
        v = rng.normal(size=n) * 1e-3
        assert _median(v) == float(np.median(v))


def _plain_refit(items, durations):
    """The cost fit as first written (numpy's median, a gathered window): the reference."""
    from labserve.batching.estimators import _line

    x, y = np.asarray(items, dtype=float), np.asarray(durations, dtype=float)
    a, b = _line(x, y)
    residuals = y - (a + b * x)
    deviations = np.abs(residuals - np.median(residuals))
    spread = max(1.4826 * float(np.median(deviations)), 0.05 * float(np.median(y)))
    keep = deviations <= 3.0 * spread
    if 2 <= np.count_nonzero(keep) < len(x):
        a, b = _line(x[keep], y[keep])
    return a, b, len(x)


@pytest.mark.parametrize("noise_s", [0.0, 5e-6, 5e-4])
def test_the_fit_is_bit_identical_to_the_plain_refit_on_every_window(noise_s):
    rng = np.random.default_rng(int(noise_s * 1e7))
    model = CostModel(window=16, refit_every=1)
    seen_i, seen_d = [], []
    for k in range(300):
        items = int(rng.integers(1, 9)) if k % 50 < 40 else 4  # some windows of one size
        duration = A_S + B_S * items + (rng.normal(0.0, noise_s) if noise_s else 0.0)
        if k % 37 == 0:
            duration *= 50  # a stall: left out of the refit
        model.observe(items, duration)
        seen_i.append(items)
        seen_d.append(duration)
        fit = model.fit
        assert (fit.a_s, fit.b_s, fit.samples) == _plain_refit(seen_i[-16:], seen_d[-16:])
        x, y = model.observations()
        assert x.tolist() == seen_i[-16:] and y.tolist() == seen_d[-16:]


def test_the_line_is_bit_identical_to_the_plain_least_squares():
    from labserve.batching.estimators import _line

    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 7, 16, 128):
        for distinct in (1, 2, 5):
            x = rng.choice(rng.integers(1, 65, size=distinct), size=n).astype(float)
            y = A_S + B_S * x + rng.normal(0.0, 1e-4, size=n)
            if x.min() == x.max():
                expected = (float(np.median(y)), 0.0)
            else:
                x_mean, y_mean = x.sum() / n, y.sum() / n
                dx = x - x_mean
                b = float(dx @ (y - y_mean) / (dx @ dx))
                a = float(y_mean - b * x_mean)
                if b < 0:
                    expected = (float(np.median(y)), 0.0)
                elif a < 0:
                    expected = (0.0, float(np.median(y / x)))
                else:
                    expected = (a, b)
            assert _line(x, y) == expected


@pytest.mark.parametrize("fold_every", [None, 1, 7, 4096])
def test_bulk_arrivals_fold_in_order_to_the_same_bits_as_one_at_a_time(fold_every):
    rng = np.random.default_rng(5)
    times = np.cumsum(rng.exponential(0.002, 500)).tolist()
    one, bulk = RateEstimator(), RateEstimator(fold_every=fold_every)
    k = 0
    for size in [1, 3, 50, 2, 120, 1, 200, 40, 83]:
        chunk = times[k : k + size]
        k += size
        for t in chunk:
            one.observe(t, 2)
        bulk.observe_each(chunk, 2)
        if size == 2:  # a single admission between bulk ones folds what came before first
            one.observe(chunk[-1], 4, 2)
            bulk.observe(chunk[-1], 4, 2)
        assert bulk.rates(chunk[-1] + 0.001) == one.rates(chunk[-1] + 0.001)
    assert RateEstimator(fold_every=None).rates(1.0) == (0.0, 0.0)


# -- a per-token term (a method with a ragged axis) --------------------------------------


def _padded_batches(model, n=64, seed=0, widths=(4, 16, 64, 128)):
    rng = np.random.default_rng(seed)
    cost = CostModel(window=n)
    for _ in range(n):
        items = int(rng.integers(1, 33))
        width = int(rng.choice(widths))
        cost.observe(items, model(items, items * width), items * width)
    return cost


def test_the_fit_recovers_a_per_token_cost_beside_the_per_item_one():
    fit = _padded_batches(lambda n, t: 0.002 + 0.0001 * n + 0.00001 * t).fit
    assert fit.a_s == pytest.approx(0.002, rel=1e-6)
    assert fit.b_s == pytest.approx(0.0001, rel=1e-6)
    assert fit.c_s == pytest.approx(0.00001, rel=1e-6)
    # Asked about items alone, each item is priced at the mean width seen.
    assert fit.width > 4
    assert fit.predict_s(10) == pytest.approx(0.002 + 10 * (0.0001 + 0.00001 * fit.width))
    assert fit.predict_s(10, 10 * 128) == pytest.approx(0.002 + 0.001 + 0.0128)


def test_one_stalled_padded_batch_does_not_drag_the_token_fit():
    def model(n, t):
        return 0.002 + 0.00001 * t

    cost = _padded_batches(model)
    cost.observe(8, 5.0, 8 * 16)  # a 5 s stall
    for _ in range(8):
        cost.observe(8, model(8, 128), 128)
    fit = cost.fit
    assert fit.c_s == pytest.approx(0.00001, rel=1e-3)
    assert fit.predict_s(8, 8 * 16) < 0.01


def test_with_one_width_tokens_add_nothing_and_the_item_line_is_kept():
    fit = _padded_batches(lambda n, t: 0.001 + 0.0004 * n, widths=(32,)).fit
    assert (fit.c_s, fit.width) == (0.0, 32.0)
    assert fit.b_s == pytest.approx(0.0004, rel=1e-6)


def test_a_method_without_tokens_keeps_the_plain_fit():
    cost = CostModel(refit_every=1)
    for n in (1, 2, 4, 8, 16):
        cost.observe(n, 0.001 + 0.0002 * n)
    fit = cost.fit
    assert (fit.c_s, fit.width) == (0.0, 0.0)
    assert fit.item_s == fit.b_s == pytest.approx(0.0002)


def test_old_padded_batches_leave_the_window():
    cost = CostModel(window=8, refit_every=1)
    for n in range(1, 9):
        cost.observe(n, 0.001 + 0.00001 * n * 64, n * 64)
    assert cost.fit.width == 64.0
    for n in range(1, 9):
        cost.observe(n, 0.001 + 0.0002 * n)  # the same method, no ragged axis now
    assert (cost.fit.c_s, cost.fit.width) == (0.0, 0.0)
