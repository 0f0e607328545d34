"""What the generation scheduler tracks and hands its owner: sequences, steps, outcomes.

Plain data. The scheduler (:mod:`labserve.generation.scheduler`) creates and updates them;
its owner (the runtime driver or the simulator) reads them. A sequence has one record,
:class:`SeqState`, with one :data:`SeqStatus` (vLLM's ``RequestStatus``): the scheduler
holds its counts, its token ids when the owner gives them (the simulator counts only), and
the owner's handle on it (the runtime's caller: its sampler and stream), so that nothing
about a live sequence is kept twice.

Counting, per sequence: ``num_tokens`` tokens are known (the prompt and the outputs so far);
``num_computed`` of them are in the KV cache. A step computes ``count`` new tokens from
``num_computed`` on, and samples the next output when it reaches ``num_tokens`` (the end of
a prefill, or a decode). The last output is never fed back, so a sequence of prompt P and
``max_tokens`` M caches at most P + M - 1 tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

__all__ = [
    "FINISH_REASONS",
    "SEQ_OUTCOMES",
    "FinishReason",
    "Finished",
    "Kind",
    "Scheduled",
    "SeqOutcome",
    "SeqState",
    "SeqStatus",
    "StepPlan",
    "StepRecord",
    "StopReason",
]

SeqOutcome = Literal["served", "cancelled", "timeout", "failed", "refused"]
SEQ_OUTCOMES: tuple[SeqOutcome, ...] = ("served", "cancelled", "timeout", "failed", "refused")
"""How a sequence ends (names as the runner's outcomes in labserve.base.vocabulary).
``refused``: at admission, or later when a live config change left it a sequence the
config in force can never run (it ends with the error admission would have given)."""

FinishReason = Literal["length", "stop", "cancelled", "timeout", "failed", "stranded"]
FINISH_REASONS: tuple[FinishReason, ...] = (
    "length",
    "stop",
    "cancelled",
    "timeout",
    "failed",
    "stranded",
)
"""Why: ``length`` (``max_tokens`` reached; OpenAI's word), ``stop`` (a stop token or string),
``stranded`` (a config change left it unable ever to run: outcome ``refused``), or the
outcome itself."""

SeqStatus = Literal["waiting", "running", "preempted", "finished"]
"""Where a sequence is: waiting to run (new), running (holding its place and KV blocks),
preempted (waiting to be recomputed), or finished (its ``finish_reason`` says why)."""

StopReason = Literal["empty", "max_num_seqs", "token_budget", "kv_blocks", "batch", "preempted"]
"""Why a step stopped taking waiting sequences: none waited; ``max_num_seqs`` were running;
the step's token budget was spent; no KV blocks for the next prompt; ``static`` and the
batch has not ended; or the step preempted a sequence (vLLM's rule: no admissions then)."""

Kind = Literal["prefill", "decode", "resume"]


class SeqState:
    """One sequence's one record. Mutable; owned by the scheduler, read by its owner."""

    __slots__ = (
        "arrival_s",
        "block_hashes",
        "block_table",
        "deadline_s",
        "finish_reason",
        "first_scheduled_s",
        "handle",
        "id",
        "max_tokens",
        "num_cached_tokens",
        "num_computed",
        "num_output",
        "num_preemptions",
        "num_registered",
        "num_tokens",
        "order",
        "priority",
        "prompt_len",
        "status",
        "timeout_s",
        "token_ids",
        "token_times_s",
    )

    def __init__(
        self,
        seq_id: int,
        prompt_len: int,
        max_tokens: int,
        arrival_s: float,
        timeout_s: float,
        priority: int,
        order: int,
        token_ids: list[int] | None = None,
        handle: Any = None,
    ) -> None:
        self.id = seq_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.arrival_s = arrival_s
        self.timeout_s = timeout_s  # the request_timeout_ms in force at admission (0: none)
        self.deadline_s = arrival_s + timeout_s if timeout_s > 0 else math.inf
        self.priority = priority
        self.order = order  # admission order: ties of arrival and priority
        self.token_ids = token_ids  # prompt, then each output (None: counted only)
        self.handle = handle  # the owner's (the runtime's caller); None in the simulator
        self.status: SeqStatus = "waiting"
        self.finish_reason: FinishReason | None = None
        self.num_tokens = prompt_len  # known: prompt + outputs so far
        self.num_computed = 0  # in the KV cache
        self.num_output = 0
        self.block_table: list[int] = []  # the pool blocks holding its positions, in order
        self.block_hashes: list[int] = []  # prefix-cache keys of its first full blocks
        self.num_registered = 0  # blocks of its table registered in the prefix cache
        self.num_cached_tokens = 0  # tokens its last admission found in the prefix cache
        self.num_preemptions = 0
        self.first_scheduled_s: float | None = None
        self.token_times_s: list[float] = []  # when each output token was produced

    @property
    def blocks(self) -> int:
        """KV blocks held."""
        return len(self.block_table)

    @property
    def finished(self) -> bool:
        """Whether it has had its one outcome."""
        return self.status == "finished"

    @property
    def output_ids(self) -> tuple[int, ...]:
        """The token ids generated so far (empty when counted only)."""
        ids = self.token_ids
        return tuple(ids[self.prompt_len :]) if ids is not None else ()

    def __repr__(self) -> str:
        return (
            f"SeqState(id={self.id}, {self.status}, tokens={self.num_tokens}, "
            f"computed={self.num_computed}, output={self.num_output}/{self.max_tokens}, "
            f"blocks={self.blocks})"
        )


class Scheduled(NamedTuple):
    """One sequence's share of a step: compute ``num_new_tokens`` tokens from ``start`` on.

    A named tuple: a step makes one per sequence, and the scheduler's time per step counts.
    """

    seq_id: int
    start: int
    """Tokens already in the KV cache: the first new token's position."""
    num_new_tokens: int
    """New tokens computed this step (1 for a decode)."""
    samples: bool
    """Whether the step ends with this sequence's next output token (prefill done)."""
    kind: Kind
    """``prefill`` (prompt tokens), ``decode`` (its last output), ``resume`` (recomputing
    after a preemption)."""
    final: bool
    """Whether the token this step samples is the sequence's last (``max_tokens`` reached):
    decided here, once, so that the owner lets out held text and the scheduler ends it
    with reason ``length`` by the same rule."""


@dataclass(frozen=True, slots=True)
class Finished:
    """A sequence's one outcome, with what its metrics need. Times in seconds."""

    seq_id: int
    outcome: SeqOutcome
    reason: FinishReason
    arrival_s: float
    end_s: float
    prompt_len: int
    token_times_s: tuple[float, ...]
    """When each output token came (the first one's gives TTFT)."""
    num_preemptions: int
    seq: SeqState | None = None
    """The sequence's record as it ended (its token ids and its owner's handle)."""
    error: BaseException | None = None
    """The typed error of a ``stranded`` sequence (what admission would have raised)."""


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step's decision: what to compute, and what changed before it.

    The owner runs the model on ``scheduled``, then calls ``Scheduler.complete`` with this
    plan. Before the step it frees the model state of ``preempted`` and ``finished``.
    """

    index: int
    """Steps planned before this one."""
    start_s: float
    scheduled: tuple[Scheduled, ...]
    preempted: tuple[int, ...]
    """Sequences preempted to make KV room (newest first): recomputed when they run again."""
    finished: tuple[Finished, ...]
    """Sequences that ended before the step: past their timeout, or stranded by a config
    change (cancelled ones end when they are withdrawn)."""
    stop_reason: StopReason
    """Why the step took no more waiting sequences."""
    num_batched_tokens: int
    num_prefill_tokens: int
    num_cache_queries: int = 0
    """Prompt tokens of the sequences this step admitted, looked up in the prefix cache."""
    num_cache_hits: int = 0
    """Of those, the tokens found cached (not computed: vLLM's ``prefix_cache_hits``)."""

    @property
    def empty(self) -> bool:
        """Whether there is nothing to compute (nothing runs or waits)."""
        return not self.scheduled

    @property
    def num_context_tokens(self) -> int:
        """Context tokens the step's attention reads (each new token reads all up to its own).

        ``count`` new tokens from ``start`` read ``count * start`` cached tokens plus
        ``count * (count + 1) / 2`` of their own.
        """
        return sum(
            e.num_new_tokens * e.start + e.num_new_tokens * (e.num_new_tokens + 1) // 2
            for e in self.scheduled
        )


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one finished step did: the per-step series a lesson plots. Times in seconds."""

    index: int
    start_s: float
    end_s: float
    num_seqs: int
    """Sequences computed in the step."""
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    """Sequences running after the step."""
    num_waiting: int
    kv_blocks_used: int
    num_preempted: int
    stop_reason: StopReason
    num_context_tokens: int = 0
    """Context tokens read by the step's attention (:attr:`StepPlan.num_context_tokens`),
    filled in by the step's owner (the driver, the simulator) from its plan; 0 when the
    owner did not count them. What a step's cost is fitted on beside the token counts."""
    num_cache_queries: int = 0
    """Tokens the step's admissions looked up in the prefix cache (:class:`StepPlan`)."""
    num_cache_hits: int = 0
    """Of those, the tokens found cached."""
