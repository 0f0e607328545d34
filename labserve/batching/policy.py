"""The strategies: when to fire the batch at the head of the queue.

A strategy looks at one group of compatible requests while a batch slot is free and
answers :class:`Fire` (with the reason that will be recorded) or :class:`Hold` (until a
time; the driver sets one timer for it). Strategies are pure functions of what they are
shown; the queue forms the batch and keeps the hold state.

Reasons: ``full`` (the cap was reached), ``timeout`` (the oldest request waited
``max_latency_ms``), ``adaptive`` (the adaptive strategy held the batch open and its
model says holding longer no longer pays, or would miss the latency target), ``idle`` (a
slot was free and holding would not pay: fire what is queued), ``drain`` (the runner is
stopping).

``adaptive`` plans for a latency target (``latency_slo_ms``): it holds the batch open, to
make it larger and the model time per request smaller, until the oldest request's predicted
latency (its wait so far, the rest of the hold, and the fitted time of the batch it will
then be) reaches the target, and fires at once when it already would not hold. Without a
target it decides exactly as ``greedy``: measured side by side, an earlier hold rule (hold
when the cost model said a short wait saved more latency than it cost) almost never held
under Poisson load and its p99 was no better than greedy's (benchmarks/HISTORY.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from labserve.base.vocabulary import Reason
from labserve.batching.estimators import CostFit
from labserve.config.batching import BatchingConfig

__all__ = ["Decision", "Fire", "HeadView", "Hold", "decide"]

# A hold shorter than this is not worth a timer wake-up (seconds).
_MIN_HOLD_S = 50e-6


@dataclass(frozen=True, slots=True)
class Fire:
    """Fire the head group's batch now."""

    reason: Reason


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep the batch open until ``until_s`` unless something changes first."""

    until_s: float
    until_items: int | None = None
    """Arrivals leave the decision as it is while the group holds fewer items than this;
    None: any arrival may change it (ask again after each)."""


Decision = Fire | Hold

# Decisions are immutable: the firing ones are made once, not on every call.
_FULL, _IDLE, _TIMEOUT, _ADAPTIVE = Fire("full"), Fire("idle"), Fire("timeout"), Fire("adaptive")


@dataclass(slots=True)
class HeadView:
    """What a strategy sees of one group of stackable requests. Times in seconds."""

    items: int
    """Items queued in the group."""
    requests: int
    """Requests queued in the group."""
    oldest_arrival_s: float
    """Arrival time of the group's oldest queued request."""
    hold_start_s: float | None
    """When the current hold began (the first moment the batch could have fired), or None."""
    hold_until_s: float | None
    """The hold's end as decided so far, or None."""


def decide(
    view: HeadView,
    now: float,
    config: BatchingConfig,
    fit: CostFit,
    rates: tuple[float, float],
    budget_s: float = 0.0,
) -> Decision:
    """Decide for one group while a batch slot is free.

    ``rates`` is (requests/s, items/s) arriving. ``budget_s`` is the latency the adaptive
    strategy plans a request's latency to (its target, less what the queue learned it
    must keep in hand); 0 when there is no target. Never holds a request past
    ``max_latency_ms``: ``fixed`` and ``adaptive`` fire by then with reason ``timeout``.
    """
    strategy = config.effective_strategy
    if strategy == "off" or strategy == "greedy" or (strategy == "adaptive" and budget_s <= 0.0):
        return _FULL if view.items >= config.max_batch_size else _IDLE  # adaptive: no target
    if view.items >= config.max_batch_size:
        return _FULL
    deadline = view.oldest_arrival_s + config.max_latency_s
    if now >= deadline:
        return _TIMEOUT
    if strategy == "fixed":
        return Hold(deadline, config.max_batch_size)
    return _toward_target(view, now, deadline, fit, rates[1], budget_s, config.max_batch_size)


def _toward_target(
    view: HeadView,
    now: float,
    deadline: float,
    fit: CostFit,
    item_rate: float,
    budget_s: float,
    cap: int,
) -> Decision:
    """Hold while the oldest request's predicted latency stays within ``budget_s``.

    Firing at time t, the oldest request (arrived t0) takes (t - t0) + a + b*n(t), with
    n(t) = n + r_i*(t - now) items expected by then: it grows at 1 + b*r_i per second of
    hold. The latest t within the budget ends the hold; arrivals beyond what was expected
    shorten it (the decision is asked again once more items than planned have come).
    """
    holding = view.hold_start_s is not None
    if not fit.ready or item_rate <= 0.0:
        return _ADAPTIVE if holding else _IDLE
    slack = budget_s - (now - view.oldest_arrival_s) - fit.predict_s(view.items)
    if slack <= 0.0:
        return _ADAPTIVE if holding else _IDLE
    hold_s = slack / (1.0 + max(fit.item_s, 0.0) * item_rate)  # an item at the mean width
    until = min(now + hold_s, deadline)
    if view.hold_until_s is not None:
        until = min(until, view.hold_until_s)
    if until - now < _MIN_HOLD_S:
        return _ADAPTIVE if holding else _IDLE
    expected = view.items + int(item_rate * (until - now))
    return Hold(until, min(expected + 1, cap))
