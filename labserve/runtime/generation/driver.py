"""The continuous-batching driver: runs a generative method's step scheduler with its model.

Each step: the scheduler plans on the loop (which sequences compute how many tokens, who
is preempted, who ended); a worker thread frees the model state of sequences that ended
or were preempted, runs the model on the step's :class:`SeqBatch`, and picks each sampling
sequence's next token and text (:class:`SequenceSampler`, per sequence, so a sequence's
tokens never depend on its neighbours); back on the loop the scheduler completes the step,
the callers get their pieces (one hand-off per event loop per step, not per token), and
the next step is planned at once. Arrivals of one loop iteration join the same step.

The scheduler (:class:`~labserve.generation.scheduler.Scheduler`) owns every piece of a
sequence's state: the config in force, its one record and status, its deadline, the
admission and stop decisions. The driver keeps none of it: it carries the scheduler's
decisions out (model calls, timers, answers) and reads the rest through it.

Every admitted sequence ends in exactly one outcome, given to its stream once: its tokens
and finish; a typed error at admission (InputError, LengthLimitError, QueueFullError), or
the same error later when a live config change leaves it a sequence that can never run;
RequestTimeoutError when its timeout passes, even while a step hangs (the deadline timer
ends it at once); ModelError when the step, or its own sampling, fails (the step's
sequences, or only the poisoned ones with ``isolate_errors``, by bisecting the step after
the model's ``rollback_step``; a sequence whose logits row, token or text fails fails
alone, whatever ``isolate_errors`` says); CancelledRequestError when the caller withdrew;
RunnerStoppedError when the runner stopped before it ended (no step starts after that).

Time, timers, loop callbacks and worker threads come from one injected
:class:`~labserve.runtime.scheduling.Host`: labserve's background loop in a notebook, a
virtual one in tests. Thread-safe: :meth:`submit_threadsafe`, :meth:`admit_later`,
:meth:`cancel_threadsafe`, :meth:`refuse`, :meth:`configure`, :meth:`snapshot`,
:meth:`reset_stats` and the properties. Loop-only: the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from labserve.base.errors import (
    CancelledRequestError,
    LabServeError,
    ModelError,
    RequestTimeoutError,
    RunnerStoppedError,
)
from labserve.config.generation import GenerationConfig
from labserve.generation.api import Finish
from labserve.generation.batch import SeqBatch
from labserve.generation.sampling import SequenceSampler
from labserve.generation.scheduler import Scheduler
from labserve.generation.sequence import Finished, Scheduled, StepPlan
from labserve.generation.stats import GenerationRecorder, GenerationSnapshot
from labserve.runtime.generation.streams import AnyStream, End, feed_streams
from labserve.runtime.scheduling import Host, Timer

__all__ = ["Caller", "GenerationDriver", "GenerativeModel", "NewSequence"]


@dataclass(frozen=True)
class GenerativeModel:
    """A generative method's model and the hooks labserve calls (None: it has none)."""

    step: Callable[[SeqBatch], Any]
    """Advances a batch by one step; next-token logits (rows) or token ids, per sampler."""
    free_sequences: Callable[[Sequence[int]], None] | None = None
    """Drops the state of sequences that ended or were preempted."""
    rollback_step: Callable[[SeqBatch], None] | None = None
    """Undoes a step that raised (each sequence's state back to before it)."""
    allocate_kv: Callable[[int, int], Sequence[Any]] | None = None
    """Present: the model stores K/V in labserve's blocks. Called once, at start, with the
    pool's blocks and block size; returns the arrays it allocated (each with ``nbytes``)."""

    @property
    def paged(self) -> bool:
        """Whether the model stores K/V in labserve's blocks (each step carries block tables)."""
        return self.allocate_kv is not None


@dataclass(frozen=True, slots=True)
class NewSequence:
    """A checked call, ready for admission: its prompt's ids, sampler, stream and arrival."""

    token_ids: list[int]
    sampler: SequenceSampler
    stream: AnyStream
    arrival_s: float


@dataclass(frozen=True, slots=True)
class Caller:
    """The driver's handle on an admitted sequence (kept on its scheduler record)."""

    sampler: SequenceSampler
    stream: AnyStream


@dataclass(frozen=True, slots=True)
class _StepResult:
    """What a worker hands back: each sampled sequence's token and piece, who stopped, failed."""

    tokens: dict[int, int]
    pieces: dict[int, str]
    stopped: set[int]
    failed: dict[int, BaseException]


