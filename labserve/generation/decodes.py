"""What :meth:`Scheduler.run_decodes` hands back: steps carried out at once, as columns.

Between two events (an arrival, an admission, an end, a KV block needed) a continuous
batch whose sequences all decode repeats one kind of step: each running sequence computes
one token and samples the next. Nothing about such a step needs planning per sequence: its
size is known, its KV blocks are needed every ``block_size`` steps, and a sequence leaves at
its ``max_tokens``. A simulator then pays per event instead of per sequence and step. The
scheduler carries such runs out (it is the one owner of the state they change); this module
holds their record: one list per :class:`~labserve.generation.sequence.StepRecord` field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labserve.generation.sequence import Finished, StepRecord, StopReason

__all__ = ["DecodeRun"]


@dataclass(slots=True)
class DecodeRun:
    """The steps a run carried out: one entry a step in each list. Times in seconds.

    Step ``j``'s :class:`StepRecord` (:meth:`record`) is what :meth:`Scheduler.complete`
    would have recorded for it; a run never preempts (``num_preempted`` is 0).
    """

    first_index: int
    """The first step's index (steps planned before it)."""
    start_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    num_seqs: list[int] = field(default_factory=list)
    num_prefill_tokens: list[int] = field(default_factory=list)
    num_decode_tokens: list[int] = field(default_factory=list)
    num_context_tokens: list[int] = field(default_factory=list)
    stop_reason: list[StopReason] = field(default_factory=list)
    num_running: list[int] = field(default_factory=list)
    """Sequences running after the step."""
    num_waiting: list[int] = field(default_factory=list)
    kv_blocks_used: list[int] = field(default_factory=list)
    """KV blocks held after the step."""
    num_cache_queries: list[int] = field(default_factory=list)
    num_cache_hits: list[int] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)
    """The sequences that ended in the run, in the order they ended."""

    def __len__(self) -> int:
        return len(self.end_s)

    def record(self, j: int, *, with_context: bool = True) -> StepRecord:
        """Step ``j``'s record.

        ``with_context`` False: ``num_context_tokens`` 0, as :meth:`Scheduler.complete`
        leaves it for its owner to fill in.
        """
        return StepRecord(
            index=self.first_index + j,
            start_s=self.start_s[j],
            end_s=self.end_s[j],
            num_seqs=self.num_seqs[j],
            num_prefill_tokens=self.num_prefill_tokens[j],
            num_decode_tokens=self.num_decode_tokens[j],
            num_running=self.num_running[j],
            num_waiting=self.num_waiting[j],
            kv_blocks_used=self.kv_blocks_used[j],
            num_preempted=0,
            stop_reason=self.stop_reason[j],
            num_context_tokens=self.num_context_tokens[j] if with_context else 0,
            num_cache_queries=self.num_cache_queries[j],
            num_cache_hits=self.num_cache_hits[j],
        )

    def records(self) -> list[StepRecord]:
        """Every step's record, with its context tokens (what an owner keeps per step)."""
        return [self.record(j) for j in range(len(self))]
