"""What the generation scheduler tracks and hands its owner: sequences, steps, outcomes.

Plain data. The scheduler (:mod:`labserve.generation.scheduler`) creates and updates them;
its owner (the runtime driver or the simulator) reads them. Token ids never enter here: a
sequence is counted in tokens, and its owner keeps the ids (the model owns the KV tensors).

Counting, per sequence: ``num_tokens`` tokens are known (the prompt and the outputs so far);
``num_computed`` of them are in the KV cache. A step computes ``count`` new tokens from
``num_computed`` on, and samples the next output when it reaches ``num_tokens`` (the end of
a prefill, or a decode). The last output is never fed back, so a sequence of prompt P and
``max_tokens`` M caches at most P + M - 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = [
    "FINISH_REASONS",
    "SEQ_OUTCOMES",
    "FinishReason",
    "Finished",
    "Kind",
    "Scheduled",
    "SeqOutcome",
    "SeqState",
    "StepPlan",
    "StepRecord",
    "StopReason",
]

SeqOutcome = Literal["served", "cancelled", "timeout", "failed"]
SEQ_OUTCOMES: tuple[SeqOutcome, ...] = ("served", "cancelled", "timeout", "failed")
"""How a sequence ends (names as the runner's outcomes in labserve.base.vocabulary)."""

FinishReason = Literal["length", "stop", "cancelled", "timeout", "failed"]
FINISH_REASONS: tuple[FinishReason, ...] = ("length", "stop", "cancelled", "timeout", "failed")
"""Why: ``length`` (``max_tokens`` reached; OpenAI's word), ``stop`` (a stop token or string),
or the outcome itself."""

StopReason = Literal["empty", "max_num_seqs", "token_budget", "kv_blocks", "batch", "preempted"]
"""Why a step stopped taking waiting sequences: none waited; ``max_num_seqs`` were running;
the step's token budget was spent; no KV blocks for the next prompt; ``static`` and the
batch has not ended; or the step preempted a sequence (vLLM's rule: no admissions then)."""

Kind = Literal["prefill", "decode", "resume"]


class SeqState:
    """One sequence as the scheduler tracks it. Mutable; owned by the scheduler."""

    __slots__ = (
        "arrival_s",
        "blocks",
        "deadline_s",
        "done",
        "first_scheduled_s",
        "id",
        "max_tokens",
        "num_computed",
        "num_output",
        "num_preemptions",
        "num_tokens",
        "order",
        "pending_abort",
        "priority",
        "prompt_len",
        "token_times_s",
    )

    def __init__(
        self,
        seq_id: int,
        prompt_len: int,
        max_tokens: int,
        arrival_s: float,
        deadline_s: float,
        priority: int,
        order: int,
    ) -> None:
        self.id = seq_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.arrival_s = arrival_s
        self.deadline_s = deadline_s  # inf: no timeout
        self.priority = priority
        self.order = order  # admission order: ties of arrival and priority
        self.num_tokens = prompt_len  # known: prompt + outputs so far
        self.num_computed = 0  # in the KV cache
        self.num_output = 0
        self.blocks = 0  # KV blocks held
        self.num_preemptions = 0
        self.first_scheduled_s: float | None = None
        self.token_times_s: list[float] = []  # when each output token was produced
        self.pending_abort: FinishReason | None = None  # cancelled or timed out in flight
        self.done = False

    def __repr__(self) -> str:
        return (
            f"SeqState(id={self.id}, tokens={self.num_tokens}, computed={self.num_computed}, "
            f"output={self.num_output}/{self.max_tokens}, blocks={self.blocks})"
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
    """Sequences that ended before the step: cancelled, or past their timeout."""
    stop_reason: StopReason
    """Why the step took no more waiting sequences."""
    num_batched_tokens: int
    num_prefill_tokens: int

    @property
    def empty(self) -> bool:
        """Whether there is nothing to compute (nothing runs or waits)."""
        return not self.scheduled


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
