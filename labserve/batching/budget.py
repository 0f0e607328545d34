"""The latency target's budget: what the adaptive strategy plans a request's latency to.

With a latency target (``latency_slo_ms``) the adaptive strategy (:mod:`.policy`) holds a
batch open while the oldest request's predicted latency stays within a budget. The budget
starts at the target and learns a margin from answered batches: what the cost model cannot
predict (the hand-off to the caller, cost jitter, arrivals beyond the expected). Each batch
whose oldest request missed the target lowers it by :data:`STEP` of the target; each hit
raises it by a smaller share, so that in balance misses are half as frequent as the
percentile (``slo_percentile``) allows. It never drops below :data:`MIN_FRACTION` of the
target nor rises above it. Sans-IO like the queue that owns it: times are given.
"""

from __future__ import annotations

from labserve.config.batching import BatchingConfig

__all__ = ["MIN_FRACTION", "STEP", "LatencyBudget"]

STEP = 0.05
"""How far one missed batch moves the budget, as a fraction of the target."""
MIN_FRACTION = 0.2
"""The lowest the budget goes, as a fraction of the target."""


class LatencyBudget:
    """The budget one queue plans to; 0 when the strategy in force has no target.

    >>> budget = LatencyBudget()
    >>> budget.use(BatchingConfig(latency_slo_ms=10.0))
    >>> budget.budget_s
    0.01
    >>> budget.answered(oldest_arrival_s=0.0, now=0.02)  # a miss: the margin grows
    >>> round(budget.budget_s, 6)
    0.009503
    """

    __slots__ = ("_miss_allowed", "budget_s", "target_s")

    def __init__(self) -> None:
        self.target_s = -1.0
        """The target planned for, in seconds (0: none; -1 before the first config)."""
        self.budget_s = 0.0
        """What a request's latency is planned to: the target less the learnt margin."""
        self._miss_allowed = 0.0

    def use(self, config: BatchingConfig) -> None:
        """Plan for ``config``'s target; a changed target is planned to afresh."""
        target = config.latency_slo_s if config.effective_strategy == "adaptive" else 0.0
        if target != self.target_s:
            self.target_s = target
            self.budget_s = target
        self._miss_allowed = (100.0 - config.slo_percentile) / 200.0

    def answered(self, oldest_arrival_s: float, now: float) -> None:
        """A batch whose oldest request arrived at ``oldest_arrival_s`` was answered at ``now``."""
        target = self.target_s
        if target <= 0.0:
            return
        missed = now - oldest_arrival_s > target
        step = STEP * target * (self._miss_allowed - missed)
        self.budget_s = min(max(self.budget_s + step, MIN_FRACTION * target), target)
