"""How the settings search judges one simulated point, and which points settings share.

A point is one setting at one rate: the share of requests meeting every target
(:func:`attained`, goodput over rate), decided early once its misses rule the rate out
(:class:`Verdict`), and shared with every setting that would run the same steps there
(:class:`SharedPoints`). :func:`~labserve.lab.generation.search.search_generation` and its
fleet twin (:mod:`labserve.lab.generation.fleet_search`) judge their points here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from labserve.config.generation import GenerationConfig
from labserve.generation.results import GenerationResult
from labserve.generation.sequence import Finished

__all__ = [
    "PACE_SLACK",
    "Point",
    "RunFacts",
    "SharedPoint",
    "SharedPoints",
    "Verdict",
    "attained",
    "bounded",
    "longest_want",
    "squeezed_poisson",
]


@dataclass(frozen=True)
class Point:
    """What one simulated rate gave: the share of requests meeting every target, the run."""

    attainment: float
    result: GenerationResult | None  # None: decided by the short probe alone


@dataclass(frozen=True)
class RunFacts:
    """What a run asked of the caps it ran under, from its steps.

    ``most_seqs``: the most sequences one step ran. ``seats_free``: no step ran as many as
    the run's cap while a sequence was left waiting (the seat check can only have held one
    back in such a step). ``demand``: the most tokens a step could have been asked for:
    its tokens, plus, when a sequence was left waiting, the most one waiting sequence asks
    (its prompt; after a preemption its prompt and outputs, recomputed); at least the
    longest prompt (chunking off refuses a longer one at admission).
    """

    most_seqs: int
    seats_free: bool
    demand: int

    @classmethod
    def of(
        cls, run: GenerationResult, config: GenerationConfig, prompts: np.ndarray, want: int
    ) -> RunFacts:
        """What ``run`` (under ``config``) asked of its caps; ``want``: :func:`longest_want`."""
        steps = run.steps
        longest = int(prompts.max(initial=0))
        if not len(steps):
            return cls(0, True, longest)
        waiting = steps.num_waiting > 0
        asked = steps.num_batched_tokens + want * waiting
        full = steps.num_seqs >= config.max_num_seqs
        return cls(
            most_seqs=int(steps.num_seqs.max()),
            seats_free=not bool((full & waiting).any()),
            demand=max(int(asked.max()), longest),
        )


class SharedPoints:
    """The points already simulated, shared by every setting of one search.

    Two settings that differ only in ``max_num_seqs``, ``max_num_batched_tokens`` and
    ``enable_chunked_prefill`` run the same steps at a rate when neither cap bound the
    run (:meth:`SharedPoint.serves`): every rule of the scheduler that reads them
    (``Scheduler._schedule_running``, ``_schedule_waiting``, admission, the decode runs'
    admissions) then decides alike, step by step, so the results are equal float for
    float, and a point of the one is the other's. Equal settings share a point outright.
    """

    def __init__(self) -> None:
        self._points: dict[tuple[GenerationConfig, float], list[SharedPoint]] = {}

    @staticmethod
    def family(config: GenerationConfig) -> GenerationConfig:
        """The setting with its caps blanked: the settings that may run alike share it."""
        return config.replace(max_num_seqs=1, max_num_batched_tokens=1, enable_chunked_prefill=True)

    def get(self, config: GenerationConfig, rate: float) -> Point | None:
        """A point simulated for a setting that runs alike at this rate, or None."""
        for entry in self._points.get((self.family(config), rate), ()):
            if entry.serves(config):
                return entry.point
        return None

    def put(self, config: GenerationConfig, rate: float, facts: RunFacts, point: Point) -> None:
        """Keep a point and what its run asked of the caps."""
        entry = SharedPoint(config, facts, point)
        self._points.setdefault((self.family(config), rate), []).append(entry)


@dataclass(frozen=True)
class SharedPoint:
    """A point kept for sharing: the setting it ran, what its run asked of the caps."""

    config: GenerationConfig
    facts: RunFacts
    point: Point

    def serves(self, other: GenerationConfig) -> bool:
        """Whether ``other`` runs the same steps as this entry's setting did.

        Seats: the same cap, or this run's seats never held a sequence back and ``other``
        seats its most (its seat check then stops a step only where this one stopped for
        another reason). Tokens: the same budget and chunking, or this run never came
        within a waiting sequence of its budget (``demand`` below it: nothing chunked or
        held back) and ``other``'s budget holds that demand (its checks all pass).
        """
        mine, f = self.config, self.facts
        seats = mine.max_num_seqs == other.max_num_seqs or (
            f.seats_free and f.most_seqs <= other.max_num_seqs
        )
        same_budget = (mine.max_num_batched_tokens, mine.enable_chunked_prefill) == (
            other.max_num_batched_tokens,
            other.enable_chunked_prefill,
        )
        budget = same_budget or (
            f.demand < mine.max_num_batched_tokens and f.demand <= other.max_num_batched_tokens
        )
        return seats and budget


class Verdict:
    """Counts the judged requests that missed as they end; says when the rate has failed.

    A rate fails when fewer than ``attainment`` of its judged requests meet the targets
    (:func:`attained`). Once the misses alone leave fewer than that share of the judged
    arrivals able to meet them, the full run can only fail: the run stops there (the
    comparisons are :meth:`GenerationResult.meeting`'s, on the same floats).
    """

    def __init__(
        self, targets: Mapping[str, float], attainment: float, warmup_s: float, judged: int
    ) -> None:
        self.ttft_s = targets.get("ttft", 0.0) / 1000.0
        self.tpot_s = targets.get("tpot", 0.0) / 1000.0
        self.e2el_s = targets["e2el"] / 1000.0 if "e2el" in targets else math.inf
        self.attainment = attainment
        self.warmup_s = warmup_s
        self.judged = judged
        self.misses = 0

    def __call__(self, ended: Sequence[Finished]) -> bool:
        """Count the misses among ``ended``; true once they decide that the rate fails."""
        for f in ended:
            if f.arrival_s >= self.warmup_s and not self._met(f):
                self.misses += 1
        return self.failed

    @property
    def failed(self) -> bool:
        """The misses so far decide that the rate fails."""
        return self.judged > 0 and self.best < self.attainment

    @property
    def best(self) -> float:
        """The highest attainment the full run could still reach."""
        return (self.judged - self.misses) / self.judged if self.judged else 0.0

    def _met(self, f: Finished) -> bool:
        times = f.token_times_s
        if f.outcome != "served" or not times:
            return False
        first, n = times[0], len(times)
        if self.ttft_s > 0 and not first - f.arrival_s <= self.ttft_s:
            return False
        if self.tpot_s > 0 and n > 1 and not (f.end_s - first) / (n - 1) <= self.tpot_s:
            return False
        return f.end_s - f.arrival_s <= self.e2el_s


def longest_want(
    config: GenerationConfig, prompts: np.ndarray, outputs: np.ndarray, run: GenerationResult
) -> int:
    """The most tokens one waiting sequence may ask a step for.

    Its prompt, or after a preemption its prompt and all but its last output
    (recomputed); at most the long-prefill threshold.
    """
    if not len(prompts):
        return 0
    preempted = bool(run.steps.num_preempted.any()) if len(run.steps) else False
    longest = int((prompts + outputs - 1).max() if preempted else prompts.max())
    threshold = config.long_prefill_token_threshold
    return min(longest, threshold) if threshold > 0 else longest


def bounded(config: GenerationConfig, targets: Mapping[str, float], most: int) -> GenerationConfig:
    """The config with a timeout no request meeting the targets can reach.

    Past capacity the backlog's drain is most of a run's cost; a sequence older than its
    targets allow is a miss anyway, so it ends there (the judged outcome is unchanged).
    """
    bounds = [config.request_timeout_ms or math.inf]
    if "e2el" in targets:
        bounds.append(targets["e2el"])
    if "ttft" in targets and "tpot" in targets:
        bounds.append(targets["ttft"] + targets["tpot"] * max(most - 1, 0))
    limit = min(bounds)
    return config.replace(request_timeout_ms=limit + 1.0) if math.isfinite(limit) else config


def attained(run: GenerationResult, targets: Mapping[str, float], warmup_s: float) -> float:
    """The share of requests arriving after the warm-up that met every target.

    Refused requests count as misses (the result does not say when they arrived). A run
    that fell behind its arrivals scores at most the share it kept up with: requests ended
    within the judged window over those that arrived in it. Without that, a TPOT target
    alone is met at any rate (the queue grows, the running sequences stay fast).
    """
    after = run.arrival_s >= warmup_s
    ok = run.meeting(targets.get("ttft", 0.0), targets.get("tpot", 0.0)) & after
    if "e2el" in targets:
        ok &= run.end_s - run.arrival_s <= targets["e2el"] / 1000.0
    total = int(after.sum()) + run.refused
    if not total:
        return 0.0
    last = float(run.arrival_s[-1])
    ended = int(((run.end_s >= warmup_s) & (run.end_s <= last) & run.served).sum())
    arrived = int((after & (run.arrival_s <= last)).sum())
    pace = min(1.0, (ended + PACE_SLACK * arrived) / arrived) if arrived else 1.0
    return min(float(ok.sum()) / total, pace)


PACE_SLACK = 0.05
"""Requests still running when the arrivals stop, as a share of those judged: at 120 s
and e2e times of a few seconds, a setting that keeps up leaves 2-4% in flight."""


def squeezed_poisson(rate: float, duration_s: float, seed: int) -> np.ndarray:
    """Poisson arrival times (s) at ``rate`` for ``duration_s``, at least one.

    One draw of unit exponentials divided by the rate, so two rates see the same pattern
    squeezed: the targets' attainment then falls with the rate without sampling noise
    crossing it back, which bisection needs.
    """
    n = max(1, round(rate * duration_s))
    return np.cumsum(np.random.default_rng([seed, 0]).standard_exponential(n)) / rate
