"""The continuous-batching driver: runs a generative method's Scheduler with its model.

Each step: the scheduler plans on the loop (which sequences compute how many tokens, who
is preempted, who ended); a worker thread frees the model state of sequences that ended
or were preempted, runs the model on the step's :class:`SeqBatch`, picks each sampling
sequence's next token and text (:class:`SequenceSampler`, per sequence, so a sequence's
tokens never depend on its neighbours); back on the loop the scheduler completes the step,
the callers get their pieces (one hand-off per event loop per step, not per token), and
the next step is planned at once. Arrivals of one loop iteration join the same step.

Every admitted sequence ends in exactly one outcome, given to its stream once: its tokens
and finish; a typed error at admission (InputError, LengthLimitError, QueueFullError);
RequestTimeoutError when ``request_timeout_ms`` passes, even while a step hangs (the
deadline timer answers the caller; the scheduler accounts for it at the next step);
ModelError when a step raises (only the poisoned sequences with ``isolate_errors``, by
bisecting the step after the model's ``rollback_step``); CancelledRequestError when the
caller withdrew; RunnerStoppedError when the runner stopped before it ended.

Time, timers, loop callbacks and worker threads come from one injected
:class:`~labserve.runtime.scheduling.Scheduler`: labserve's background loop in a notebook,
a virtual one in tests. Thread-safe: :meth:`submit_threadsafe`, :meth:`cancel_threadsafe`,
:meth:`configure`, :meth:`snapshot`, :meth:`reset_stats`. Loop-only: the rest.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections.abc import Callable, Sequence
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
from labserve.generation.api import Finish
from labserve.generation.batch import SeqBatch
from labserve.generation.config import GenerationConfig
from labserve.generation.sampling import SequenceSampler
from labserve.generation.scheduler import Scheduler as StepScheduler
from labserve.generation.sequence import Finished, StepPlan
from labserve.generation.stats import GenerationRecorder, GenerationSnapshot
from labserve.runtime.scheduling import Scheduler, Timer
from labserve.runtime.token_streams import AnyStream, End, feed_streams

__all__ = ["GenerationDriver", "GenerativeModel", "LiveSequence"]


@dataclass(frozen=True)
class GenerativeModel:
    """A generative method's model and the hooks labserve calls (None: it has none)."""

    step: Callable[[SeqBatch], Any]
    """Advances a batch by one step; next-token logits (rows) or token ids, per sampler."""
    free_sequences: Callable[[Sequence[int]], None] | None = None
    """Drops the state of sequences that ended or were preempted."""
    rollback_step: Callable[[SeqBatch], None] | None = None
    """Undoes a step that raised (each sequence's state back to before it)."""


class LiveSequence:
    """One admitted sequence as the driver holds it: ids, sampler, stream, answered or not."""

    __slots__ = ("answered", "arrival_s", "num_output", "prompt_len", "sampler", "stream", "tokens")

    def __init__(
        self, prompt: list[int], sampler: SequenceSampler, stream: AnyStream, arrival_s: float
    ) -> None:
        self.tokens = prompt  # prompt, then each token generated (appended by the worker)
        self.prompt_len = len(prompt)
        self.sampler = sampler
        self.stream = stream
        self.arrival_s = arrival_s
        self.num_output = 0
        self.answered = False  # its stream has its end (or its caller left)


@dataclass(frozen=True, slots=True)
class _StepResult:
    """What a worker hands back: each sampled sequence's piece, who stopped, who failed."""

    pieces: list[tuple[int, str]]
    stopped: set[int]
    failed: dict[int, BaseException]


