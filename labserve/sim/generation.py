"""Continuous batching on virtual time: the real generation scheduler and a step cost.

Nothing here re-implements scheduling: arrivals are admitted to the same
:class:`~labserve.generation.scheduler.Scheduler` the runtime drives, each step it plans
takes the time a :class:`StepCost` says, and its outcomes are collected. Prompt and output
lengths come from the shared length vocabulary (:mod:`labserve.base.lengths`); outputs run
to their drawn length (``ignore_eos``, as a benchmark fixes them). Same seed, same result.

>>> from labserve.config.generation import GenerationConfig
>>> r = simulate_generation(GenerationConfig(), StepCost(fixed_ms=5), n_requests=4,
...                         input_len=8, output_len=3)
>>> round(r.percentiles_ms("ttft")["p50"], 6), round(r.percentiles_ms("tpot")["p50"], 6)
(5.0, 5.0)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from labserve.base.errors import LengthLimitError, QueueFullError
from labserve.base.lengths import LengthDist, parse_length
from labserve.config.generation import GenerationConfig
from labserve.generation.results import GenerationResult
from labserve.generation.scheduler import Scheduler
from labserve.generation.sequence import Finished, StepPlan, StepRecord

__all__ = ["StepCost", "replay_generation", "simulate_generation"]


@dataclass(frozen=True)
class StepCost:
    """The time of one step, in milliseconds, from what the step counts.

    ``fixed_ms`` per step (launch, the weights read once), ``per_seq_ms`` per sequence in
    the step, ``per_batched_token_ms`` per new token computed (prefill chunks and decodes:
    the dense layers), ``per_context_token_ms`` per context token read by attention (each
    new token reads every cached token up to its own position).

    What a live run adds on a shared machine, measured by
    :func:`~labserve.lab.generation.calibrate.calibrate`: ``spread``, quantiles (at evenly
    spaced probabilities from 0 to 1) of a step's measured time over its typical time, one
    factor drawn per step from the simulator's seed (a factor, not an added time: a step
    that holds the core longer is the likelier to lose it to another process); and
    ``wake_ms``, from an arrival at an idle method to its first step's start (the hop onto
    the loop). :meth:`seconds` is the typical step, without the spread.

    >>> StepCost(5.0, per_batched_token_ms=0.02).seconds(num_seqs=4, num_batched_tokens=100,
    ...                                                  num_context_tokens=0)
    0.007
    """

    fixed_ms: float = 5.0
    per_seq_ms: float = 0.0
    per_batched_token_ms: float = 0.0
    per_context_token_ms: float = 0.0
    wake_ms: float = 0.0
    spread: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name in (
            "fixed_ms",
            "per_seq_ms",
            "per_batched_token_ms",
            "per_context_token_ms",
            "wake_ms",
        ):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        q = self.spread
        if not isinstance(q, tuple) or len(q) == 1:
            raise ValueError(f"spread must be a tuple of 0 or 2+ quantiles, got {q!r}")
        if q and (not all(math.isfinite(v) and v >= 0 for v in q) or sorted(q) != list(q)):
            raise ValueError(f"spread must be finite factors >= 0 in order, got {q!r}")

    def __repr__(self) -> str:
        """The terms; ``wake_ms`` and ``spread`` only when set (a profile's cost has neither)."""
        parts = [
            f"fixed_ms={self.fixed_ms!r}",
            f"per_seq_ms={self.per_seq_ms!r}",
            f"per_batched_token_ms={self.per_batched_token_ms!r}",
            f"per_context_token_ms={self.per_context_token_ms!r}",
        ]
        if self.wake_ms:
            parts.append(f"wake_ms={self.wake_ms!r}")
        q = self.spread
        if q:
            p50, p99 = (q[round(p / 100 * (len(q) - 1))] for p in (50, 99))
            parts.append(f"spread=<{len(q)} quantiles: p50 {p50:.2f}x, p99 {p99:.2f}x>")
        return f"StepCost({', '.join(parts)})"

    def factor(self, rng: np.random.Generator) -> float:
        """One step's measured-over-typical factor, drawn from ``spread``; 1 without."""
        q = self.spread
        if not q:
            return 1.0
        u = rng.random() * (len(q) - 1)
        i = min(int(u), len(q) - 2)
        return q[i] + (q[i + 1] - q[i]) * (u - i)

    def seconds(self, num_seqs: int, num_batched_tokens: int, num_context_tokens: int) -> float:
        """The step's time in seconds."""
        ms = (
            self.fixed_ms
            + self.per_seq_ms * num_seqs
            + self.per_batched_token_ms * num_batched_tokens
            + self.per_context_token_ms * num_context_tokens
        )
        return ms / 1000.0

    def of(self, plan: StepPlan) -> float:
        """The time of a planned step, in seconds."""
        return self.seconds(len(plan.scheduled), plan.num_batched_tokens, plan.num_context_tokens)


def simulate_generation(
    config: GenerationConfig,
    cost: StepCost,
    *,
    n_requests: int,
    input_len: LengthDist | str | int,
    output_len: LengthDist | str | int,
    rate: float = math.inf,
    seed: int = 0,
    max_model_len: int = 0,
) -> GenerationResult:
    """Run ``n_requests`` through the scheduler on virtual time; return what they measured.

    Args:
        config: the scheduler's knobs.
        cost: each step's time.
        n_requests: how many requests arrive.
        input_len: prompt lengths (a distribution or a spec such as ``"uniform:1:512"``).
        output_len: output lengths (each request's ``max_tokens``, all produced).
        rate: Poisson arrivals per second; ``math.inf``: all at time 0 (saturation).
        seed: fixes arrivals and lengths.
        max_model_len: the model's context (0: no limit); longer requests are refused.

    Requests refused at admission (too long for the context, or ``max_queue_size`` already
    waiting) are counted in the result's ``refused``, as a live method refuses them.
    """
    if isinstance(n_requests, bool) or not isinstance(n_requests, int) or n_requests < 0:
        raise ValueError(f"n_requests must be an integer >= 0, got {n_requests!r}")
    if not (isinstance(rate, (int, float)) and rate > 0):
        raise ValueError(f"rate must be a number of requests/s > 0, got {rate!r}")
    rng = np.random.default_rng(seed)
    prompts = parse_length(input_len, name="input_len").sample(rng, n_requests)
    outputs = parse_length(output_len, name="output_len").sample(rng, n_requests)
    if math.isinf(rate):
        arrivals = np.zeros(n_requests)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / rate, n_requests))
    return _run(config, cost, arrivals, prompts, outputs, max_model_len, seed)


