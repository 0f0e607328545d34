import numpy as np
import pytest

from labserve.batching.estimators import CostFit
from labserve.batching.policy import Fire, HeadView, Hold, decide
from labserve.config.batching import BatchingConfig

READY = CostFit(a_s=0.005, b_s=0.0001, samples=64)  # 5 ms per call, 0.1 ms per item
NOT_READY = CostFit(a_s=0.005, b_s=0.0001, samples=3)
BUSY = (2000.0, 2000.0)  # requests/s, items/s
QUIET = (5.0, 5.0)


def view(items=1, requests=1, oldest=0.0, hold_start=None, hold_until=None):
    return HeadView(items, requests, oldest, hold_start, hold_until)


def config(strategy, **settings):
    settings.setdefault("max_batch_size", 8)
    settings.setdefault("max_latency_ms", 10)
    return BatchingConfig(strategy=strategy, **settings)


@pytest.mark.parametrize("strategy", ["fixed", "adaptive"])
def test_holding_strategies_fire_full_at_the_cap(strategy):
    cfg = config(strategy)
    assert decide(view(items=8, requests=3), 0.0, cfg, READY, BUSY) == Fire("full")
    assert decide(view(items=20, requests=1), 0.0, cfg, READY, BUSY) == Fire("full")


def test_fixed_holds_until_the_oldest_request_has_waited_max_latency():
    cfg = config("fixed")
    oldest = 1.25
    deadline = oldest + cfg.max_latency_s
    # ... or until it fills: arrivals below the cap leave the decision as it is.
    hold = Hold(deadline, until_items=8)
    assert decide(view(items=3, oldest=oldest), oldest, cfg, READY, BUSY) == hold
    just_before = np.nextafter(deadline, 0.0)
    assert decide(view(items=3, oldest=oldest), just_before, cfg, READY, BUSY) == hold
    assert decide(view(items=3, oldest=oldest), deadline, cfg, READY, BUSY) == Fire("timeout")


def test_fixed_with_zero_latency_fires_at_once():
    cfg = config("fixed", max_latency_ms=0)
    assert decide(view(oldest=2.0), 2.0, cfg, READY, BUSY) == Fire("timeout")


@pytest.mark.parametrize("strategy", ["greedy", "off"])
def test_non_holding_strategies_fire_at_once(strategy):
    cfg = config(strategy)
    assert decide(view(items=1), 0.0, cfg, READY, BUSY) == Fire("idle")
    assert decide(view(items=8, requests=8), 0.0, cfg, READY, BUSY) == Fire("full")


def test_disabled_batching_never_holds():
    cfg = config("fixed", enabled=False)
    assert decide(view(items=1), 0.0, cfg, READY, BUSY) == Fire("idle")


def test_adaptive_without_a_target_decides_exactly_as_greedy():
    rng = np.random.default_rng(7)
    for _ in range(2000):
        cap = int(rng.integers(1, 65))
        kwargs = {"max_batch_size": cap, "max_latency_ms": float(rng.uniform(0, 50))}
        fit = CostFit(float(rng.uniform(0, 0.1)), float(rng.uniform(0, 1e-3)), 64)
        rate = float(10 ** rng.uniform(0, 5))
        items = int(rng.integers(1, cap + 1))
        oldest = float(rng.uniform(0, 10))
        now = oldest + float(rng.uniform(0, 0.06))
        seen = view(items, items, oldest, None, None)
        assert decide(seen, now, config("adaptive", **kwargs), fit, (rate, rate)) == decide(
            seen, now, config("greedy", **kwargs), fit, (rate, rate)
        )


def test_adaptive_target_decisions_never_reach_past_the_oldest_deadline():
    rng = np.random.default_rng(2024)
    for _ in range(2000):
        cfg = config(
            "adaptive",
            max_batch_size=int(rng.integers(1, 65)),
            max_latency_ms=float(rng.uniform(0, 50)),
            latency_slo_ms=float(rng.uniform(1, 100)),
        )
        fit = CostFit(float(rng.uniform(0, 0.1)), float(rng.uniform(0, 1e-3)), 64)
        rate = float(10 ** rng.uniform(0, 5))
        items = int(rng.integers(1, cfg.max_batch_size + 1))
        oldest = float(rng.uniform(0, 10))
        now = oldest + float(rng.uniform(0, 0.06))
        hold_start = None if rng.random() < 0.5 else float(rng.uniform(oldest, now))
        seen = view(items, items, oldest, hold_start, None)
        d = decide(seen, now, cfg, fit, (rate, rate * 1.5), cfg.latency_slo_s)
        deadline = oldest + cfg.max_latency_s
        if now >= deadline or items >= cfg.max_batch_size:
            assert isinstance(d, Fire)
        if isinstance(d, Hold):
            assert now < d.until_s <= deadline
        else:
            assert d.reason in ("full", "timeout", "adaptive", "idle")


# -- the latency target ------------------------------------------------------------------

FIT = CostFit(a_s=0.002, b_s=0.0001, samples=64)  # 2 ms per call, 0.1 ms per item


def test_a_target_holds_until_the_oldest_requests_predicted_latency_reaches_it():
    cfg = config("adaptive", max_batch_size=64, max_latency_ms=20, latency_slo_ms=15)
    # 4 items queued, the oldest arrived 1 ms ago, 2000 items/s arriving. Firing at t, the
    # oldest takes (t - t0) + 2 ms + 0.1 ms * (4 + 2000 * (t - now)): 15 ms when the hold
    # is (15 - 1 - 2.4) / 1.2 = 9.67 ms.
    decision = decide(view(items=4, oldest=0.0), 0.001, cfg, FIT, (2000.0, 2000.0), 0.015)
    assert isinstance(decision, Hold)
    assert decision.until_s == pytest.approx(0.001 + 0.0116 / 1.2)
    assert decision.until_items == 4 + int(2000 * 0.0116 / 1.2) + 1  # more: decide again


def test_a_target_fires_at_once_when_the_prediction_already_misses_it():
    cfg = config("adaptive", max_batch_size=64, max_latency_ms=20, latency_slo_ms=15)
    late = view(items=40, oldest=0.0)  # 9 ms waited; 2 + 4 ms to run: only 0 ms to spare
    assert decide(late, 0.009, cfg, FIT, (2000.0, 2000.0), 0.015) == Fire("idle")
    holding = view(items=40, oldest=0.0, hold_start=0.001, hold_until=0.02)
    assert decide(holding, 0.009, cfg, FIT, (2000.0, 2000.0), 0.015) == Fire("adaptive")


def test_a_target_never_holds_past_the_wait_cap_or_a_full_batch():
    cfg = config("adaptive", max_batch_size=8, max_latency_ms=5, latency_slo_ms=50)
    decision = decide(view(items=2, oldest=0.0), 0.0, cfg, FIT, (100.0, 100.0), 0.050)
    assert decision == Hold(0.005, 3)  # the 5 ms cap comes first
    assert decide(view(items=8), 0.0, cfg, FIT, (100.0, 100.0), 0.050) == Fire("full")


def test_a_target_fires_like_greedy_until_the_cost_is_known():
    cfg = config("adaptive", max_batch_size=64, max_latency_ms=20, latency_slo_ms=15)
    unknown = CostFit(0.002, 0.0001, samples=2)
    assert decide(view(items=2), 0.0, cfg, unknown, (2000.0, 2000.0), 0.015) == Fire("idle")