class GenerationDriver:
    """Drives one generative method's step scheduler with its model. See the module."""

    def __init__(
        self,
        model: GenerativeModel,
        config: GenerationConfig,
        *,
        scheduler: Scheduler,
        runner: str,
        method: str,
        max_model_len: int = 0,
    ) -> None:
        self.runner = runner
        self.method = method
        self._model = model
        self._rt = scheduler
        self._now = scheduler.now
        self._steps = StepScheduler(config, max_model_len=max_model_len, name=f"{runner}.{method}")
        self._latest = config
        self._lock = threading.Lock()  # guards the recorder and the latest config
        self._recorder = GenerationRecorder()
        self._live: dict[int, LiveSequence] = {}
        self._ids = itertools.count(1)
        self._deadlines: list[tuple[float, int]] = []
        self._deadline = Timer(scheduler, self._on_deadline)
        self._busy = False  # a step (or a free) is in a worker
        self._kick_queued = False
        self._free: list[int] = []  # sequences whose model state is to be dropped
        self._closed = False
        self._drained: asyncio.Future[None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop this driver runs on (None on virtual time)."""
        return self._rt.loop

    @property
    def config(self) -> GenerationConfig:
        """The latest config asked for (in force from the next step). Thread-safe."""
        return self._latest

    # -- the thread-safe doors ---------------------------------------------------------------

    def new_id(self) -> int:
        """A fresh sequence id. Thread-safe (``itertools.count`` under the GIL)."""
        return next(self._ids)

    def submit_threadsafe(self, seq_id: int, live: LiveSequence) -> None:
        """Admit a sequence from any thread; a loop that is closed answers it stopped."""
        try:
            self._rt.call_soon_threadsafe(self.submit, seq_id, live)
        except RuntimeError:
            self._answer(live, End(None, (), RunnerStoppedError(self.runner)))

    def cancel_threadsafe(self, seq_id: int) -> None:
        """Withdraw a sequence from any thread."""
        try:
            self._rt.call_soon_threadsafe(self.cancel, seq_id)
        except RuntimeError:
            pass  # the loop is closed: the sequence was answered when it stopped

    def configure(self, config: GenerationConfig) -> None:
        """Use ``config`` from the next step on. Thread-safe."""
        with self._lock:
            self._latest = config
        try:
            self._rt.call_soon_threadsafe(self._steps.configure, config)
        except RuntimeError:
            self._steps.configure(config)  # nothing runs: the next schedule applies it

    def snapshot(self) -> GenerationSnapshot:
        """The method's figures now. Thread-safe (counts as of the last step)."""
        with self._lock:
            return self._recorder.snapshot(
                self._now(),
                self._latest,
                runner=self.runner,
                method=self.method,
                running=self._steps.num_running,
                waiting=self._steps.num_waiting,
                kv_blocks_used=self._steps.kv_blocks_used,
            )

    def reset_stats(self) -> None:
        """Forget recorded sequences and steps. Thread-safe."""
        with self._lock:
            self._recorder.reset(self._now())

    # -- events on the loop -------------------------------------------------------------------

    def submit(self, seq_id: int, live: LiveSequence) -> None:
        """Admit a sequence. Loop-only. A refusal is its stream's typed error."""
        if self._closed or self._rt.closing:
            self._answer(live, End(None, (), RunnerStoppedError(self.runner)))
            return
        params = live.sampler.params
        try:
            self._steps.add(
                seq_id, live.prompt_len, params.max_tokens, live.arrival_s, priority=params.priority
            )
        except LabServeError as exc:
            with self._lock:
                self._recorder.refused()
            self._answer(live, End(None, (), exc))
            return
        self._live[seq_id] = live
        timeout_s = self._steps.config.request_timeout_s
        if timeout_s > 0:
            heapq.heappush(self._deadlines, (live.arrival_s + timeout_s, seq_id))
            self._arm_deadline()
        if not self._kick_queued:  # the arrivals of this loop iteration join one step
            self._kick_queued = True
            self._rt.call_soon(self._kick)

    def cancel(self, seq_id: int) -> None:
        """Withdraw a sequence (its caller left): freed at the next step. Loop-only."""
        live = self._live.get(seq_id)
        if live is None or live.answered:
            return
        live.answered = True  # nobody listens any more
        self._steps.abort(seq_id, "cancelled")
        self._kick()

    def _on_deadline(self, _due_s: float) -> None:
        """Answer every sequence past its timeout now, even while a step hangs."""
        now = self._now()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, seq_id = heapq.heappop(self._deadlines)
            live = self._live.get(seq_id)
            if live is None or live.answered:
                continue
            timeout_s = self._steps.config.request_timeout_s
            error = RequestTimeoutError(
                f"{self.runner}.{self.method}", now - live.arrival_s, timeout_s
            )
            self._answer(live, End(None, tuple(live.tokens[live.prompt_len :]), error))
            self._steps.abort(seq_id, "timeout")
        self._arm_deadline()
        self._kick()

    def _arm_deadline(self) -> None:
        while self._deadlines and self._deadlines[0][1] not in self._live:
            heapq.heappop(self._deadlines)
        due = self._deadlines[0][0] if self._deadlines else None
        self._deadline.set(due, self._now())

    # -- the step -------------------------------------------------------------------------------

    def _kick(self) -> None:
        """Plan and start the next step unless one is in a worker. Loop-only."""
        self._kick_queued = False
        if self._busy:
            return
        plan = self._steps.schedule(self._now())
        ends = [e for e in (self._ended(done, None) for done in plan.finished) if e is not None]
        if ends:
            feed_streams([(live.stream, [], end) for live, end in ends], self._rt.loop)
        free = self._take_free(plan.preempted)
        if plan.empty:
            if free and self._model.free_sequences is not None:
                self._model.free_sequences(free)  # no step runs: nothing else touches it
            self._maybe_drained()
            return
        batch = self._batch(plan)
        self._busy = True
        self._rt.submit(self._run_step, plan, batch, free)

    def _take_free(self, preempted: Sequence[int]) -> list[int]:
        free = self._free + list(preempted)
        self._free = []
        return free

    def _batch(self, plan: StepPlan) -> SeqBatch:
        live = self._live
        tokens = []
        for e in plan.scheduled:
            ids = live[e.seq_id].tokens
            tokens.append(np.asarray(ids[e.start : e.start + e.num_new_tokens], dtype=np.int64))
        return SeqBatch(
            tuple(e.seq_id for e in plan.scheduled),
            tuple(tokens),
            tuple(e.start for e in plan.scheduled),
            tuple(e.samples for e in plan.scheduled),
        )

    def _run_step(self, plan: StepPlan, batch: SeqBatch, free: list[int]) -> None:
        """In a worker: free, run the model, sample; then hand the step back to the loop.

        Whatever raises here (a model hook, its detokeniser) fails the step's sequences
        with its message: the step always comes back, so no caller is left waiting.
        """
        try:
            if free and self._model.free_sequences is not None:
                self._model.free_sequences(free)
            outputs, failed = self._attempt(batch)
            result = self._sample(batch, outputs, failed)
        except Exception as exc:
            error = ModelError(f"{self.runner}.{self.method}", exc, len(batch))
            result = _StepResult([], set(), dict.fromkeys(batch.seq_ids, error))
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
            rollback = self._model.rollback_step
            if rollback is not None:
                rollback(batch)
            isolate = self._steps.config.isolate_errors and rollback is not None
            if not isolate or len(batch) == 1:
                error = ModelError(f"{self.runner}.{self.method}", exc, len(batch))
                return {}, dict.fromkeys(batch.seq_ids, error)
            half = len(batch) // 2
            rows_a, failed_a = self._attempt(batch.subset(list(range(half))))
            rows_b, failed_b = self._attempt(batch.subset(list(range(half, len(batch)))))
            return rows_a | rows_b, failed_a | failed_b
        return rows, {}

    def _sample(
        self, batch: SeqBatch, rows: dict[int, Any], failed: dict[int, BaseException]
    ) -> _StepResult:
        """Each sampling sequence's next token and text (in the worker: per-sequence state)."""
        pieces: list[tuple[int, str]] = []
        stopped: set[int] = set()
        for seq_id, sampling in zip(batch.seq_ids, batch.samples, strict=True):
            if not sampling or seq_id in failed:
                continue
            live = self._live.get(seq_id)
            if live is None:
                continue
            sampler = live.sampler
            token = sampler.choose(rows[seq_id])
            live.tokens.append(token)
            live.num_output += 1
            text, stop = sampler.push(token, live.num_output >= sampler.params.max_tokens)
            pieces.append((seq_id, text))
            if stop:
                stopped.add(seq_id)
        return _StepResult(pieces, stopped, failed)

    def _step_done(self, plan: StepPlan, result: _StepResult) -> None:
        """Back on the loop: complete the step, answer the callers, plan the next one."""
        self._busy = False
        finished = self._steps.complete(
            plan, self._now(), stopped=result.stopped, failed=result.failed.keys()
        )
        record = self._steps.last_step
        if record is not None:
            with self._lock:
                self._recorder.step(record)
        pieces = dict(result.pieces)
        items: list[tuple[AnyStream, list[str], End | None]] = []
        for done in finished:
            ending = self._ended(done, result.failed.get(done.seq_id))
            if ending is not None:
                live, end = ending
                items.append((live.stream, [pieces.pop(done.seq_id, "")], end))
        for seq_id, text in pieces.items():
            running = self._live.get(seq_id)
            if running is not None and not running.answered:
                items.append((running.stream, [text], None))
        feed_streams(items, self._rt.loop)
        self._kick()

    # -- ends -------------------------------------------------------------------------------

    def _ended(
        self, done: Finished, error: BaseException | None
    ) -> tuple[LiveSequence, End] | None:
        """File a sequence's one outcome; its caller's end, unless its caller was answered."""
        with self._lock:
            self._recorder.finished(done)
        self._free.append(done.seq_id)
        live = self._live.pop(done.seq_id, None)
        if live is None or live.answered:
            return None
        live.answered = True
        return live, self._end_of(done, live, error)

    def _end_of(self, done: Finished, live: LiveSequence, error: BaseException | None) -> End:
        generated = tuple(live.tokens[live.prompt_len :])
        name = f"{self.runner}.{self.method}"
        if done.reason in ("length", "stop"):
            finish = Finish(done.reason, live.prompt_len, len(done.token_times_s))
            return End(finish, generated)
        if done.reason == "timeout":
            timeout_s = self._steps.config.request_timeout_s
            error = RequestTimeoutError(name, done.end_s - done.arrival_s, timeout_s)
        elif done.reason == "cancelled":
            error = CancelledRequestError(name)
        elif error is None:  # failed without a recorded cause: cannot happen
            error = ModelError(name, RuntimeError("the step failed"), 1)
        return End(None, generated, error)

    def _answer(self, live: LiveSequence, end: End) -> None:
        live.answered = True
        feed_streams([(live.stream, [], end)], self._rt.loop)

    # -- closing ------------------------------------------------------------------------------

    def _maybe_drained(self) -> None:
        drained = self._drained
        if drained is not None and not drained.done() and not self._steps.has_work:
            drained.set_result(None)

    async def aclose(self) -> None:
        """Refuse new sequences, let the admitted ones finish; idempotent. Loop-only.

        Cancelled (the runner's stop timed out), it answers every sequence still alive
        with RunnerStoppedError.
        """
        self._closed = True
        self._deadline.cancel()
        if self._steps.has_work or self._busy:
            loop = asyncio.get_running_loop()
            self._drained = loop.create_future()
            try:
                await self._drained
            except asyncio.CancelledError:
                self.abort()
                raise

    def abort(self) -> None:
        """Answer every live sequence with RunnerStoppedError now. Loop-only."""
        self._closed = True
        for live in list(self._live.values()):
            if not live.answered:
                self._answer(live, End(None, (), RunnerStoppedError(self.runner)))


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