def replay_generation(
    config: GenerationConfig,
    cost: StepCost,
    *,
    arrival_s: Sequence[float] | np.ndarray,
    prompt_lens: Sequence[int] | np.ndarray | None = None,
    output_lens: Sequence[int] | np.ndarray,
    max_model_len: int = 0,
    seed: int = 0,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    output_ids: Sequence[Sequence[int]] | None = None,
) -> GenerationResult:
    """Replay given requests through the scheduler on virtual time (a live run's, say).

    Request ``i`` arrives at ``arrival_s[i]`` (seconds, in order) with a prompt of
    ``prompt_lens[i]`` tokens and produces ``output_lens[i]`` tokens. What a fidelity check
    hands in: a live run's arrival times and lengths, and the step cost calibrated on it.
    ``seed`` fixes the cost's spread draws (if it has any).

    Prefix caching (``config.enable_prefix_caching`` True) needs the tokens: ``prompt_ids``
    (each prompt's ids; ``prompt_lens`` then defaults to their lengths) and, for a later
    prompt that resends an earlier reply (multi-turn chat), ``output_ids`` (each request's
    outputs, at least ``output_lens[i]`` of them): without them outputs are not hashed, and
    only prompt blocks can hit. A hit's tokens are not computed, so they cost nothing
    but the context its computed tokens read.

    Raises:
        ValueError: the lengths differ, the times are not finite and in order, or a
            length is not an integer >= 1.

    >>> r = replay_generation(GenerationConfig(), StepCost(5.0), arrival_s=[0.0, 0.1],
    ...                       prompt_lens=[4, 4], output_lens=[2, 2])
    >>> [round(float(t), 6) for t in r.e2e_s]
    [0.01, 0.01]
    """
    arrivals = np.asarray(arrival_s, dtype=np.float64)
    if prompt_lens is None:
        if prompt_ids is None:
            raise ValueError("give prompt_lens or prompt_ids")
        prompt_lens = [len(ids) for ids in prompt_ids]
    prompts, outputs = np.asarray(prompt_lens), np.asarray(output_lens)
    if not (arrivals.ndim == prompts.ndim == outputs.ndim == 1) or not (
        len(arrivals) == len(prompts) == len(outputs)
    ):
        raise ValueError(
            "arrival_s, prompt_lens and output_lens must be 1-D and of one length, got "
            f"{arrivals.shape}, {prompts.shape} and {outputs.shape}"
        )
    if not np.isfinite(arrivals).all() or (np.diff(arrivals) < 0).any():
        raise ValueError("arrival_s must be finite times in seconds, in non-decreasing order")
    for name, values in (("prompt_lens", prompts), ("output_lens", outputs)):
        if len(values) and (not np.issubdtype(values.dtype, np.integer) or values.min() < 1):
            raise ValueError(f"{name} must be integers >= 1, got {values.tolist()[:8]!r}")
    tokens = _Tokens(prompt_ids, output_ids, prompts.tolist(), outputs.tolist())
    return _run(config, cost, arrivals, prompts, outputs, max_model_len, seed, tokens)