class GenerationDriver:
    """Drives one generative method's step scheduler with its model. See the module."""

    def __init__(
        self,
        model: GenerativeModel,
        config: GenerationConfig,
        *,
        host: Host,
        runner: str,
        method: str,
        max_model_len: int = 0,
        kv_pool_blocks: int = 0,
    ) -> None:
        self.runner = runner
        self.method = method
        self._name = f"{runner}.{method}"
        self._model = model
        self._rt = host
        self._now = host.now
        self._kv_bytes = 0
        if model.allocate_kv is not None:  # before the first step: the model's KV memory
            if kv_pool_blocks < 1:
                raise ValueError("a model that stores K/V in labserve's blocks needs a pool")
            arrays = model.allocate_kv(kv_pool_blocks, config.block_size)
            self._kv_bytes = sum(int(a.nbytes) for a in arrays)
        else:
            kv_pool_blocks = 0
        self._steps = Scheduler(
            config, max_model_len=max_model_len, name=self._name, kv_pool_blocks=kv_pool_blocks
        )
        self._lock = threading.Lock()  # guards the recorder
        self._recorder = GenerationRecorder()
        self._ids = itertools.count(1)
        self._deadline = Timer(host, self._on_deadline)
        self._busy = False  # a step is in a worker
        self._kick_queued = False
        self._free: list[int] = []  # sequences whose model state is to be dropped
        self._closed = False  # new sequences are refused
        self._stopped = False  # no step starts (the runner stopped)
        self._drained: asyncio.Future[None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop this driver runs on (None on virtual time)."""
        return self._rt.loop

    @property
    def config(self) -> GenerationConfig:
        """The latest config asked for (its step settings in force from the next step)."""
        return self._steps.latest_config

    @property
    def step_in_flight(self) -> bool:
        """Whether a model step is running in a worker."""
        return self._busy

    @property
    def scheduler(self) -> Scheduler:
        """The step scheduler, owner of every sequence's state (read it on the loop only)."""
        return self._steps

    # -- the thread-safe doors ---------------------------------------------------------------

    def new_id(self) -> int:
        """A fresh sequence id. Thread-safe (``itertools.count`` under the GIL)."""
        return next(self._ids)

    def submit_threadsafe(
        self, seq_id: int, new: NewSequence, admitted: Future[None] | None = None
    ) -> None:
        """Admit a sequence from any thread; a loop that is closed answers it stopped.

        ``admitted``: settled once the scheduler decided (its refusal set on it instead of
        on the stream), so that a blocking caller raises it at once.
        """
        try:
            self._rt.call_soon_threadsafe(self.submit, seq_id, new, admitted)
        except RuntimeError:
            error = RunnerStoppedError(self.runner)
            if admitted is not None:
                admitted.set_exception(error)
            else:
                _answer(new.stream, End(None, (), error), None)

    def admit_later(
        self, seq_id: int, prepare: Callable[[], NewSequence], stream: AnyStream
    ) -> None:
        """Check a call in a worker thread (tokenising off the loop), then admit it.

        ``prepare`` raises the call's typed error (answered on ``stream``, counted refused).
        Any thread.
        """

        def work() -> None:
            try:
                new = prepare()
            except LabServeError as exc:
                self.refuse(stream, exc)
                return
            self.submit_threadsafe(seq_id, new)

        try:
            self._rt.submit(work)
        except RuntimeError:
            _answer(stream, End(None, (), RunnerStoppedError(self.runner)), None)

    def refuse(self, stream: AnyStream | None, error: LabServeError) -> None:
        """Count a call refused before admission; answer ``stream`` (None: raised instead)."""
        with self._lock:
            self._recorder.refused()
        if stream is not None:
            _answer(stream, End(None, (), error), None)

    def cancel_threadsafe(self, seq_id: int) -> None:
        """Withdraw a sequence from any thread."""
        try:
            self._rt.call_soon_threadsafe(self.cancel, seq_id)
        except RuntimeError:
            pass  # the loop is closed: the sequence was answered when it stopped

    def configure(self, config: GenerationConfig) -> None:
        """Ask for ``config``: arrival settings act now, the rest at the next step. Any thread."""
        self._steps.configure(config)
        try:  # an idle driver plans a step now, so that a change that strands ends them
            self._rt.call_soon_threadsafe(self._kick_soon)
        except RuntimeError:
            pass  # nothing runs: the next schedule applies it

    def snapshot(self) -> GenerationSnapshot:
        """The method's figures now. Thread-safe (counts as of the last step)."""
        steps = self._steps
        with self._lock:
            return self._recorder.snapshot(
                self._now(),
                steps.latest_config,
                runner=self.runner,
                method=self.method,
                running=steps.num_running,
                waiting=steps.num_waiting,
                kv_blocks_used=steps.kv_blocks_used,
                kv_blocks_total=steps.kv_blocks_total,
                kv_bytes=self._kv_bytes,
                kv_memory="model" if self._model.paged else "accounting",
                kv_blocks_cached=steps.kv_blocks_cached,
            )

    def reset_stats(self) -> None:
        """Forget recorded sequences and steps. Thread-safe."""
        with self._lock:
            self._recorder.reset(self._now())

    # -- events on the loop -------------------------------------------------------------------

    def submit(self, seq_id: int, new: NewSequence, admitted: Future[None] | None = None) -> None:
        """Admit a sequence. Loop-only. A refusal is its stream's typed error (or admitted's)."""
        error: LabServeError | None = None
        if self._closed or self._rt.closing:
            error = RunnerStoppedError(self.runner)
        elif new.stream.withdrawn:
            error = CancelledRequestError(self._name)  # its caller left: nothing to run
        else:
            error = self._admit(seq_id, new)
        if admitted is not None:
            if error is None:
                admitted.set_result(None)
            else:
                admitted.set_exception(error)
        elif error is not None:
            _answer(new.stream, End(None, (), error), self._rt.loop)

    def _admit(self, seq_id: int, new: NewSequence) -> LabServeError | None:
        """The scheduler's one admission decision; its refusal, counted, or None."""
        params = new.sampler.params
        try:
            self._steps.add(
                seq_id,
                len(new.token_ids),
                params.max_tokens,
                new.arrival_s,
                priority=params.priority,
                token_ids=new.token_ids,
                handle=Caller(new.sampler, new.stream),
            )
        except LabServeError as exc:
            self.refuse(None, exc)
            return exc
        self._arm_deadline()
        self._kick_soon()
        return None

    def cancel(self, seq_id: int) -> None:
        """Withdraw a sequence (its caller left): it ends now, counted cancelled. Loop-only."""
        done = self._steps.abort(seq_id, "cancelled", self._now())
        if done is not None:
            self._file(done)  # nobody listens any more: no answer
            self._kick()

    def _kick_soon(self) -> None:
        if not self._kick_queued:  # the arrivals of this loop iteration join one step
            self._kick_queued = True
            self._rt.call_soon(self._kick)

    def _on_deadline(self, _due_s: float) -> None:
        """End every sequence past its timeout now, even while a step hangs."""
        self._answer_all(self._steps.expire(self._now()), {})
        self._arm_deadline()
        self._kick()

    def _arm_deadline(self) -> None:
        self._deadline.set(self._steps.next_deadline_s, self._now())

    # -- the step -------------------------------------------------------------------------------

    def _kick(self) -> None:
        """Plan and start the next step unless one is in a worker. Loop-only."""
        self._kick_queued = False
        if self._busy or self._stopped:
            return
        plan = self._steps.schedule(self._now())
        self._answer_all(plan.finished, {})
        self._arm_deadline()
        free = self._free + list(plan.preempted)
        self._free = []
        if plan.empty:
            self._free_now(free)  # no step runs: nothing else touches the model
            self._maybe_drained()
            return
        batch, samplers = self._batch(plan)
        self._busy = True
        try:
            self._rt.submit(self._run_step, plan, batch, samplers, free)
        except RuntimeError:  # the workers shut down: the runner is stopping
            self._busy = False
            self.abort()  # ends every sequence, the planned ones included
            self._steps.complete(plan, self._now())

    def _batch(self, plan: StepPlan) -> tuple[SeqBatch, list[tuple[Scheduled, SequenceSampler]]]:
        """The step's model input, and the sampler of each sequence that samples."""
        steps = self._steps
        tokens = []
        samplers = []
        for e in plan.scheduled:
            seq = steps.sequence(e.seq_id)
            ids = seq.token_ids
            assert ids is not None  # the driver admits every sequence with its ids
            tokens.append(np.asarray(ids[e.start : e.start + e.num_new_tokens], dtype=np.int64))
            if e.samples:
                samplers.append((e, seq.handle.sampler))
        batch = SeqBatch(
            tuple(e.seq_id for e in plan.scheduled),
            tuple(tokens),
            tuple(e.start for e in plan.scheduled),
            tuple(e.samples for e in plan.scheduled),
            *self._tables(plan),
        )
        return batch, samplers

    def _tables(self, plan: StepPlan) -> tuple[tuple[tuple[int, ...], ...], int]:
        """The step's block tables and block size, for a model that stores K/V in our blocks.

        Copies: the scheduler's tables change at the next plan, while this step may run on.
        """
        if not self._model.paged:
            return (), 0
        steps = self._steps
        tables = tuple(tuple(steps.sequence(e.seq_id).block_table) for e in plan.scheduled)
        return tables, steps.config.block_size

    def _run_step(
        self,
        plan: StepPlan,
        batch: SeqBatch,
        samplers: list[tuple[Scheduled, SequenceSampler]],
        free: list[int],
    ) -> None:
        """In a worker: free, run the model, sample; then hand the step back to the loop.

        Whatever raises in a model hook fails the step's sequences with its message; what
        raises in one sequence's sampling fails that sequence alone. The step always comes
        back, so no caller is left waiting.
        """
        try:
            if free and self._model.free_sequences is not None:
                self._model.free_sequences(free)
            rows, failed = self._attempt(batch)
            result = self._sample(samplers, rows, failed)
        except Exception as exc:
            error = ModelError(self._name, exc, len(batch))
            result = _StepResult({}, {}, set(), dict.fromkeys(batch.seq_ids, error))
        try:
            self._rt.call_soon_threadsafe(self._step_done, plan, result)
        except RuntimeError:
            pass  # the loop closed: every caller was answered when it stopped

    def _attempt(self, batch: SeqBatch) -> tuple[dict[int, Any], dict[int, BaseException]]:
        """Run the model on ``batch``: each sampling sequence's row, or why it failed.

        With ``isolate_errors`` a step that raises is rolled back and bisected, so that
        only the sequences that raise alone fail.
        """
        try:
            rows = _rows(self._model.step(batch), batch)
        except Exception as exc:
            model = self._model
            if model.rollback_step is not None:
                model.rollback_step(batch)
            # A paged model needs no rollback: a retried sequence's slots are rewritten.
            undoable = model.rollback_step is not None or model.paged
            isolate = self._steps.config.isolate_errors and undoable
            if not isolate or len(batch) == 1:
                error = ModelError(self._name, exc, len(batch))
                return {}, dict.fromkeys(batch.seq_ids, error)
            half = len(batch) // 2
            rows_a, failed_a = self._attempt(batch.subset(list(range(half))))
            rows_b, failed_b = self._attempt(batch.subset(list(range(half, len(batch)))))
            return rows_a | rows_b, failed_a | failed_b
        return rows, {}

    def _sample(
        self,
        samplers: list[tuple[Scheduled, SequenceSampler]],
        rows: dict[int, Any],
        failed: dict[int, BaseException],
    ) -> _StepResult:
        """Each sampling sequence's next token and text (in the worker: per-sequence state).

        Picking, detokenising and the stop checks of one sequence fail that one alone.
        """
        tokens: dict[int, int] = {}
        pieces: dict[int, str] = {}
        stopped: set[int] = set()
        for entry, sampler in samplers:
            seq_id = entry.seq_id
            if seq_id in failed:
                continue
            try:
                token = sampler.choose(rows[seq_id])
                text, stop = sampler.push(token, entry.final)
            except Exception as exc:
                failed[seq_id] = ModelError(self._name, exc, 1)
                continue
            tokens[seq_id] = token
            pieces[seq_id] = text
            if stop:
                stopped.add(seq_id)
        return _StepResult(tokens, pieces, stopped, failed)

    def _step_done(self, plan: StepPlan, result: _StepResult) -> None:
        """Back on the loop: complete the step, answer the callers, plan the next one."""
        self._busy = False
        steps = self._steps
        finished = steps.complete(
            plan,
            self._now(),
            tokens=result.tokens,
            stopped=result.stopped,
            failed=result.failed.keys(),
        )
        record = steps.last_step
        if record is not None:
            # The attention's context read, for fitting a step's cost (the record lacks it).
            record = dataclasses.replace(record, num_context_tokens=plan.num_context_tokens)
            with self._lock:
                self._recorder.step(record)
        pieces = result.pieces
        self._answer_all(finished, pieces, result.failed)
        items: list[tuple[AnyStream, list[str], End | None]] = []
        for seq_id, text in pieces.items():
            if text and seq_id in steps:
                items.append((steps.sequence(seq_id).handle.stream, [text], None))
        feed_streams(items, self._rt.loop)
        if self._stopped:
            self._free_now(self._free)
            self._free = []
        else:
            self._kick()

    # -- ends -------------------------------------------------------------------------------

    def _answer_all(
        self,
        ended: Sequence[Finished],
        pieces: dict[int, str],
        errors: dict[int, BaseException] | None = None,
    ) -> None:
        """File each ended sequence's outcome and give its caller its end (with its last piece)."""
        items: list[tuple[AnyStream, list[str], End | None]] = []
        for done in ended:
            self._file(done)
            if done.reason == "cancelled" and not self._stopped:
                continue  # withdrawn: nobody listens
            seq = done.seq
            assert seq is not None
            end = self._end_of(done, (errors or {}).get(done.seq_id))
            items.append((seq.handle.stream, [pieces.pop(done.seq_id, "")], end))
        if items:
            feed_streams(items, self._rt.loop)

    def _file(self, done: Finished) -> None:
        """Record a sequence's one outcome (without its record) and free its model state."""
        with self._lock:
            self._recorder.finished(dataclasses.replace(done, seq=None))
        self._free.append(done.seq_id)

    def _end_of(self, done: Finished, error: BaseException | None) -> End:
        seq = done.seq
        assert seq is not None
        generated = seq.output_ids
        if done.reason in ("length", "stop"):
            finish = Finish(done.reason, seq.prompt_len, len(done.token_times_s))
            return End(finish, generated)
        if done.reason == "timeout":
            error = RequestTimeoutError(self._name, done.end_s - done.arrival_s, seq.timeout_s)
        elif done.reason == "cancelled":
            error = RunnerStoppedError(self.runner)  # withdrawn ones are not answered
        elif done.reason == "stranded":
            error = done.error
        if error is None:  # failed without a recorded cause: cannot happen
            error = ModelError(self._name, RuntimeError("the step failed"), 1)
        return End(None, generated, error)

    def _free_now(self, free: list[int]) -> None:
        if free and self._model.free_sequences is not None:
            self._model.free_sequences(free)

    # -- closing ------------------------------------------------------------------------------

    def _maybe_drained(self) -> None:
        drained = self._drained
        if drained is not None and not drained.done() and not self._steps.has_work:
            drained.set_result(None)

    async def aclose(self) -> None:
        """Refuse new sequences, let the admitted ones finish; idempotent. Loop-only.

        Cancelled (the runner's stop timed out), it ends every sequence still alive with
        RunnerStoppedError, and no step starts after that.
        """
        self._closed = True
        if self._steps.has_work or self._busy:
            loop = asyncio.get_running_loop()
            self._drained = loop.create_future()
            try:
                await self._drained
            except asyncio.CancelledError:
                self.abort()
                raise
        self._deadline.cancel()

    def abort(self) -> None:
        """End every live sequence with RunnerStoppedError now; no step starts after. Loop-only.

        A step in flight comes back to nothing; the model's state of every sequence is
        freed once no step runs.
        """
        self._closed = self._stopped = True
        self._deadline.cancel()
        self._answer_all(self._steps.abort_all("cancelled", self._now()), {})
        if not self._busy:
            self._free_now(self._free)
            self._free = []


def _answer(stream: AnyStream, end: End, home: asyncio.AbstractEventLoop | None) -> None:
    feed_streams([(stream, [], end)], home)


def _rows(out: Any, batch: SeqBatch) -> dict[int, Any]:
    """The model's output as one row (logits, or a token id) per sampling sequence."""
    sampling = [i for i, s in zip(batch.seq_ids, batch.samples, strict=True) if s]
    arr = np.asarray(out)
    if arr.ndim == 1 and np.issubdtype(arr.dtype, np.integer) and arr.shape[0] == len(sampling):
        return {i: int(t) for i, t in zip(sampling, arr.tolist(), strict=True)}
    if arr.ndim == 2 and arr.shape[0] == len(sampling):
        return dict(zip(sampling, arr, strict=True))
    raise ValueError(
        f"a generative step must return logits of shape (sequences sampling, vocab) or one "
        f"token id per sampling sequence; {len(sampling)} sample this step, the model returned "
        f"{arr.dtype} of shape {arr.shape}"
    )
