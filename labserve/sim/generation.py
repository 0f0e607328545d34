"""Continuous batching on virtual time: the real generation scheduler and a step cost.

Nothing here re-implements scheduling: arrivals are admitted to the same
:class:`~labserve.generation.scheduler.Scheduler` the runtime drives, each step it plans
takes the time a :class:`StepCost` says, and its outcomes are collected. Prompt and output
lengths come from the shared length vocabulary (:mod:`labserve.base.lengths`); outputs run
to their drawn length (``ignore_eos``, as a benchmark fixes them). Same seed, same result.

Steps in which every running sequence decodes (lesson 10's workload at 48-75 req/s: 89% to
99.9% of its steps) are carried out by the scheduler in runs
(:meth:`~labserve.generation.scheduler.Scheduler.run_decodes`), 4-5x cheaper than planning
each; ``step_by_step=True`` plans every step, and gives the same result, float for float.

>>> from labserve.config.generation import GenerationConfig
>>> r = simulate_generation(GenerationConfig(), StepCost(fixed_ms=5), n_requests=4,
...                         input_len=8, output_len=3)
>>> round(r.percentiles_ms("ttft")["p50"], 6), round(r.percentiles_ms("tpot")["p50"], 6)
(5.0, 5.0)
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from labserve.base.errors import LengthLimitError, QueueFullError
from labserve.base.lengths import LengthDist, parse_length
from labserve.config.generation import GenerationConfig
from labserve.generation.decodes import DecodeRun
from labserve.generation.results import GenerationResult, StepSeries
from labserve.generation.scheduler import Scheduler
from labserve.generation.sequence import Finished, StepPlan, StepRecord
from labserve.generation.workload import SharedPrefixWorkload, ttft_by_turn

__all__ = [
    "StepCost",
    "WorkloadSimResult",
    "replay_generation",
    "simulate_generation",
    "simulate_workload",
]


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

    ``spread_edges_ms`` splits steps by their typical time into ``len(edges) + 1`` sizes,
    and ``spread`` then holds one block of quantiles per size, smallest first, each step
    drawing from its own size's block: a one-sequence decode of 0.7 ms and a 20 ms step
    lose their core differently (at load 6-13 on 2 cores, p99 5-30x against 2-4x), and one
    block for all put the short steps' 30x on the long prefills.

    ``spread_memory``: the chance that a step keeps the previous step's place in its spread
    (its quantile) instead of drawing afresh. A busy machine stays busy for a while: live
    TinyLM's steps, ranked within their size, correlated 0.56 with the next step, 0.31 ten
    steps on and 0.13 fifty on (load 4). Drawn afresh each step, slow steps never come in runs,
    and a request's TPOT (its mean gap over 128 steps) never has the live tail.

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
    spread_edges_ms: tuple[float, ...] = ()
    spread_memory: float = 0.0

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
        q, edges = self.spread, self.spread_edges_ms
        if not isinstance(q, tuple) or len(q) == 1:
            raise ValueError(f"spread must be a tuple of 0 or 2+ quantiles, got {q!r}")
        ok_edges = isinstance(edges, tuple) and all(
            isinstance(e, (int, float)) and math.isfinite(e) and e > 0 for e in edges
        )
        if not ok_edges or sorted(set(edges)) != list(edges) or (edges and not q):
            raise ValueError(
                "spread_edges_ms must be a tuple of rising finite times > 0 (and needs a"
                f" spread), got {edges!r}"
            )
        blocks = len(edges) + 1
        if len(q) % blocks or (q and len(q) // blocks < 2):
            raise ValueError(
                f"spread must hold {blocks} blocks of 2+ quantiles (one per size of"
                f" spread_edges_ms), got {len(q)} values"
            )
        m = self.spread_memory
        if not isinstance(m, (int, float)) or not 0.0 <= m < 1.0:
            raise ValueError(f"spread_memory must be a number in [0, 1), got {m!r}")
        for block in self._blocks():
            if not all(math.isfinite(v) and v >= 0 for v in block) or sorted(block) != list(block):
                raise ValueError(f"spread must be finite factors >= 0 in order, got {block!r}")

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
        blocks = self._blocks()
        if blocks:
            sizes = "" if len(blocks) == 1 else f"{len(blocks)} step sizes, "
            p99 = "/".join(f"{q[round(0.99 * (len(q) - 1))]:.2f}" for q in blocks)
            p50 = "/".join(f"{q[round(0.5 * (len(q) - 1))]:.2f}" for q in blocks)
            parts.append(f"spread=<{sizes}{len(blocks[0])} quantiles: p50 {p50}x, p99 {p99}x>")
        return f"StepCost({', '.join(parts)})"

    def _blocks(self) -> list[tuple[float, ...]]:
        """``spread`` cut into its blocks, one per step size (one block without edges)."""
        q = self.spread
        if not q:
            return []
        k = len(q) // (len(self.spread_edges_ms) + 1)
        return [q[i : i + k] for i in range(0, len(q), k)]

    def block_of(self, typical_s: float) -> tuple[float, ...]:
        """The spread's quantiles for a step whose typical time is ``typical_s``."""
        q, edges = self.spread, self.spread_edges_ms
        if not edges:
            return q
        k = len(q) // (len(edges) + 1)
        b = bisect.bisect_right(edges, typical_s * 1000.0)
        return q[b * k : (b + 1) * k]

    def factor(self, rng: np.random.Generator, typical_s: float = 0.0) -> float:
        """One step's measured-over-typical factor, drawn from its size's spread; 1 without."""
        q = self.block_of(typical_s) if self.spread_edges_ms else self.spread
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

    def timer(self, rng: np.random.Generator) -> Callable[[int, int, int], float]:
        """:meth:`seconds` times :meth:`factor`, as one function of the step's counts.

        The simulator's call per step (sequences, new tokens, context tokens): the same
        arithmetic in the same order, so the same floats, without the attribute look-ups.
        """
        if self.spread and self.spread_memory:
            return self._remembering(rng)
        fixed, seq, tok, ctx = self._terms()
        if not self.spread:  # factor() is 1.0: multiplying by it changes no float

            def typical(num_seqs: int, num_batched_tokens: int, num_context_tokens: int) -> float:
                ms = fixed + seq * num_seqs + tok * num_batched_tokens + ctx * num_context_tokens
                return ms / 1000.0

            return typical
        factor = self.factor

        def drawn(num_seqs: int, num_batched_tokens: int, num_context_tokens: int) -> float:
            ms = fixed + seq * num_seqs + tok * num_batched_tokens + ctx * num_context_tokens
            typical = ms / 1000.0
            return typical * factor(rng, typical)

        return drawn

    def _remembering(self, rng: np.random.Generator) -> Callable[[int, int, int], float]:
        """:meth:`timer` for a spread with memory: a step keeps the last one's quantile."""
        fixed, seq, tok, ctx = self._terms()
        memory, block_of = self.spread_memory, self.block_of
        place = [rng.random()]

        def remembered(num_seqs: int, num_batched_tokens: int, num_context_tokens: int) -> float:
            ms = fixed + seq * num_seqs + tok * num_batched_tokens + ctx * num_context_tokens
            typical = ms / 1000.0
            if rng.random() >= memory:
                place[0] = rng.random()
            q = block_of(typical)
            u = place[0] * (len(q) - 1)
            i = min(int(u), len(q) - 2)
            return typical * (q[i] + (q[i + 1] - q[i]) * (u - i))

        return remembered

    def _terms(self) -> tuple[float, float, float, float]:
        """The four terms in ms, in :meth:`seconds`' order (a timer's closure keeps them)."""
        return self.fixed_ms, self.per_seq_ms, self.per_batched_token_ms, self.per_context_token_ms


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
    step_by_step: bool = False,
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
        step_by_step: plan every step with ``schedule``/``complete`` (the reference);
            by default runs of decoding steps are carried out at once
            (:meth:`~labserve.generation.scheduler.Scheduler.run_decodes`), with the same
            result.

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
    return _run(config, cost, arrivals, prompts, outputs, max_model_len, seed, None, step_by_step)


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
    step_by_step: bool = False,
    stop_when: Callable[[Sequence[Finished]], bool] | None = None,
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

    ``step_by_step``: plan every step (the reference the default fast path is checked
    against; same result, 4-8x the CPU time on lesson 10's workload).

    ``stop_when``: called after each step that ended sequences, with those sequences;
    once it returns True the run stops after that step: the sequences still live end
    ``cancelled`` then and no further request is admitted (a search that has seen enough
    misses to decide a rate's verdict stops paying for the rest of it). Both paths stop
    after the same step.

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
    return _run(
        config,
        cost,
        arrivals,
        prompts,
        outputs,
        max_model_len,
        seed,
        tokens,
        step_by_step,
        stop_when,
    )


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

    def of(self) -> Callable[[int], Sequence[int]] | None:
        """Each request's output ids by its id, for a run of decode steps (None: not given)."""
        outs = self.outputs
        return None if outs is None else outs.__getitem__

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


class _Steps:
    """The run's step records as columns, appended a step or a run of decode steps at once.

    One list per :class:`~labserve.generation.results.StepSeries` column: at 30-140k
    steps a 120 s point, a record object per step (and a ``dataclasses.replace`` to add
    its context tokens) cost 0.25 s of a 4.5 s profile.
    """

    _INT = (
        "num_seqs",
        "num_prefill_tokens",
        "num_decode_tokens",
        "num_running",
        "num_waiting",
        "kv_blocks_used",
        "num_preempted",
        "num_context_tokens",
        "num_cache_queries",
        "num_cache_hits",
    )

    def __init__(self) -> None:
        self.start_s: list[float] = []
        self.end_s: list[float] = []
        self.ints: dict[str, list[int]] = {name: [] for name in self._INT}

    def add(self, record: StepRecord, context: int) -> None:
        """One planned step's record, with the context tokens its plan read."""
        self.start_s.append(record.start_s)
        self.end_s.append(record.end_s)
        for name, column in self.ints.items():
            column.append(context if name == "num_context_tokens" else getattr(record, name))

    def add_run(self, run: DecodeRun) -> None:
        """A run of steps carried out at once (:meth:`Scheduler.run_decodes`)."""
        self.start_s += run.start_s
        self.end_s += run.end_s
        for name, column in self.ints.items():
            if name == "num_preempted":
                column += [0] * len(run)
            else:
                column += getattr(run, name)

    def series(self) -> StepSeries:
        """The columns as arrays."""
        ints = {name: np.asarray(v, dtype=np.int64) for name, v in self.ints.items()}
        return StepSeries(
            start_s=np.asarray(self.start_s, dtype=np.float64),
            end_s=np.asarray(self.end_s, dtype=np.float64),
            **ints,
        )


def _run(
    config: GenerationConfig,
    cost: StepCost,
    arrivals: np.ndarray,
    prompts: np.ndarray,
    outputs: np.ndarray,
    max_model_len: int,
    seed: int,
    tokens: _Tokens | None = None,
    step_by_step: bool = False,
    stop_when: Callable[[Sequence[Finished]], bool] | None = None,
) -> GenerationResult:
    tokens = tokens or _Tokens(None, None, [], [])
    sched = Scheduler(config, max_model_len=max_model_len)
    spread = np.random.default_rng([seed, 35])  # apart from the arrivals' stream
    wake = cost.wake_ms / 1000.0
    finished: list[Finished] = []
    steps = _Steps()
    arrival_list, prompt_list, output_list = arrivals.tolist(), prompts.tolist(), outputs.tolist()
    n, i, now, refused = len(arrival_list), 0, 0.0, 0
    output_ids = tokens.of()
    step_time = cost.timer(spread)

    def admit(now: float) -> float:
        """Add what arrived by ``now``; when the next one arrives."""
        nonlocal i, refused
        while i < n and arrival_list[i] <= now:
            try:
                sched.add(
                    i, prompt_list[i], output_list[i], arrival_list[i], token_ids=tokens.prompt(i)
                )
            except (LengthLimitError, QueueFullError):
                refused += 1  # as a live method refuses it at admission
            i += 1
        return arrival_list[i] if i < n else math.inf

    stop = _Stop(stop_when)
    while not stop.done:
        admit(now)
        if not sched.has_work:
            if i >= n:
                break
            now = arrival_list[i] + wake  # an idle method wakes for it
            continue
        if not step_by_step:
            # Steps that only decode, at once: the same steps, times and records (issue 35).
            run = sched.run_decodes(
                now, step_time, admit=admit, outputs=output_ids, ended=stop.hook
            )
            if run is not None:
                steps.add_run(run)
                finished += run.finished
                now = run.end_s[-1]
                continue
        plan = sched.schedule(now)
        finished += stop.seen(plan.finished)
        if plan.empty:
            continue
        context = plan.num_context_tokens
        # The timer the decode runs use: the same floats as seconds() x factor(), one state.
        now += step_time(len(plan.scheduled), plan.num_batched_tokens, context)
        finished += stop.seen(sched.complete(plan, now, tokens=tokens.sampled(sched, plan)))
        assert sched.last_step is not None
        steps.add(sched.last_step, context)
    finished += sched.abort_all("cancelled", now)  # stopped early: nothing left unended
    return GenerationResult.from_finished(finished, steps.series(), refused)


class _Stop:
    """A run's ``stop_when``, told of each step's ended sequences once; ``done`` once it said so."""

    def __init__(self, stop_when: Callable[[Sequence[Finished]], bool] | None) -> None:
        self.stop_when = stop_when
        self.done = False
        self.hook = None if stop_when is None else self._ended

    def _ended(self, ended: Sequence[Finished]) -> bool:
        assert self.stop_when is not None
        self.done = self.done or self.stop_when(ended)
        return self.done

    def seen(self, ended: Sequence[Finished]) -> Sequence[Finished]:
        """``ended``, after telling ``stop_when`` of it (if any ended)."""
        if ended and self.stop_when is not None and not self.done:
            self._ended(ended)
        return ended


@dataclass(frozen=True)
class WorkloadSimResult:
    """A simulated :class:`~labserve.generation.workload.SharedPrefixWorkload` run.

    ``generation`` holds every turn as a request (in arrival order); ``session``, ``turn``
    and ``prompts`` (each turn's prompt token ids) are aligned with it.
    """

    generation: GenerationResult
    session: np.ndarray
    turn: np.ndarray
    prompts: tuple[tuple[int, ...], ...]

    def per_turn(self) -> dict[int, dict[str, float]]:
        """TTFT by turn index (count, mean, p50, p99 in ms) of the served turns."""
        g = self.generation
        ttft = np.where(g.served, g.first_token_s - g.arrival_s, np.nan)
        return ttft_by_turn(ttft, self.turn)


class _SessionSim:
    """The event loop of :func:`simulate_workload`: sessions' turns into one scheduler."""

    def __init__(
        self,
        config: GenerationConfig,
        cost: StepCost,
        workload: SharedPrefixWorkload,
        max_model_len: int,
        seed: int,
        step_by_step: bool = False,
    ) -> None:
        self.sched = Scheduler(config, max_model_len=max_model_len)
        self.step_by_step = step_by_step
        self.cost = cost
        self.workload = workload
        self.spread = np.random.default_rng([seed, 35])
        self.step_time = cost.timer(self.spread)
        self.pending: list[tuple[float, int, int, int]] = []  # (at, order, session, turn)
        self.replies: dict[int, list[list[int]]] = {}
        self.meta: dict[int, tuple[int, int, list[int], int]] = {}  # seq: k, t, ids, prompt
        self.finished: list[Finished] = []
        self.steps = _Steps()
        self.refused = 0
        self.replies_made: dict[int, list[int]] = {}  # running sequences' stand-in replies
        self._order = 0

    def arrive(self, at: float, k: int, turn: int) -> None:
        self._order += 1
        heapq.heappush(self.pending, (at, self._order, k, turn))

    def admit_due(self, now: float) -> None:
        w = self.workload
        while self.pending and self.pending[0][0] <= now:
            at, _, k, t = heapq.heappop(self.pending)
            ids = w.prompt_ids(k, t, self.replies.setdefault(k, []))
            seq_id = len(self.meta)
            self.meta[seq_id] = (k, t, ids, len(ids))
            try:  # the list is the sequence's own from here: the replies are appended to it
                self.sched.add(seq_id, len(ids), w.max_tokens(k, t), at, token_ids=ids)
            except (LengthLimitError, QueueFullError):
                self.refused += 1  # as a live method refuses it; the session ends there

    def ended(self, done: list[Finished]) -> None:
        """Keep the outcomes; a served turn's session sends its next turn after thinking."""
        self.finished += done
        w = self.workload
        for f in done:
            self.replies_made.pop(f.seq_id, None)
            k, t, ids, prompt_len = self.meta[f.seq_id]
            if f.outcome == "served" and t + 1 < w.turns:
                self.replies[k].append(ids[prompt_len:])
                self.arrive(f.end_s + w.think_time_s, k, t + 1)

    def reply_of(self, seq_id: int) -> list[int]:
        """The stand-in reply of a sequence, made once (a step asks for one token of it)."""
        reply = self.replies_made.get(seq_id)
        if reply is None:
            k, t, _, _ = self.meta[seq_id]
            reply = self.workload.simulated_reply(k, t, self.workload.max_tokens(k, t))
            self.replies_made[seq_id] = reply
        return reply

    def step(self, now: float) -> float:
        """Plan and run one step from ``now``; the time it ends."""
        plan = self.sched.schedule(now)
        self.ended(list(plan.finished))
        if plan.empty:
            return now
        tokens = {}
        for entry in plan.scheduled:
            if entry.samples:  # the model's reply: the workload's stand-in, token by token
                _, _, ids, prompt_len = self.meta[entry.seq_id]
                reply = self.reply_of(entry.seq_id)
                tokens[entry.seq_id] = reply[min(len(ids) - prompt_len, len(reply) - 1)]
        context = plan.num_context_tokens
        now += self.step_time(len(plan.scheduled), plan.num_batched_tokens, context)
        self.ended(self.sched.complete(plan, now, tokens=tokens))
        assert self.sched.last_step is not None
        self.steps.add(self.sched.last_step, context)
        return now

    def admit_next(self, now: float) -> float:
        """Admit what arrived by ``now``; when the next turn arrives (for a decode run)."""
        self.admit_due(now)
        return self.pending[0][0] if self.pending else math.inf

    def turned(self, done: Sequence[Finished]) -> bool:
        """A decode run's ended sequences; True (end the run) when one sends a next turn.

        The run then stops after that step, as the planned path would admit the turn at
        its arrival, which the run's ``admit`` was not told of.
        """
        before = len(self.pending)
        self.ended(list(done))
        return len(self.pending) > before

    def run(self) -> None:
        now, wake = 0.0, self.cost.wake_ms / 1000.0
        step_time = self.step_time
        while True:
            self.admit_due(now)
            if not self.sched.has_work:
                if not self.pending:
                    return
                now = max(now, self.pending[0][0] + wake)  # an idle method wakes for it
                continue
            if not self.step_by_step:
                # Steps that only decode, at once, as _run's (the same steps and records).
                run = self.sched.run_decodes(
                    now, step_time, admit=self.admit_next, outputs=self.reply_of, ended=self.turned
                )
                if run is not None:
                    self.steps.add_run(run)
                    now = run.end_s[-1]
                    continue
            now = self.step(now)


def session_arrivals(arrival_s: Sequence[float] | np.ndarray) -> np.ndarray:
    """The sessions' first arrivals as a float array, checked.

    Raises ValueError unless they are 1-D, finite and in non-decreasing order.
    """
    arrivals = np.asarray(arrival_s, dtype=np.float64)
    if arrivals.ndim != 1 or not np.isfinite(arrivals).all() or (np.diff(arrivals) < 0).any():
        raise ValueError("arrival_s must be finite times in seconds, in non-decreasing order")
    return arrivals


def simulate_workload(
    config: GenerationConfig,
    cost: StepCost,
    workload: SharedPrefixWorkload,
    *,
    arrival_s: Sequence[float] | np.ndarray,
    max_model_len: int = 0,
    seed: int = 0,
    step_by_step: bool = False,
) -> WorkloadSimResult:
    """Run a shared-prefix workload's sessions through the scheduler on virtual time.

    Session ``k`` arrives at ``arrival_s[k]`` (seconds); its turn ``t + 1`` arrives
    ``workload.think_time_s`` after turn ``t``'s last token, and resends the history with
    the reply the simulated model gave (the workload's seeded stand-in, handed to the
    scheduler token by token as a live model's would be). Every turn's prompt token ids go
    to the scheduler. A refused turn ends its session. Same seeds, same result.
    ``step_by_step``: plan every step (the reference; by default runs of decode steps are
    carried out at once, with the same result, as :func:`replay_generation` does).

    Raises:
        ValueError: the times are not finite and in order.

    >>> from labserve.generation.workload import SharedPrefixWorkload
    >>> w = SharedPrefixWorkload(prefix_len=8, input_len=4, output_len=2, turns=2)
    >>> r = simulate_workload(GenerationConfig(), StepCost(5.0), w, arrival_s=[0.0])
    >>> [len(p) for p in r.prompts], r.turn.tolist()
    ([12, 18], [0, 1])
    """
    arrivals = session_arrivals(arrival_s)
    sim = _SessionSim(config, cost, workload, max_model_len, seed, step_by_step)
    for k, at in enumerate(arrivals.tolist()):
        sim.arrive(at, k, 0)
    sim.run()
    generation = GenerationResult.from_finished(sim.finished, sim.steps.series(), sim.refused)
    done = sorted(sim.finished, key=lambda f: (f.arrival_s, f.seq_id))  # from_finished's order
    metas = [sim.meta[f.seq_id] for f in done]
    return WorkloadSimResult(
        generation=generation,
        session=np.asarray([m[0] for m in metas], dtype=np.int64),
        turn=np.asarray([m[1] for m in metas], dtype=np.int64),
        prompts=tuple(tuple(m[2][: m[3]]) for m in metas),
    )