class _Tokens:
    """The requests' token ids, when given: what the prefix cache hashes."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]] | None,
        outputs: Sequence[Sequence[int]] | None,
        prompt_lens: list[int],
        output_lens: list[int],
    ) -> None:
        if prompts is not None and [len(p) for p in prompts] != prompt_lens:
            raise ValueError("prompt_ids must hold prompt_lens[i] ids for each request i")
        if outputs is not None and (
            len(outputs) != len(output_lens)
            or any(len(o) < n for o, n in zip(outputs, output_lens, strict=True))
        ):
            raise ValueError("output_ids must hold at least output_lens[i] ids for each request i")
        self.prompts = prompts
        self.outputs = outputs

    def prompt(self, i: int) -> list[int] | None:
        """Request ``i``'s prompt ids, a list of its own (None: counted only)."""
        return list(self.prompts[i]) if self.prompts is not None else None

    def sampled(self, sched: Scheduler, plan: StepPlan) -> dict[int, int] | None:
        """Each sampling sequence's next output id (None: outputs not given)."""
        outs = self.outputs
        if outs is None:
            return None
        return {
            e.seq_id: outs[e.seq_id][sched.sequence(e.seq_id).num_output]
            for e in plan.scheduled
            if e.samples and e.seq_id in sched
        }


def _run(
    config: GenerationConfig,
    cost: StepCost,
    arrivals: np.ndarray,
    prompts: np.ndarray,
    outputs: np.ndarray,
    max_model_len: int,
    seed: int,
    tokens: _Tokens | None = None,
) -> GenerationResult:
    tokens = tokens or _Tokens(None, None, [], [])
    sched = Scheduler(config, max_model_len=max_model_len)
    spread = np.random.default_rng([seed, 35])  # apart from the arrivals' stream
    wake = cost.wake_ms / 1000.0
    finished: list[Finished] = []
    steps: list[StepRecord] = []
    arrival_list, prompt_list, output_list = arrivals.tolist(), prompts.tolist(), outputs.tolist()
    n, i, now, refused = len(arrival_list), 0, 0.0, 0
    while True:
        while i < n and arrival_list[i] <= now:
            try:
                sched.add(
                    i, prompt_list[i], output_list[i], arrival_list[i], token_ids=tokens.prompt(i)
                )
            except (LengthLimitError, QueueFullError):
                refused += 1  # as a live method refuses it at admission
            i += 1
        if not sched.has_work:
            if i >= n:
                break
            now = arrival_list[i] + wake  # an idle method wakes for it
            continue
        plan = sched.schedule(now)
        finished += plan.finished
        if plan.empty:
            continue
        context = plan.num_context_tokens
        typical = cost.seconds(len(plan.scheduled), plan.num_batched_tokens, context)
        now += typical * cost.factor(spread)
        finished += sched.complete(plan, now, tokens=tokens.sampled(sched, plan))
        assert sched.last_step is not None
        steps.append(dataclasses.replace(sched.last_step, num_context_tokens=context))
    return GenerationResult.from_finished(finished, steps, refused)
