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


def test_adaptive_holds_when_busy_with_a_ready_fit():
    cfg = config("adaptive")
    decision = decide(view(oldest=1.0), 1.0, cfg, READY, BUSY)
    assert isinstance(decision, Hold)
    assert 1.0 < decision.until_s <= 1.0 + cfg.max_latency_s


def test_adaptive_fires_idle_when_quiet():
    assert decide(view(oldest=1.0), 1.0, config("adaptive"), READY, QUIET) == Fire("idle")


def test_adaptive_fires_idle_without_a_ready_fit():
    assert decide(view(oldest=1.0), 1.0, config("adaptive"), NOT_READY, BUSY) == Fire("idle")


def test_adaptive_fires_idle_with_no_arrivals_seen():
    assert decide(view(oldest=1.0), 1.0, config("adaptive"), READY, (0.0, 0.0)) == Fire("idle")


def test_adaptive_fires_adaptive_once_its_hold_ends():
    cfg = config("adaptive")
    hold = decide(view(oldest=1.0), 1.0, cfg, READY, BUSY)
    assert isinstance(hold, Hold)
    held = view(oldest=1.0, hold_start=1.0, hold_until=hold.until_s)
    assert isinstance(decide(held, 1.0, cfg, READY, BUSY), Hold)
    assert decide(held, hold.until_s, cfg, READY, BUSY) == Fire("adaptive")


def test_adaptive_hold_only_shortens_as_requests_join():
    cfg = config("adaptive", max_batch_size=64)
    first = decide(view(oldest=1.0), 1.0, cfg, READY, BUSY)
    assert isinstance(first, Hold)
    later = decide(
        view(items=3, requests=3, oldest=1.0, hold_start=1.0, hold_until=first.until_s),
        1.0001,
        cfg,
        READY,
        BUSY,
    )
    assert isinstance(later, Fire) or later.until_s <= first.until_s


def test_adaptive_fires_at_once_under_steady_load():
    # 20 queued at 2000/s: the requests behind would lose more than the joiners save.
    cfg = config("adaptive", max_batch_size=64)
    assert decide(view(items=20, requests=20, oldest=1.0), 1.0, cfg, READY, BUSY) == Fire("idle")


def test_adaptive_never_holds_for_a_model_without_per_item_cost():
    # b = 0: joiners save the fixed cost, but every follower loses the hold; never pays.
    flat = CostFit(a_s=0.005, b_s=0.0, samples=64)
    assert decide(view(oldest=1.0), 1.0, config("adaptive"), flat, BUSY) == Fire("idle")


def test_adaptive_never_holds_while_another_slot_is_free():
    # Joiners would find a free slot and start at once: holding only delays.
    cfg = config("adaptive", max_concurrent_batches=2)
    free = HeadView(1, 1, 1.0, None, None, in_flight=0)
    busy = HeadView(1, 1, 1.0, None, None, in_flight=1)
    assert decide(free, 1.0, cfg, READY, BUSY) == Fire("idle")
    assert isinstance(decide(busy, 1.0, cfg, READY, BUSY), Hold)


def test_adaptive_with_an_expensive_model_holds_exactly_to_the_deadline():
    cfg = config("adaptive")
    # Joiners skip a second batch that costs a second plus a millisecond per follower:
    # holding pays far longer than the deadline allows.
    slow = CostFit(a_s=1.0, b_s=1e-3, samples=64)
    deadline = 1.0 + cfg.max_latency_s
    assert decide(view(oldest=1.0), 1.0, cfg, slow, BUSY) == Hold(deadline)
    held = view(oldest=1.0, hold_start=1.0, hold_until=deadline)
    assert decide(held, deadline, cfg, slow, BUSY) == Fire("timeout")


def test_adaptive_decisions_never_reach_past_the_oldest_deadline():
    rng = np.random.default_rng(2024)
    for _ in range(2000):
        cfg = config(
            "adaptive",
            max_batch_size=int(rng.integers(1, 65)),
            max_latency_ms=float(rng.uniform(0, 50)),
        )
        fit = CostFit(float(rng.uniform(0, 0.1)), float(rng.uniform(0, 1e-3)), 64)
        rate = float(10 ** rng.uniform(0, 5))
        items = int(rng.integers(1, cfg.max_batch_size + 1))
        oldest = float(rng.uniform(0, 10))
        now = oldest + float(rng.uniform(0, 0.06))
        hold_start = None if rng.random() < 0.5 else float(rng.uniform(oldest, now))
        d = decide(view(items, items, oldest, hold_start, None), now, cfg, fit, (rate, rate * 1.5))
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
