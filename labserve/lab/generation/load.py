"""Load for a generative method in this process, and a load that runs until it is stopped.

:func:`start_runner_generation_load` sends generations to ``runner.<method>`` from the
runner's background loop: one per arrival of an arrival process, each with a prompt of
random token ids and an output length drawn from two length distributions (the vocabulary
of :mod:`labserve.base.lengths`: ``"lognormal:32:256"``, ``"uniform:1:512"``, ``64``), with
``ignore_eos`` so that the output length is the one drawn. :class:`UntilStopped` chains
runs of a fixed length (each with the next seed) until :meth:`UntilStopped.stop`, for a
dashboard's start/stop button; it works with any run that has ``running``, ``sent`` and
``stop()`` (this module's, or labserve's HTTP generation load).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import numpy as np

from labserve.base.errors import LabServeError
from labserve.base.lengths import LengthDist, parse_length
from labserve.load.arrivals import Arrivals
from labserve.runtime.generation.method import GenerativeMethod

__all__ = [
    "LoadLike",
    "RunnerGenerationLoad",
    "ScheduledLoad",
    "UntilStopped",
    "start_runner_generation_load",
]


class LoadLike(Protocol):
    """A load run as a dashboard drives it."""

    @property
    def running(self) -> bool:
        """True until the run has sent its last request and every answer came back."""
        ...

    @property
    def sent(self) -> int:
        """Requests sent so far."""
        ...

    def stop(self) -> None:
        """Stop sending; end what is in flight. Idempotent, thread-safe."""
        ...


class ScheduledLoad:
    """Work started on a method's runner loop at ``times_s`` (seconds from the start).

    The schedule both in-process loads share: at each time, unless stopped, a task for
    :meth:`_arrival` starts; the run ends when the last task has ended. A subclass sets its
    own state, then calls ``__init__`` (which starts the run). Thread-safe: :attr:`running`,
    :attr:`sent` and :meth:`stop` may be read or called from any thread; the rest runs on
    the loop.
    """

    def __init__(self, method: GenerativeMethod, times_s: np.ndarray) -> None:
        self.method = method
        self._times = [float(t) for t in times_s]
        self._sent = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._main: asyncio.Task[None] | None = None
        self._stopped = threading.Event()
        self._future = method.runner.bg.submit(self._run())

    @property
    def running(self) -> bool:
        """True until the last answer came back (or the run was stopped)."""
        return not self._future.done()

    @property
    def sent(self) -> int:
        """Arrivals started so far."""
        return self._sent

    def stop(self) -> None:
        """Stop starting arrivals and cancel what is in flight. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        bg = self.method.runner.bg
        if bg.running and not self._future.done():
            bg.call_soon(self._cancel)

    def _cancel(self) -> None:
        """On the loop: cancel the schedule and every arrival in flight."""
        if self._main is not None:
            self._main.cancel()
        for task in list(self._tasks):
            task.cancel()

    async def _arrival(self, k: int, start: float, at: float) -> None:
        """Arrival ``k``, due at ``at`` seconds after the loop time ``start``."""
        raise NotImplementedError

    async def _run(self) -> None:
        self._main = asyncio.current_task()
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            for k, at in enumerate(self._times):
                delay = start + at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._stopped.is_set():
                    break
                task = loop.create_task(self._arrival(k, start, at))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                self._sent += 1
            while self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        except asyncio.CancelledError:
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)


class RunnerGenerationLoad(ScheduledLoad):
    """Generations sent to a method in this process on its runner's loop (see the module).

    Made by :func:`start_runner_generation_load`. Thread-safe: :attr:`running`,
    :attr:`sent`, :attr:`outcomes` and :meth:`stop` may be read or called from any thread;
    the rest runs on the loop.
    """

    def __init__(
        self,
        method: GenerativeMethod,
        times_s: np.ndarray,
        prompts: list[list[int]],
        max_tokens: list[int],
    ) -> None:
        self._prompts = prompts
        self._max_tokens = max_tokens
        self.outcomes: Counter[str] = Counter()
        """Answers so far: ``served``, or the error's type name (QueueFullError...)."""
        super().__init__(method, times_s)

    async def _arrival(self, k: int, start: float, at: float) -> None:
        await self._one(self._prompts[k], self._max_tokens[k])

    async def _one(self, prompt: list[int], max_tokens: int) -> None:
        try:
            await self.method.async_run(
                prompt, max_tokens=max_tokens, ignore_eos=True, temperature=0.0
            )
        except LabServeError as exc:  # refused, timed out, failed: counted, never silent
            self.outcomes[type(exc).__name__] += 1
            return
        self.outcomes["served"] += 1

    def __repr__(self) -> str:
        state = "running" if self.running else "done"
        return f"<RunnerGenerationLoad {self.method!r} {self._sent} sent ({state})>"


