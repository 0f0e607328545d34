"""The padded simulator: lengths per arrival, batches costed by padded tokens."""

import numpy as np
import pytest

from labserve.config.batching import BatchingConfig
from labserve.lab.surface import TokenCost
from labserve.sim.ragged import simulate_ragged

COST = TokenCost(fixed_ms=2.0, per_item_ms=0.05, per_token_ms=0.01)


def run(lengths, rate=500.0, seed=0, **settings):
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=len(lengths)))
    config = BatchingConfig(**{"strategy": "fixed", "max_latency_ms": 10, **settings})
    return simulate_ragged(
        times, np.asarray(lengths), cost=COST, config=config, duration_s=float(times[-1])
    )


def skewed(n, seed=1):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(16), 0.9, n).astype(int), 1, 512)


def test_one_length_wastes_no_padding():
    s = run([20] * 2000).summary()
    assert s["padding_pct"] == 0.0
    assert s["tokens_per_batch"] == pytest.approx(20 * s["mean_batch"])


def test_a_skewed_mix_padded_to_the_longest_wastes_most_of_its_tokens():
    r = run(skewed(3000))
    s = r.summary()
    assert s["padding_pct"] > 50
    # Each batch's padding: its items x its longest, less the true tokens.
    assert (r.batch_padding_tokens < r.batch_tokens).all()
    assert r.batch_tokens.sum() == pytest.approx(s["tokens_per_batch"] * s["batches"])


def test_the_same_seed_gives_the_same_run():
    a, b = run(skewed(1000)), run(skewed(1000))
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    np.testing.assert_array_equal(a.batch_tokens, b.batch_tokens)


def test_every_request_gets_one_outcome_and_the_batch_cost_is_the_token_cost():
    r = run(skewed(1500), rate=2000.0)
    assert (r.outcome >= 0).all()
    for items, tokens, took in zip(r.batch_items, r.batch_tokens, r.batch_duration_s, strict=True):
        assert took == pytest.approx(COST.seconds(int(items), int(tokens)))


def test_simulate_draws_lengths_and_length_aware_batching_cuts_the_padding():
    import labserve

    def point(**settings):
        result = labserve.simulate(
            labserve.arrivals("poisson", rate_rps=300),
            duration_s=10,
            input_len="lognormal:16:128",
            cost=COST,
            strategy="fixed",
            max_batch_size=64,
            max_latency_ms=20,
            **settings,
        )
        return result.summary()

    longest = point()
    buckets = point(length_buckets=[16, 32, 64, 128])
    exact = point(padding=False)
    assert longest["padding_pct"] > 50
    assert buckets["padding_pct"] < longest["padding_pct"] / 2
    assert exact["padding_pct"] == 0.0
    assert exact["mean_batch"] < buckets["mean_batch"] < longest["mean_batch"]


def test_simulate_with_lengths_needs_a_cost_that_prices_tokens():
    import labserve

    with pytest.raises(TypeError, match="cost must price"):
        labserve.simulate([0.0, 0.1], input_len=16, cost=(2.0, 0.1))


def test_sweep_takes_buckets_budgets_and_padding():
    from labserve.lab.sweep import sweep

    rows = sweep(
        rates=[300],
        strategies=["fixed"],
        max_batch_size=[64],
        max_latency_ms=[20],
        length_buckets=[[], [16, 32, 64, 128]],
        max_batch_tokens=[0, 1024],
        input_len="lognormal:16:128",
        cost=COST,
        duration_s=5,
    )
    assert [(r["length_buckets"], r["max_batch_tokens"]) for r in rows] == [
        ([], 0),
        ([], 1024),
        ([16, 32, 64, 128], 0),
        ([16, 32, 64, 128], 1024),
    ]
    assert all("padding_pct" in r for r in rows)
    assert rows[2]["padding_pct"] < rows[0]["padding_pct"]
    with pytest.raises(TypeError, match="give input_len"):
        sweep(rates=[100], max_batch_tokens=[512], duration_s=1)
