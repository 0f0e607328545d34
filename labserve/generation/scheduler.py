"""The continuous-batching scheduler, sans-IO: which sequences compute how many tokens, each step.

vLLM V1's rules, step by step (``strategy="continuous"``):

1. Running sequences first, in the order they started: each computes what it has left
   (one token for a decode; the next chunk of a prefill, at most
   ``long_prefill_token_threshold``), while the step's ``max_num_batched_tokens`` last.
   A sequence that needs a KV block when none is free preempts the newest running
   sequence (by priority: the lowest-priority, newest one), which frees its blocks and
   goes back to the front of the waiting queue, to be recomputed when it runs again;
   if it is itself the newest, it waits.
2. Then, unless the step preempted, waiting sequences in FCFS or priority order while
   fewer than ``max_num_seqs`` run, tokens are left, and KV blocks hold their prompt chunk.
   A prompt that does not fit what is left is chunked (``enable_chunked_prefill``); with
   chunking off it waits at the head for a step with room. (vLLM V1 lets later, shorter
   prompts pass it instead; under steady load a long prompt then never finds a step with
   its whole length free, because the running decodes take their share first. labserve
   keeps the order, so nothing starves: the running sequences drain and it runs.)

``strategy="static"`` takes waiting sequences only when none runs: a batch of up to
``max_num_seqs`` runs until its longest sequence ends (the baseline).

Time is passed in (``now``, seconds), never read. Every admitted sequence ends in exactly
one :class:`~labserve.generation.sequence.Finished`. One step is planned at a time: the
owner calls :meth:`Scheduler.schedule`, runs the model, then :meth:`Scheduler.complete`.

The scheduler is the one owner of a method's generation state: the config in force and
the pending one, each sequence's one record (:class:`~labserve.generation.sequence.SeqState`
and its status), the deadlines, the admission decision and the stop decision. Settings
are of three kinds (:data:`~labserve.config.generation.ARRIVAL_SETTINGS` and the rest):
those that act on arrivals (``request_timeout_ms``, ``max_queue_size``) act from the moment
:meth:`Scheduler.configure` accepts them, for every sequence admitted after; those that
shape steps apply at the next :meth:`Scheduler.schedule`, and a change there that leaves a
live sequence one the config can never run ends it then (``stranded``, with the error
admission would have given it). Ends are immediate: :meth:`Scheduler.abort` and
:meth:`Scheduler.expire` end a sequence at once, even while its step is in flight (the
step's token for it is then dropped); the owner frees its model state before the next step.

KV blocks are a :class:`~labserve.generation.blocks.BlockPool`'s ids, a block table per
sequence (``SeqState.block_table``): a step's sequences get the blocks their new tokens
need when it is planned; an end or a preemption gives them back. Blocks given back while
a step is in flight stay parked until :meth:`Scheduler.complete` (the model may still
write into them). For a model that stores K/V in labserve's blocks the pool is its memory
(``kv_pool_blocks``, fixed at start); otherwise it is an account sized by ``num_kv_blocks``.

Prefix caching (``enable_prefix_caching``; unset: on for a pool that is the model's memory),
vLLM's semantics: a sequence leaving the waiting queue takes the longest run of cached full
blocks its known tokens start with, at most all but its last token's (that token is computed
for its logits), and computes from there; its queries and hits are counted in tokens. A
step's full blocks are registered under their hash when :meth:`Scheduler.complete` records
it (not for a sequence the step failed); ends and preemptions give blocks back cached, so a
preempted sequence hits what is left of its own. ``scheduling_policy="lpm"`` sorts the
waiting queue by cached blocks before each step. Sequences admitted without token ids
(counted only) neither hit nor register.

An owner that runs no model (the simulator) may carry out many steps in one call,
:meth:`Scheduler.run_decodes`, while every running sequence decodes: the same rules and the
same state as planning each, at a fraction of the cost (issue 35's search speed).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from labserve.base.errors import LabServeError, QueueFullError
from labserve.config.generation import GenerationConfig
from labserve.generation.admission import check_admission
from labserve.generation.blocks import BlockPool, block_hashes
from labserve.generation.decodes import DecodeRun
from labserve.generation.sequence import (
    Finished,
    FinishReason,
    Kind,
    Scheduled,
    SeqOutcome,
    SeqState,
    StepPlan,
    StepRecord,
    StopReason,
)
from labserve.generation.waiting import WaitingQueue

__all__ = ["Scheduler"]

_OUTCOME: dict[FinishReason, SeqOutcome] = {
    "length": "served",
    "stop": "served",
    "cancelled": "cancelled",
    "timeout": "timeout",
    "failed": "failed",
    "stranded": "refused",
}


_LPM_MAX_WAITING = 128


class Scheduler:
    """Plans each step of a generative method under a :class:`GenerationConfig`.

    Not thread-safe: its owner (one driver) calls it from one thread, except
    :meth:`configure` and the read-only properties, which any thread may call (each is
    one reference read or written under the GIL).

    Args:
        config: the knobs in force; :meth:`configure` replaces them.
        max_model_len: the model's context in tokens (prompt plus outputs); 0: no limit.
        name: the method's name, for errors.
        kv_pool_blocks: the blocks of a model that stores K/V in labserve's blocks (its
            memory: fixed, whatever ``num_kv_blocks`` says); 0: the pool is an account
            of ``num_kv_blocks`` blocks (0: no limit) that follows the config.

    >>> s = Scheduler(GenerationConfig(max_num_seqs=2))
    >>> _ = s.add(1, prompt_len=3, max_tokens=2, now=0.0)
    >>> plan = s.schedule(0.0)
    >>> [(x.seq_id, x.num_new_tokens, x.kind) for x in plan.scheduled]
    [(1, 3, 'prefill')]
    >>> s.complete(plan, 0.01)
    []
    >>> [f.reason for f in s.complete(s.schedule(0.01), 0.02)]
    ['length']
    """

    def __init__(
        self,
        config: GenerationConfig,
        *,
        max_model_len: int = 0,
        name: str = "generate",
        kv_pool_blocks: int = 0,
    ) -> None:
        self._config = config
        self._pending_config: GenerationConfig | None = None
        self.max_model_len = max_model_len
        self.name = name
        self._seqs: dict[int, SeqState] = {}
        self._running: list[SeqState] = []  # in the order they started running
        self._waiting = WaitingQueue(config.scheduling_policy)
        self._deadlines: list[tuple[float, int, SeqState]] = []
        self._order = 0
        self._steps = 0
        self._fixed_pool = kv_pool_blocks > 0
        self._pool = BlockPool(
            kv_pool_blocks or config.num_kv_blocks, caching=self._caching(config)
        )
        self._inflight: StepPlan | None = None
        self.num_preemptions = 0
        """Preemptions since the scheduler was made."""
        self.prefix_cache_queries = 0
        """Prompt tokens looked up in the prefix cache at admission, since it was made."""
        self.prefix_cache_hits = 0
        """Of those, the tokens found cached (not computed)."""
        self._step_queries = 0
        self._step_hits = 0
        self.last_step: StepRecord | None = None
        """The record of the last completed step."""

    # -- what the owner reads -----------------------------------------------------------

    @property
    def config(self) -> GenerationConfig:
        """The config in force (the one the last step was planned with). Any thread."""
        return self._config

    @property
    def latest_config(self) -> GenerationConfig:
        """The config asked for last: pending until the next step, else the one in force.

        Its arrival settings already act on every sequence admitted. Any thread.
        """
        return self._pending_config or self._config

    @property
    def num_running(self) -> int:
        """Sequences running (holding a place in the batch, and their KV blocks)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences admitted and waiting to run (new, or preempted)."""
        return len(self._waiting)

    @property
    def kv_blocks_used(self) -> int:
        """KV blocks held by running sequences."""
        return self._pool.num_used

    @property
    def kv_blocks_cached(self) -> int:
        """KV blocks registered in the prefix cache (held or free)."""
        return self._pool.num_cached

    @property
    def kv_blocks_total(self) -> int:
        """The KV pool's blocks (0: no limit)."""
        return self._pool.capacity

    @property
    def pool(self) -> BlockPool:
        """The KV block pool (read it from the owner's thread only)."""
        return self._pool

    @property
    def has_work(self) -> bool:
        """Whether a sequence is live (running or waiting)."""
        return bool(self._seqs)

    @property
    def step_in_flight(self) -> bool:
        """Whether a planned step has not been completed yet."""
        return self._inflight is not None

    @property
    def next_deadline_s(self) -> float | None:
        """When the next live sequence times out (None: none has a timeout)."""
        heap = self._deadlines
        while heap and heap[0][2].finished:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def sequence(self, seq_id: int) -> SeqState:
        """A live sequence's record (read only, for the owner's bookkeeping)."""
        return self._seqs[seq_id]

    def live(self) -> list[SeqState]:
        """Every live sequence's record, in admission order."""
        return list(self._seqs.values())

    # -- events -----------------------------------------------------------------------

    def configure(self, config: GenerationConfig) -> None:
        """Ask for ``config``. Any thread (one reference written).

        Its arrival settings act on every sequence admitted from now on; the rest apply
        at the next step (a step sees one config).
        """
        self._pending_config = config

    def add(
        self,
        seq_id: int,
        prompt_len: int,
        max_tokens: int,
        now: float,
        *,
        priority: int = 0,
        token_ids: list[int] | None = None,
        handle: Any = None,
    ) -> SeqState:
        """Admit a sequence at ``now`` (its arrival time): the one admission decision.

        ``token_ids``: its prompt's ids (the list is the sequence's own from then on: the
        scheduler appends each output); ``handle``: the owner's, kept on the record.

        Raises:
            LengthLimitError: it cannot fit the model's context, the step's token budget
                (chunked prefill off) or the whole KV budget; nothing changes.
            InputError: ``max_tokens`` below 1 or a prompt of no tokens.
            QueueFullError: ``max_queue_size`` sequences wait already.
            ValueError: ``seq_id`` is live already.
        """
        config = self.latest_config
        check_admission(prompt_len, max_tokens, config, self.max_model_len, self._kv_limit())
        if seq_id in self._seqs:
            raise ValueError(f"sequence id {seq_id!r} is live already")
        if len(self._waiting) >= config.max_queue_size:
            raise QueueFullError(self.name, config.max_queue_size, retry_after_s=0.1)
        self._order += 1
        seq = SeqState(
            seq_id,
            prompt_len,
            max_tokens,
            now,
            config.request_timeout_s,
            priority,
            self._order,
            token_ids,
            handle,
        )
        self._seqs[seq_id] = seq
        self._waiting.push(seq)
        if seq.deadline_s < math.inf:
            heapq.heappush(self._deadlines, (seq.deadline_s, seq.order, seq))
        return seq

    def abort(self, seq_id: int, reason: FinishReason, now: float) -> Finished | None:
        """End a live sequence now (``cancelled``, ``timeout`` or ``failed``); its outcome.

        Its blocks are freed at once; if its step is in flight, the token that step
        computes for it is dropped. None when the sequence has ended already.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            return None
        return self._finish(seq, reason, now)

    def abort_all(self, reason: FinishReason, now: float) -> list[Finished]:
        """End every live sequence now (the owner stops)."""
        return [self._finish(seq, reason, now) for seq in list(self._seqs.values())]

    def expire(self, now: float) -> list[Finished]:
        """End the sequences whose timeout has passed at ``now``, at once."""
        out = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, seq = heapq.heappop(heap)
            if not seq.finished:
                out.append(self._finish(seq, "timeout", now))
        return out

    # -- the step -----------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        """Plan the next step at ``now``.

        Applies a pending config (ending the sequences it strands), ends timed-out
        sequences, then plans by the rules above. The plan may be empty.
        """
        if self._inflight is not None:
            raise RuntimeError("schedule() called while a step is in flight: complete() it first")
        finished: list[Finished] = []
        if self._pending_config is not None:
            finished += self._apply_config(self._pending_config, now)
        finished += self.expire(now)
        config = self._config
        if config.scheduling_policy == "lpm":
            self._sort_by_prefix()
        budget = config.max_num_batched_tokens
        self._step_queries = self._step_hits = 0
        was_running = bool(self._running)
        scheduled: dict[int, Scheduled] = {}
        preempted: list[int] = []
        budget = self._schedule_running(scheduled, preempted, budget)
        stop: StopReason
        if preempted:
            stop = "preempted"
        elif config.strategy == "static" and was_running:
            stop = "batch" if self._waiting else "empty"
        else:
            stop, budget = self._schedule_waiting(scheduled, budget, now)
        entries = tuple(scheduled.values())
        prefill = sum(e.num_new_tokens for e in entries if e.kind != "decode")
        plan = StepPlan(
            index=self._steps,
            start_s=now,
            scheduled=entries,
            preempted=tuple(preempted),
            finished=tuple(finished),
            stop_reason=stop,
            num_batched_tokens=config.max_num_batched_tokens - budget,
            num_prefill_tokens=prefill,
            num_cache_queries=self._step_queries,
            num_cache_hits=self._step_hits,
        )
        if entries:
            self._steps += 1
            self._inflight = plan
            self._pool.step_started()  # from here, a freed block may still be written to
        return plan

    def complete(
        self,
        plan: StepPlan,
        now: float,
        *,
        tokens: Mapping[int, int] | None = None,
        stopped: Collection[int] = (),
        failed: Collection[int] = (),
    ) -> list[Finished]:
        """Record that ``plan``'s step ended at ``now``; return the sequences that ended.

        ``tokens``: each sampling sequence's new token id (appended to its ids; None when
        the owner counts only). ``stopped``: sequences whose new token ended them (a stop
        token or string; that token counts as produced). ``failed``: sequences the step
        failed for (outcome ``failed``; the owner holds the error). A sequence whose entry
        is ``final`` ends with reason ``length``. Sequences that ended while the step was
        in flight are skipped (their token is dropped).
        """
        if plan is not self._inflight:
            raise RuntimeError("complete() got a plan that is not the step in flight")
        self._inflight = None
        self._pool.step_ended()
        finished: list[Finished] = []
        seqs = self._seqs
        for entry in plan.scheduled:
            seq = seqs.get(entry.seq_id)
            if seq is None:
                continue  # ended while the step was in flight: its token is dropped
            if entry.seq_id in failed:
                finished.append(self._finish(seq, "failed", now))
                continue
            token = tokens[entry.seq_id] if tokens is not None and entry.samples else None
            done = self._complete_entry(seq, entry, now, token, entry.seq_id in stopped)
            if done is not None:
                finished.append(done)
        self.last_step = StepRecord(
            index=plan.index,
            start_s=plan.start_s,
            end_s=now,
            num_seqs=len(plan.scheduled),
            num_prefill_tokens=plan.num_prefill_tokens,
            num_decode_tokens=plan.num_batched_tokens - plan.num_prefill_tokens,
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            kv_blocks_used=self._pool.num_used,
            num_preempted=len(plan.preempted),
            stop_reason=plan.stop_reason,
            num_cache_queries=plan.num_cache_queries,
            num_cache_hits=plan.num_cache_hits,
        )
        return finished

    def _complete_entry(
        self, seq: SeqState, entry: Scheduled, now: float, token: int | None, stopped: bool
    ) -> Finished | None:
        """One entry of a completed step: its tokens computed, its sample; its end if it ended."""
        seq.num_computed += entry.num_new_tokens
        if self._pool.caching and seq.num_computed >= (seq.num_registered + 1) * (
            self._config.block_size
        ):
            self._register(seq)
        if not entry.samples:
            return None
        if token is not None and seq.token_ids is not None:
            seq.token_ids.append(token)
        seq.num_output += 1
        seq.num_tokens += 1
        seq.token_times_s.append(now)
        if entry.final:
            return self._finish(seq, "length", now)
        if stopped:
            return self._finish(seq, "stop", now)
        return None

    # -- runs of steps whose running sequences decode (the simulator's fast path) ----------

    def run_decodes(
        self,
        now: float,
        step_time: Callable[[int, int, int], float],
        *,
        admit: Callable[[float], float] | None = None,
        outputs: Callable[[int], Sequence[int]] | None = None,
        ended: Callable[[Sequence[Finished]], bool] | None = None,
    ) -> DecodeRun | None:
        """Carry out, from ``now``, the steps in which every running sequence decodes.

        For an owner that runs no model (the simulator). Each step is planned by the rules
        above, exactly as :meth:`schedule` and :meth:`complete` would, one at a time: the
        same records, token times, KV blocks (the same ids), admissions and prefix-cache
        registrations. What makes it cheap: a sequence that decodes is brought up to date
        only when something happens to it (it needs a KV block, registers one, ends) and
        at the end of the run, not every step. Waiting sequences are admitted by the
        rules' own code. The run stops before a step that the planned path must take:
        a decoding sequence needs a KV block none can give (a preemption), a deadline
        falls, a config is pending, or more run than the token budget; and after a step
        that left a sequence part-way through its prompt (a chunked prefill).

        Args:
            now: the first step's start.
            step_time: a step's time in seconds from its sequences, new tokens and
                context tokens (:meth:`StepPlan.num_context_tokens`); called once a step.
            admit: called with a step's start before it is planned: the owner adds what
                arrived by then (:meth:`add`) and returns when the next arrives (``math.inf``:
                never); not called again before that time.
            outputs: each sequence's output token ids by id (appended as :meth:`complete`
                appends ``tokens``); None: counted only.
            ended: called after each step that ended sequences, with those sequences;
                True ends the run after that step (an owner that has seen enough).

        Returns:
            The steps carried out; None (nothing changed but what ``admit`` added) when
            the first step is not one of them.
        """
        if not self._decoding():
            return None
        run = DecodeRun(self._steps)
        _DecodeSteps(self, outputs).carry_out(run, now, step_time, admit, ended)
        if not len(run):
            return None
        self._steps += len(run)
        self.last_step = run.record(len(run) - 1, with_context=False)
        return run

    def _decoding(self) -> bool:
        """Whether every running sequence decodes, and no step or config is pending."""
        if self._inflight is not None or self._pending_config is not None or not self._running:
            return False
        return all(
            seq.num_tokens - seq.num_computed == 1 and seq.num_output for seq in self._running
        )

    # -- the rules ----------------------------------------------------------------------

    def _schedule_running(
        self, scheduled: dict[int, Scheduled], preempted: list[int], budget: int
    ) -> int:
        """Rule 1: the running sequences, oldest first, preempting for KV room.

        The hot loop of a step (one pass per running sequence): KV bookkeeping is inlined,
        and :meth:`_make_room` is called only when a block is needed and none is free.
        """
        config = self.config
        threshold = config.long_prefill_token_threshold
        pool = self._pool
        block_size = config.block_size
        running = self._running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed
            want = seq.num_tokens - computed
            if 0 < threshold < want:
                want = threshold
            count = want if want < budget else budget
            more = -(-(computed + count) // block_size) - len(seq.block_table)
            if more > 0:
                if pool.can_allocate(more):
                    pool.allocate(seq.block_table, more)
                else:
                    before = len(preempted)
                    fits = self._make_room(seq, computed + count, preempted)
                    budget += self._unschedule(scheduled, preempted[before:])
                    if not fits:
                        break  # it was the newest: it preempted itself
                    i = running.index(seq)  # victims planned already may sit before it
            scheduled[seq.id] = self._entry(seq, count)
            budget -= count
            i += 1
        return budget

    def _schedule_waiting(
        self, scheduled: dict[int, Scheduled], budget: int, now: float
    ) -> tuple[StopReason, int]:
        """Rule 2: waiting sequences in order while seats, tokens and KV blocks last."""
        config = self.config
        threshold = config.long_prefill_token_threshold
        while True:
            seq = self._waiting.peek()
            if seq is None:
                return "empty", budget
            if budget <= 0:
                return "token_budget", budget
            if len(self._running) >= config.max_num_seqs:
                return "max_num_seqs", budget
            hits = self._prefix_hits(seq)
            start = len(hits) * config.block_size
            want = seq.num_tokens - start
            if 0 < threshold < want:
                want = threshold
            resumed = seq.num_preemptions > 0
            if want > budget and not config.enable_chunked_prefill and not resumed:
                return "token_budget", budget  # keeps FCFS order: see the module docstring
            count = min(want, budget)
            more = config.blocks_for(start + count) - len(hits)
            if not self._pool.can_take(hits, more):
                return "kv_blocks", budget
            self._waiting.pop()
            self._start(seq, hits, start, more)
            self._running.append(seq)
            seq.status = "running"
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = now
            scheduled[seq.id] = self._entry(seq, count)
            budget -= count

    def _sort_by_prefix(self) -> None:
        """``lpm``: the waiting sequences with the most cached prompt blocks first.

        Past ``_LPM_MAX_WAITING`` waiting the lookups cost more than they save and the queue
        stays in arrival order (SGLang's cut-off, 128).
        """
        if self._pool.caching and 1 < len(self._waiting) <= _LPM_MAX_WAITING:
            self._waiting.sort_by(lambda seq: -len(self._prefix_hits(seq)))

    def _start(self, seq: SeqState, hits: list[int], start: int, more: int) -> None:
        """Give a sequence leaving the waiting queue its cached blocks and ``more`` new ones."""
        pool = self._pool
        if pool.caching and seq.token_ids is not None:
            pool.take(seq.block_table, hits)
            seq.num_computed = seq.num_cached_tokens = start
            seq.num_registered = len(hits)
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += start
            self._step_queries += seq.num_tokens
            self._step_hits += start
        if more > 0:
            pool.allocate(seq.block_table, more)

    @staticmethod
    def _entry(seq: SeqState, count: int) -> Scheduled:
        computed, total = seq.num_computed, seq.num_tokens
        kind: Kind
        if seq.num_output and total - computed == 1:  # a prompt's last token is prefill
            kind = "decode"
        elif seq.num_output:
            kind = "resume"
        else:
            kind = "prefill"
        samples = computed + count == total
        final = samples and seq.num_output + 1 >= seq.max_tokens
        return Scheduled(seq.id, computed, count, samples, kind, final)

    # -- KV blocks ------------------------------------------------------------------------

    def _caching(self, config: GenerationConfig) -> bool:
        """Whether ``config`` caches prefixes here (unset: on for a model's own KV memory)."""
        on = config.enable_prefix_caching
        return self._fixed_pool if on is None else on

    def _hashes(self, seq: SeqState, n: int) -> list[int]:
        """``seq``'s first ``n`` block hashes (computed once: its known tokens never change)."""
        have = seq.block_hashes
        if len(have) < n and seq.token_ids is not None:
            size = self._config.block_size
            parent = have[-1] if have else None
            have += block_hashes(seq.token_ids[: n * size], size, parent, len(have))
        return have

    def _prefix_hits(self, seq: SeqState) -> list[int]:
        """The cached blocks ``seq`` starts with: all but its last token's at most (for logits)."""
        if not self._pool.caching or seq.token_ids is None:
            return []
        limit = (seq.num_tokens - 1) // self._config.block_size
        return self._pool.lookup(self._hashes(seq, limit)[:limit])

    def _register(self, seq: SeqState) -> None:
        """Cache ``seq``'s full blocks that the step just completed wrote."""
        full = seq.num_computed // self._config.block_size
        hashes = self._hashes(seq, full)
        table, register = seq.block_table, self._pool.register
        for i in range(seq.num_registered, min(full, len(hashes))):
            register(table[i], hashes[i])
        seq.num_registered = full

    def _kv_limit(self) -> int | None:
        """The model's pool in blocks, or None: ``config.num_kv_blocks`` is the limit."""
        return self._pool.capacity if self._fixed_pool else None

    def _fits(self, seq: SeqState, tokens: int) -> bool:
        more = self.config.blocks_for(tokens) - len(seq.block_table)
        return more <= 0 or self._pool.can_allocate(more)

    def _grow(self, seq: SeqState, tokens: int) -> None:
        more = self.config.blocks_for(tokens) - len(seq.block_table)
        if more > 0:
            self._pool.allocate(seq.block_table, more)

    def _make_room(self, seq: SeqState, tokens: int, preempted: list[int]) -> bool:
        """Preempt until ``seq`` can hold ``tokens``; False if ``seq`` itself was preempted."""
        while not self._fits(seq, tokens):
            victim = self._victim()
            self._preempt(victim)
            preempted.append(victim.id)
            if victim is seq:
                return False
        self._grow(seq, tokens)
        return True

    def _victim(self) -> SeqState:
        """The newest running sequence (by priority: the lowest-priority, newest one)."""
        if self.config.scheduling_policy == "priority":
            return max(self._running, key=lambda s: (s.priority, s.arrival_s, s.order))
        return self._running[-1]

    def _preempt(self, seq: SeqState) -> None:
        self._running.remove(seq)
        self._pool.free(seq.block_table)  # cached blocks stay cached: it may hit them again
        seq.block_table = []
        seq.num_computed = seq.num_registered = 0
        seq.status = "preempted"
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.push_front(seq)

    @staticmethod
    def _unschedule(scheduled: dict[int, Scheduled], preempted: list[int]) -> int:
        """Drop the entries of sequences preempted after they were planned; return their tokens.

        By priority, a victim may have been planned earlier in the same step.
        """
        returned = 0
        for seq_id in preempted:
            entry = scheduled.pop(seq_id, None)
            if entry is not None:
                returned += entry.num_new_tokens
        return returned

    # -- ends -------------------------------------------------------------------------------

    def _finish(
        self,
        seq: SeqState,
        reason: FinishReason,
        now: float,
        error: LabServeError | None = None,
    ) -> Finished:
        """Give ``seq`` its one outcome and free what it holds."""
        if seq.status == "running":
            self._running.remove(seq)
        else:
            self._waiting.forget()  # waiting: skipped when it reaches the head
        seq.status = "finished"
        seq.finish_reason = reason
        del self._seqs[seq.id]
        if seq.block_table:
            self._pool.free(seq.block_table)
            seq.block_table = []
        return Finished(
            seq_id=seq.id,
            outcome=_OUTCOME[reason],
            reason=reason,
            arrival_s=seq.arrival_s,
            end_s=now,
            prompt_len=seq.prompt_len,
            token_times_s=tuple(seq.token_times_s),
            num_preemptions=seq.num_preemptions,
            seq=seq,
            error=error,
        )

    def _apply_config(self, config: GenerationConfig, now: float) -> list[Finished]:
        """Put ``config`` in force; end the live sequences it can never run (``stranded``)."""
        self._pending_config = None
        old, self._config = self._config, config
        if not self._fixed_pool:
            self._resize_account(old, config)
        caching = self._caching(config)
        if caching != self._pool.caching or config.block_size != old.block_size:
            self._pool.set_caching(False)  # hashes go: off, or keyed by the old block size
            self._pool.set_caching(caching)
            for seq in self._seqs.values():
                seq.num_registered = 0  # on again: what they computed is registered anew
                if config.block_size != old.block_size:
                    seq.block_hashes = []
        self._waiting.reorder(config.scheduling_policy)
        # A sequence that has run (running, or preempted to be recomputed) computes what
        # is left of its prefill in chunks whatever the chunking setting (rules 1 and 2),
        # so only a new one is held to the token budget.
        chunked = config.replace(enable_chunked_prefill=True)
        stranded = []
        for seq in list(self._seqs.values()):
            try:
                rules = config if seq.status == "waiting" else chunked
                check_admission(
                    seq.prompt_len, seq.max_tokens, rules, self.max_model_len, self._kv_limit()
                )
            except LabServeError as error:
                stranded.append(self._finish(seq, "stranded", now, error))
        return stranded

    def _resize_account(self, old: GenerationConfig, config: GenerationConfig) -> None:
        """Follow a live ``num_kv_blocks`` or ``block_size`` change (an account, not memory).

        Between steps, so nothing is parked. A new block size re-counts each running
        sequence's computed tokens; a pool shrunk below what is held stays over until the
        newest running sequences are preempted for room (rule 1).
        """
        if config.block_size != old.block_size:
            for seq in self._running:
                self._pool.free(seq.block_table)
                seq.block_table = []
        if config.num_kv_blocks != old.num_kv_blocks or config.block_size != old.block_size:
            self._pool.resize(config.num_kv_blocks)
        if config.block_size != old.block_size:
            for seq in self._running:
                self._pool.allocate(
                    seq.block_table, config.blocks_for(seq.num_computed), force=True
                )


class _DecodeSteps:
    """One :meth:`Scheduler.run_decodes` run: its steps in order.

    Decoding sequence ``i`` (numbered as it joins the run, in running order) joined at
    step ``done[i]`` with its counts then; at step ``j`` it computes one token at position
    ``num_computed + j - done[i]``, reading ``owns[i] + j`` context tokens. Its counts are
    brought up to date (``done[i]`` moved on) only when an event needs them (a registered
    block, its end) and when the run ends. It needs a new KV block every ``block_size``
    steps: sequences are bucketed by that step modulo the block size, so a step looks at
    one bucket (lesson 10 at ``max_num_seqs`` 32: about 2 sequences a step).
    """

    def __init__(self, sched: Scheduler, outputs: Callable[[int], Sequence[int]] | None) -> None:
        self.sched = sched
        self.pool = sched.pool
        self.config = sched.config  # a pending config ends the run before its step
        self.outputs = outputs
        self.size = self.config.block_size
        self.running: list[SeqState] = []  # every sequence that decoded in the run
        self.active: list[int] = []  # those still running, in running order
        self.done: list[int] = []  # steps each one's counts include
        self.firsts: list[int] = []  # the step of its next new block
        self.lasts: list[int] = []  # the step that samples its last token
        self.owns: list[int] = []
        self.buckets: list[list[int]] = [[] for _ in range(self.size)]
        self.ending: dict[int, list[int]] = {}
        self.own = 0  # the sum of ``owns`` over the active
        self.ends: list[float] = []
        self.stop: StopReason = "empty"  # why the last step took no more waiting sequences
        self.stop_after = False

    def join(self, seq: SeqState, base: int) -> None:
        """``seq`` decodes from step ``base`` on (it sampled at the step before)."""
        spare = len(seq.block_table) * self.size - seq.num_computed
        if spare < 0:  # re-counted after a block size change: the planned path grows it
            self.stop_after = True
            return
        i = len(self.running)
        self.running.append(seq)
        self.active.append(i)
        self.done.append(base)
        self.firsts.append(base + spare)
        self.buckets[(base + spare) % self.size].append(i)
        last = base + seq.max_tokens - seq.num_output - 1
        self.lasts.append(last)
        self.ending.setdefault(last, []).append(i)
        own = seq.num_computed - base + 1
        self.owns.append(own)
        self.own += own

    def carry_out(
        self,
        run: DecodeRun,
        now: float,
        step_time: Callable[[int, int, int], float],
        admit: Callable[[float], float] | None,
        ended: Callable[[Sequence[Finished]], bool] | None = None,
    ) -> None:
        """Step after step, while the planned path is not needed (and ``ended`` allows)."""
        sched = self.sched
        for seq in sched._running:
            self.join(seq, 0)
        self.ends = run.end_s
        budget = self.config.max_num_batched_tokens
        start, j, arrival = now, 0, -math.inf
        while not self.stop_after:
            if admit is not None and start >= arrival:
                arrival = admit(start)
            deadline = sched.next_deadline_s
            if (
                sched._pending_config is not None
                or (deadline is not None and deadline <= start)
                or not sched._seqs
                or len(self.active) > budget
            ):
                break
            seen = len(run.finished)
            end = self.step(run, j, start, step_time)
            if end is None:
                break
            start, j = end, j + 1
            if ended is not None and len(run.finished) > seen and ended(run.finished[seen:]):
                break
            start, j = self.coast(run, start, j, arrival, step_time)
        for i in self.active:
            self.catch_up(i, j)

    def step(
        self, run: DecodeRun, j: int, start: float, step_time: Callable[[int, int, int], float]
    ) -> float | None:
        """Plan, time and complete step ``j``; its end, or None (nothing done).

        None: the planned path must take it (a decode needs a block none can give: a
        preemption), or there is nothing to run.
        """
        sched, pool, config = self.sched, self.pool, self.config
        firsts = self.firsts
        need = [i for i in self.buckets[j % self.size] if firsts[i] <= j]
        if need and not pool.can_allocate(len(need)):
            return None
        if config.scheduling_policy == "lpm":
            sched._sort_by_prefix()
        running = self.running
        for i in need:  # rule 1: the decodes, in running order
            pool.allocate(running[i].block_table, 1)
        alive = len(self.active)
        sched._step_queries = sched._step_hits = 0
        new = self.admissions(alive, start)
        if not alive and not new:
            return None
        ctx = self.own + alive * j
        batched = prefill = 0
        for e in new:
            n = e.num_new_tokens
            batched += n
            prefill += n if e.kind != "decode" else 0
            ctx += n * e.start + n * (n + 1) // 2
        end = start + step_time(alive + len(new), alive + batched, ctx)
        if self.pool.caching or j in self.ending:
            self.complete_decodes(j, end, run)
        if new:
            self.complete_new(new, j, end, run)
        run.start_s.append(start)
        run.end_s.append(end)
        run.num_seqs.append(alive + len(new))
        run.num_prefill_tokens.append(prefill)
        run.num_decode_tokens.append(alive + batched - prefill)
        run.num_context_tokens.append(ctx)
        run.stop_reason.append(self.stop)
        run.num_running.append(len(sched._running))
        run.num_waiting.append(len(sched._waiting))
        run.kv_blocks_used.append(pool.num_used)
        run.num_cache_queries.append(sched._step_queries)
        run.num_cache_hits.append(sched._step_hits)
        return end

    def coast(
        self,
        run: DecodeRun,
        start: float,
        j: int,
        arrival: float,
        step_time: Callable[[int, int, int], float],
    ) -> tuple[float, int]:
        """The steps from ``j`` in which only decodes happen, in a tight loop; where it stopped.

        Until the next arrival, deadline or end, a step that cannot admit (nothing waits,
        or the batch is full) repeats the last one but for its KV blocks and times. Not
        with prefix caching or a bounded pool (registrations and room to check each step).
        """
        sched, pool = self.sched, self.pool
        stop = self.steady()
        if stop is None or self.stop_after or not self.active or pool.caching or pool.capacity:
            return start, j
        if sched._pending_config is not None:
            return start, j
        deadline = sched.next_deadline_s
        limit = arrival if deadline is None else min(arrival, deadline)
        until = min(self.ending) if self.ending else math.inf
        alive, own, size = len(self.active), self.own, self.size
        buckets, firsts, running = self.buckets, self.firsts, self.running
        starts, ends, contexts, held = (
            run.start_s,
            run.end_s,
            run.num_context_tokens,
            run.kv_blocks_used,
        )
        first, used = j, pool.num_used
        add_start, add_end, add_context, add_used = (
            starts.append,
            ends.append,
            contexts.append,
            held.append,
        )
        allocate = pool.allocate
        while j < until and start < limit:
            bucket = buckets[j % size]
            if bucket:
                for i in bucket:
                    if firsts[i] <= j:
                        allocate(running[i].block_table, 1)
                used = pool.num_used
            ctx = own + alive * j
            end = start + step_time(alive, alive, ctx)
            add_start(start)
            add_end(end)
            add_context(ctx)
            add_used(used)
            start, j = end, j + 1
        k = j - first
        run.num_seqs += [alive] * k
        run.num_decode_tokens += [alive] * k
        run.stop_reason += [stop] * k
        run.num_running += [len(sched._running)] * k
        run.num_waiting += [len(sched._waiting)] * k
        for column in (run.num_prefill_tokens, run.num_cache_queries, run.num_cache_hits):
            column += [0] * k
        return start, j

    def steady(self) -> StopReason | None:
        """Why the next step would admit nothing, if nothing but time changes; else None."""
        sched, config, alive = self.sched, self.config, len(self.active)
        if not sched._waiting:
            return "empty"
        if config.strategy == "static":
            return "batch" if alive else None
        if config.max_num_batched_tokens - alive <= 0:
            return "token_budget"
        return "max_num_seqs" if alive >= config.max_num_seqs else None

    def admissions(self, alive: int, start: float) -> tuple[Scheduled, ...]:
        """Rule 2 (the rules' own code) with what the decodes left of the token budget."""
        sched, config = self.sched, self.config
        if not sched._waiting:  # what rule 2 finds first: nothing waits
            self.stop = "empty"
            return ()
        if config.strategy == "static" and alive:
            self.stop = "batch"
            return ()
        scheduled: dict[int, Scheduled] = {}
        self.stop, _ = sched._schedule_waiting(
            scheduled, config.max_num_batched_tokens - alive, start
        )
        return tuple(scheduled.values())

    def complete_decodes(self, j: int, end: float, run: DecodeRun) -> None:
        """Step ``j``'s completion for the decoding sequences something happens to."""
        if self.pool.caching:
            todo = self.completing(j)
            self.ending.pop(j, None)
        else:
            todo = self.ending.pop(j)
        for i in todo:
            if self.complete(i, j, end, run):
                self.active.remove(i)
                self.buckets[self.firsts[i] % self.size].remove(i)
                self.own -= self.owns[i]

    def complete_new(self, new: tuple[Scheduled, ...], j: int, end: float, run: DecodeRun) -> None:
        """Step ``j``'s completion for the sequences it admitted; those that sampled join."""
        sched, outputs = self.sched, self.outputs
        for entry in new:
            seq = sched._seqs[entry.seq_id]
            token = None
            if outputs is not None and entry.samples:
                token = outputs(seq.id)[seq.num_output]
            done = sched._complete_entry(seq, entry, end, token, False)
            if done is not None:
                run.finished.append(done)
            elif seq.num_tokens - seq.num_computed == 1 and seq.num_output:
                self.join(seq, j + 1)
            else:
                self.stop_after = True  # part-way through its prompt: the planned path

    def completing(self, j: int) -> list[int]:
        """With prefix caching: the sequences that register a block or end after step ``j``."""
        size, lasts, done = self.size, self.lasts, self.done
        out = []
        for i in self.active:
            seq = self.running[i]
            computed = seq.num_computed + (j - done[i]) + 1  # after step j
            if lasts[i] == j or computed >= (seq.num_registered + 1) * size:
                out.append(i)
        return out

    def complete(self, i: int, j: int, end: float, run: DecodeRun) -> bool:
        """Step ``j``'s completion for decoding sequence ``i``; True if it ended."""
        seq = self.running[i]
        self.catch_up(i, j)
        final = self.lasts[i] == j
        entry = Scheduled(seq.id, seq.num_computed, 1, True, "decode", final)
        outputs = self.outputs
        token = outputs(seq.id)[seq.num_output] if outputs is not None else None
        done = self.sched._complete_entry(seq, entry, end, token, False)
        self.done[i] = j + 1
        if done is None:
            return False
        run.finished.append(done)
        return True

    def catch_up(self, i: int, steps: int) -> None:
        """Bring sequence ``i``'s counts to include the run's first ``steps`` steps."""
        at = self.done[i]
        k = steps - at
        if k <= 0:
            return
        seq = self.running[i]
        seq.num_computed += k
        if self.outputs is not None and seq.token_ids is not None:
            o = seq.num_output
            seq.token_ids.extend(self.outputs(seq.id)[o : o + k])
        seq.num_output += k
        seq.num_tokens += k
        seq.token_times_s.extend(self.ends[at:steps])
        self.done[i] = steps