def start_runner_generation_load(
    method: GenerativeMethod,
    *,
    arrivals: Arrivals,
    duration_s: float,
    input_len: LengthDist | str | int,
    output_len: LengthDist | str | int,
    seed: int = 0,
) -> RunnerGenerationLoad:
    """Send generations to ``method`` at ``arrivals`` for ``duration_s``; return at once.

    Each prompt is ``input_len`` random token ids (below the model's ``vocab_size``), each
    asks for ``output_len`` tokens with ``ignore_eos``; a draw that would not fit the
    model's context (``max_model_len``) is cut to fit, prompt first. ``seed`` fixes the
    arrivals and every draw.

    Raises:
        ValueError, TypeError: a length spec or the duration breaks its rule.
    """
    prompt_dist = parse_length(input_len, name="input_len")
    output_dist = parse_length(output_len, name="output_len")
    times = arrivals.times(duration_s, seed=seed)
    rng = np.random.default_rng(seed)
    n = len(times)
    prompt_lens = prompt_dist.sample(rng, n)
    output_lens = output_dist.sample(rng, n)
    context = method.max_model_len or None
    if context is not None:  # fit the context: at least one prompt and one output token
        prompt_lens = np.minimum(prompt_lens, context - 1)
        output_lens = np.minimum(output_lens, context - prompt_lens)
    vocab = method.vocab_size or 256
    ids = rng.integers(0, vocab, size=int(prompt_lens.sum()), dtype=np.int64).tolist()
    prompts: list[list[int]] = []
    at = 0
    for length in prompt_lens.tolist():
        prompts.append(ids[at : at + length])
        at += length
    return RunnerGenerationLoad(method, times, prompts, [int(x) for x in output_lens])


class UntilStopped:
    """Runs of ``chunk_s`` seconds, chained until :meth:`stop`: a load without an end.

    ``start(seed, duration_s)`` starts one run (any :class:`LoadLike`); the next starts,
    with the next seed, when the last one's schedule ends (the last one's answers may
    still be arriving). Thread-safe; the chaining runs on a daemon thread of its own.
    """

    def __init__(self, start: Callable[[int, float], LoadLike], chunk_s: float = 30.0) -> None:
        if not chunk_s > 0:
            raise ValueError(f"chunk_s must be a number > 0, got {chunk_s!r}")
        self._start = start
        self.chunk_s = chunk_s
        self._lock = threading.Lock()
        self._runs: list[LoadLike] = []
        self._done_sent = 0
        self._stop = threading.Event()
        self.error: BaseException | None = None
        """Why a later run could not start (the first run's error is raised at once)."""
        self._runs.append(start(0, chunk_s))  # the first run's refusal is the caller's
        self._thread = threading.Thread(target=self._chain, name="labserve-genload", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """True until stopped (or a run failed to start), and the runs' answers came back."""
        with self._lock:
            runs = list(self._runs)
        return self._thread.is_alive() or any(r.running for r in runs)

    @property
    def sent(self) -> int:
        """Requests sent by every run so far."""
        with self._lock:
            return self._done_sent + sum(r.sent for r in self._runs)

    @property
    def runs(self) -> int:
        """Runs started so far."""
        with self._lock:
            return len(self._runs)

    def _chain(self) -> None:
        seed = 0
        while not self._stop.wait(self.chunk_s):
            seed += 1
            try:
                run = self._start(seed, self.chunk_s)
            except Exception as exc:  # kept in .error for the dashboard to show
                self.error = exc
                return
            with self._lock:
                if self._stop.is_set():
                    run.stop()
                    return
                # Finished runs are summed up, so that a load left on for hours holds few.
                ended = [r for r in self._runs if not r.running]
                self._done_sent += sum(r.sent for r in ended)
                self._runs = [r for r in self._runs if r.running]
                self._runs.append(run)

    def stop(self) -> None:
        """Stop every run (idempotent, thread-safe; not from the chaining thread)."""
        self._stop.set()
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            run.stop()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def __repr__(self) -> str:
        return f"<UntilStopped {self.sent} sent>"
