"""Putting load on a runner method or an HTTP endpoint: open loop (on schedule) or closed loop.

Latency is measured from each request's *intended* send time, so a generator that falls
behind cannot hide the queueing it caused (no coordinated omission); when it falls behind
it says so with a :class:`~labserve.base.errors.LoadWarning`. In-process loads run on
labserve's background loop (the calls are the runner's own); HTTP loads run on an event
loop of their own (thread ``labserve-load``), so that a server in the same kernel never
shares its loop with the load that measures it. Interrupting a blocking run (Ctrl-C)
stops the load at once and raises :class:`~labserve.base.errors.LoadInterrupted` with
what was measured so far.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from labserve.base.descriptors import socket_budget
from labserve.base.errors import (
    LabServeError,
    LoadInterrupted,
    LoadWarning,
    ModelStuckError,
    OverloadError,
    QueueFullError,
    RequestTimeoutError,
)
from labserve.base.vocabulary import FAILED, REASONS, REFUSED, REJECTED, SERVED, TIMEOUT
from labserve.load.arrivals import Arrivals
from labserve.load.examples import ExampleMix
from labserve.load.gen_result import GenerationLoadResult
from labserve.load.generation import generation_load_test, is_generation_url
from labserve.load.http import HttpSender
from labserve.load.loop import load_loop  # re-exported: where it was first defined
from labserve.load.mix import LengthMix
from labserve.load.records import Control, Record, Sender, clock_s
from labserve.metrics.results import RunResult
from labserve.runtime import session
from labserve.runtime.loop import BackgroundLoop
from labserve.runtime.runner import RunnerMethod

__all__ = ["LoadRun", "load_loop", "load_test", "start_load"]

# Behind schedule by more than this (p99), the run says it could not keep the rate.
_LAG_LIMIT_S = 0.005
# An open-loop HTTP run opens this many keep-alive connections before the clock starts
# (wrk's -c64), and more as requests find them all busy, up to the limit below: a fixed 64
# cannot carry 2,500 req/s at a server latency of 25 ms, and the sends fell seconds behind.
# At the limit, requests wait for a connection (the wait counts in their latency and their
# send lag) and the run says so.
_OPEN_LOOP_CONNECTIONS = 64
# How often a blocking wait wakes to let Ctrl-C in (a lock wait is not interruptible).
_WAKE_S = 0.05
# load_test's parameters for a generation URL only (declared on generation_load_test).
_GENERATION_ONLY = ("output_len", "model", "goodput")


def load_test(target: RunnerMethod | str, **options: Any) -> RunResult | GenerationLoadResult:
    """Drive ``target`` with ``example`` requests for ``duration_s``; return the RunResult.

    ``target`` is a runner method (in-process) or a URL: labserve's simple route
    (``.../runners/{name}/{method}``) or any Open Inference Protocol v2 infer URL
    (``.../v2/models/{name}/infer``: Triton, KServe, MLServer, labserve), whose input
    names, datatypes and shapes are read from the model's metadata (``example`` then
    only fills what the metadata leaves open, and may be omitted).

    Open loop with ``arrivals`` (an arrival process: requests go out on schedule whatever
    the replies), or closed loop with ``concurrency`` clients, each sending its next
    request ``think_s`` after its last reply. Blocks until the last reply; call it from a
    notebook cell or a script (not from labserve's loop). :func:`start_load` is the same
    without blocking.

    In-process, the batch arrays hold the run's batches as far as the runner's recorder
    still holds them (its last 4,096). Over HTTP the requests' batch starts are unknown
    (NaN); against a labserve server, ``RunResult.server`` holds the server's own view
    of the run (batches, mean batch, fire reasons, queue waits, from ``GET /stats``
    before and after) and the summary shows it. HTTP options: ``binary`` (v2 binary
    tensors; ``.npy`` on the simple route), ``token`` (sent as ``Authorization: Bearer``),
    ``connections`` (the keep-alive pool's limit: default ``concurrency``; in open loop,
    64 opened ahead and more as needed, up to a limit from ``ulimit -n``, at most 512),
    ``timeout_s`` (per request; a request past it is a ``timeout``). Every HTTP failure
    is an outcome of its own kind (``RunResult.summary()["outcomes"]``).

    ``input_len`` (a length distribution or its string, ``"lognormal:16:128"``) sends a
    length mix to a method with a ragged axis: request k is ``example`` resized along axis
    1 to its drawn length (or ``example(length)`` for a callable); the summary then shows
    tokens per batch and the padding share. Over HTTP, the simple route only.

    ``examples`` (instead of ``example``): a sequence of requests, sent in turn (request k
    is ``examples[k % len(examples)]``), or a function of the request index ``k``, so that
    a realistic mix is load-tested. Over HTTP, the simple route only.

    A ``.../v1/completions`` or ``.../v1/chat/completions`` URL (of any OpenAI-compatible
    server) gets a generation load instead, and a :class:`GenerationLoadResult` (TTFT, ITL,
    TPOT, e2e, tokens/s, goodput): ``input_len`` is then the prompt's length in bytes
    (default 32), ``output_len`` its ``max_tokens`` (default 128), ``model`` the model to
    ask and ``goodput`` the targets (``"ttft:300 tpot:30"``); see
    :func:`labserve.load.generation.generation_load_test`.

    Takes :func:`start_load`'s parameters, and for a generation URL ``output_len``,
    ``model`` and ``goodput`` from :func:`~labserve.load.generation.generation_load_test`
    (``help()`` shows them all).

    Raises:
        LoadInterrupted: when interrupted (Ctrl-C); the load stopped at once, and its
            ``result`` holds what was measured so far.
        LoadTargetError: a v2 URL whose model metadata cannot be read or used.

    >>> import labserve                                        # doctest: +SKIP
    >>> r = labserve.load_test(runner.predict, example=x, duration_s=5,
    ...                        arrivals=labserve.arrivals("poisson", rate_rps=2000))
    """
    if isinstance(target, str) and is_generation_url(target):
        return _generation_load_test(target, options)
    if any(options.get(name) is not None for name in _GENERATION_ONLY):
        raise TypeError("output_len=, model= and goodput= are for a /v1 (generation) URL")
    for name in _GENERATION_ONLY:
        options.pop(name, None)  # None: not set
    return start_load(target, **options)._wait(None, stacklevel=3)


def _generation_load_test(url: str, options: dict[str, Any]) -> GenerationLoadResult:
    """load_test on a /v1 URL: the options both loads share, and the generation ones."""
    example, examples = options.pop("example", None), options.pop("examples", None)
    think_s, binary = options.pop("think_s", 0.0), options.pop("binary", False)
    if example is not None or examples is not None or think_s or binary:
        raise TypeError(
            "example=, examples=, think_s= and binary= are for request loads, not a /v1 URL"
        )
    for name in ("input_len", *_GENERATION_ONLY):  # None: generation_load_test's default
        if options.get(name) is None:
            options.pop(name, None)
    # load_test's own default per request, start_load's (generation_load_test alone waits 30 s).
    options.setdefault("timeout_s", inspect.signature(start_load).parameters["timeout_s"].default)
    return generation_load_test(url, **options)


def _load_test_signature() -> inspect.Signature:
    """start_load's parameters, then the generation-only ones: what load_test takes."""
    shared = list(inspect.signature(start_load).parameters.values())
    generation = inspect.signature(generation_load_test).parameters
    extra = [_unset_by_default(generation[name]) for name in _GENERATION_ONLY]
    return inspect.Signature(shared + extra, return_annotation="RunResult | GenerationLoadResult")


def start_load(
    target: RunnerMethod | str,
    *,
    example: Any = None,
    duration_s: float,
    arrivals: Arrivals | None = None,
    concurrency: int | None = None,
    think_s: float = 0.0,
    seed: int = 0,
    label: str = "",
    binary: bool = False,
    token: str | None = None,
    connections: int | None = None,
    timeout_s: float = 10.0,
    input_len: Any = None,
    examples: Sequence[Any] | Callable[[int], Any] | None = None,
) -> LoadRun:
    """Start the load :func:`load_test` describes and return at once with its :class:`LoadRun`.

    The load runs on a background loop, so the calling cell (or thread) is free: this is
    what a dashboard's start button uses. Same arguments and errors as :func:`load_test`.
    """
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a finite number > 0, got {duration_s!r}")
    if (arrivals is None) == (concurrency is None):
        raise TypeError("load_test needs exactly one of arrivals= (open loop) or concurrency=")
    _refuse_generation_url(target)
    if concurrency is not None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if think_s < 0:
            raise ValueError(f"think_s must be >= 0, got {think_s!r}")
    sender: Sender
    mix, example = _mix(input_len, example, examples, seed)
    if isinstance(target, str):
        pool = connections or concurrency or socket_budget()
        sender = HttpSender(
            target,
            example,
            binary=binary,
            token=token,
            connections=pool,
            prewarm=min(pool, _OPEN_LOOP_CONNECTIONS),
            timeout_s=timeout_s,
            mix=mix,
        )
        bg = load_loop()
        batches_before = 0
    else:
        if binary or token is not None or connections is not None:
            raise TypeError("binary=, token= and connections= apply to HTTP targets only")
        if not target.batchable:
            raise TypeError(f"{target!r} is not batchable: load_test drives a batch queue")
        if example is None:
            raise TypeError("load_test needs example= (one request's argument)")
        sender = _MethodSender(target, example, mix)
        bg = target.runner.bg
        target.start()  # the loop and the driver start before the clock does
        batches_before = target.stats().batches
    control = Control()
    if arrivals is not None:
        times = np.asarray(arrivals.times(duration_s, seed=seed), dtype=float)
        future = bg.submit(_open_loop(sender, times, control))
    else:
        assert concurrency is not None
        future = bg.submit(_closed_loop(sender, concurrency, think_s, duration_s, control))
    run = LoadRun(bg, future, control, sender, float(duration_s), batches_before, label)
    run.asked_rps = float(arrivals.mean_rate(duration_s)) if arrivals is not None else None
    return _tracked(run, target, future)


def _tracked(
    run: LoadRun, target: RunnerMethod | str, future: concurrent.futures.Future[Any]
) -> LoadRun:
    """Recorded until it ends: stop_all() stops it; so does replacing the runner it loads."""
    where = target if isinstance(target, str) else f"{target.runner.name}.{target.name}"
    needs = [] if isinstance(target, str) else [("runner", target.runner.name)]
    session.track(run, "load", f"{where} #{next(_load_ids)}", run.stop, needs=needs)
    future.add_done_callback(lambda _: session.forget(run))
    return run


_load_ids = itertools.count(1)


def _mix(
    input_len: Any, example: Any, examples: Any, seed: int
) -> tuple[LengthMix | ExampleMix | None, Any]:
    """The mix of requests asked for (None: every request is ``example``), and request 0."""
    if examples is None:
        return _length_mix(input_len, example, seed), example
    if example is not None or input_len is not None:
        raise TypeError("give examples= alone (not with example= or input_len=)")
    mix = ExampleMix(examples)
    return mix, mix.payload(0)


def _refuse_generation_url(target: Any) -> None:
    if isinstance(target, str) and is_generation_url(target):
        raise TypeError(f"{target} is a generation URL: start_generation_load() drives it")


def _unset_by_default(p: inspect.Parameter) -> inspect.Parameter:
    # None (not set) is the default in load_test: generation_load_test's own applies to a /v1 URL.
    if p.default is None:
        return p
    return p.replace(default=None, annotation=f"{p.annotation} | None")


# help() and IDEs show every parameter load_test takes, each declared where it is used.
setattr(load_test, "__signature__", _load_test_signature())  # noqa: B010 (mypy: no such field)


def _length_mix(input_len: Any, example: Any, seed: int) -> LengthMix | None:
    """The length mix ``input_len`` asks for (None: every request is ``example``)."""
    if input_len is None:
        return None
    if example is None:
        raise TypeError("input_len= needs example= (resized to each length, or a callable)")
    return LengthMix(input_len, example, seed=seed)


class LoadRun:
    """A load run started by :func:`start_load`. Thread-safe.

    ``stop()`` ends the sending early (requests already sent still get their replies);
    ``result()`` waits for the last reply and returns the RunResult.
    """

    def __init__(
        self,
        bg: BackgroundLoop,
        future: concurrent.futures.Future[Record],
        control: Control,
        sender: Sender,
        duration_s: float,
        batches_before: int,
        label: str,
    ) -> None:
        self._bg = bg
        self._future = future
        self._control = control
        self._sender = sender
        self._duration_s = duration_s
        self._batches_before = batches_before
        self._label = label
        self._result: RunResult | None = None
        self.asked_rps: float | None = None
        """The open loop's rate as asked (its arrivals' mean), which warnings quote."""

    @property
    def running(self) -> bool:
        """True until the last reply is in."""
        return not self._future.done()

    @property
    def sent(self) -> int:
        """Requests sent so far."""
        return self._control.sent

    def stop(self) -> None:
        """Send no more requests (idempotent; returns at once)."""
        if not self._future.done():
            self._bg.call_soon(self._control.stop)

    def result(self, timeout: float | None = None) -> RunResult:
        """Wait for the last reply (up to ``timeout`` seconds) and return the RunResult.

        Warns :class:`LoadWarning` when the sends fell behind schedule. Raises
        ``TimeoutError`` when the run is still going after ``timeout``, and
        :class:`LoadInterrupted` (with the result so far) when interrupted: the load stops.
        """
        return self._wait(timeout, stacklevel=3)

    def _wait(self, timeout: float | None, stacklevel: int) -> RunResult:
        if self._result is not None:
            return self._result
        try:
            rec = _wait_future(self._future, timeout)
        except KeyboardInterrupt:
            # Stop sending and give up what is in flight, at once; then report.
            if not self._future.done():
                self._bg.call_soon(self._control.stop, True)
            rec = _wait_future(self._future, None)
            raise LoadInterrupted(self._make_result(rec), self._control.sent) from None
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the load run is still going after {timeout} s") from None
        result = self._make_result(rec)
        if result.send_lag_s is not None and len(result.send_lag_s):
            rate_rps = self.asked_rps or len(result.arrival_s) / result.duration_s
            why = ""
            pool = self._sender.pool_seen if isinstance(self._sender, HttpSender) else None
            if pool is not None and pool.waited_at_limit:
                share = pool.waited_at_limit / len(result.arrival_s)
                why = (
                    f"; {share:.1%} of the requests found all {pool.limit} connections (the "
                    "limit) open and busy when due, and waited: the server answers slower "
                    "than this rate needs; raise the limit with connections=, --connections"
                )
            elif pool is not None and rec.waited_for_connection:
                why = (
                    f"; connections opened as needed, {pool.most_open} at most (limit "
                    f"{pool.limit}): the generator, not the pool, fell behind"
                )
            _warn_if_behind(result.send_lag_s, rate_rps, stacklevel, why)
        self._result = result
        return result

    def _make_result(self, rec: Record) -> RunResult:
        duration_s = self._duration_s
        if self._control.stopped_at is not None:
            duration_s = max(min(self._control.stopped_at - rec.t0, duration_s), 1e-9)
        sender = self._sender
        if isinstance(sender, _MethodSender):
            return _result(sender.method, rec, duration_s, self._batches_before, self._label, None)
        assert isinstance(sender, HttpSender)
        view = sender.server_view(duration_s)
        return _result(None, rec, duration_s, 0, self._label, view)

    def __repr__(self) -> str:
        state = "running" if self.running else "done"
        return f"<LoadRun {state}, {self.sent} sent>"


def _wait_future(future: concurrent.futures.Future[Record], timeout: float | None) -> Record:
    """``future.result(timeout)``, waking every few ms so that Ctrl-C gets in at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait_s = _WAKE_S if deadline is None else min(_WAKE_S, max(deadline - time.monotonic(), 0))
        try:
            return future.result(wait_s)
        except concurrent.futures.TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise


class _MethodSender(Sender):
    def __init__(
        self, method: RunnerMethod, example: Any, mix: LengthMix | ExampleMix | None = None
    ) -> None:
        self.method = method
        self.example = example
        self.mix = mix

    async def send(self, rec: Record, k: int) -> None:
        payload = self.example if self.mix is None else self.mix.payload(k)
        request, future = self.method.submit_on_loop((payload,))
        rec.went_out(k, clock_s())
        rec.items[k] = request.items
        try:
            await future
            rec.outcome[k] = SERVED
        except LabServeError as exc:
            rec.outcome[k] = _outcome_of(exc)
            rec.note_error(f"{type(exc).__name__}: {exc}")
        rec.finish[k] = clock_s() - rec.t0
        if request.start_s is not None:
            rec.start[k] = request.start_s - rec.t0


def _outcome_of(exc: LabServeError) -> int:
    """The outcome of a request its runner answered with ``exc``."""
    if isinstance(exc, (QueueFullError, ModelStuckError)):
        return REFUSED  # at admission: never queued
    if isinstance(exc, OverloadError):  # predicted at admission, or at its deadline
        return REJECTED if exc.predicted_wait_s is None else REFUSED
    if isinstance(exc, RequestTimeoutError):
        return TIMEOUT
    return FAILED


async def _send_on_schedule(
    sender: Sender, rec: Record, times: list[float], control: Control
) -> None:
    loop = asyncio.get_running_loop()
    t0, n, i = rec.t0, len(times), 0
    while i < n and control.stopped_at is None:  # stopped while the pool was opening
        # Everything due goes out now; then one sleep until the next is due.
        now = clock_s()
        while i < n and t0 + times[i] <= now:
            k = rec.new_slot(times[i])
            control.sent += 1
            # On an idle connection the request is written now, without a task. Either
            # way the sender reports when it went out (after any wait for a connection).
            sent = sender.send_soon(rec, k)
            if sent is None:
                sent = loop.create_task(sender.send(rec, k))
            control.track(sent)
            i += 1
        if i < n:
            await asyncio.sleep(t0 + times[i] - clock_s())


async def _open_loop(sender: Sender, times: np.ndarray, control: Control) -> Record:
    loop = asyncio.get_running_loop()
    await sender.open()
    rec = Record()
    try:
        rec.t0 = clock_s() + 0.005
        rec.track_lag = True
        control.sending = loop.create_task(_send_on_schedule(sender, rec, times.tolist(), control))
        try:
            await control.sending
        except asyncio.CancelledError:
            if control.stopped_at is None:
                raise  # the run itself was cancelled, not stopped
        await _answered(control)
    finally:
        await _close(sender, control)
    if control.error is not None:
        raise control.error
    return rec


async def _answered(control: Control) -> None:
    """Wait until every request in flight has its outcome."""
    while control.in_flight:
        await asyncio.wait(set(control.in_flight))


async def _close(sender: Sender, control: Control) -> None:
    """Cancel what is still in flight (the run was interrupted) and close the sender."""
    for task in control.in_flight:
        task.cancel()
    await sender.close()


async def _closed_loop(
    sender: Sender, clients: int, think_s: float, duration_s: float, control: Control
) -> Record:
    loop = asyncio.get_running_loop()
    await sender.open()
    rec = Record()
    try:
        rec.t0 = clock_s()
        end = rec.t0 + duration_s

        async def client() -> None:
            while clock_s() < end and control.stopped_at is None:
                k = rec.new_slot(clock_s() - rec.t0)
                control.sent += 1
                sent = sender.send_soon(rec, k)
                if sent is not None:
                    await sent
                else:
                    await sender.send(rec, k)
                if think_s:
                    await asyncio.sleep(think_s)

        for _ in range(clients):
            control.track(loop.create_task(client()))
        await _answered(control)
    finally:
        await _close(sender, control)
    if control.error is not None:
        raise control.error
    return rec


def _result(
    method: RunnerMethod | None,
    rec: Record,
    duration_s: float,
    batches_before: int,
    label: str,
    server: dict[str, Any] | None,
) -> RunResult:
    if method is not None:
        snap = method.stats()
        snap_config = snap.config.as_dict()
        held = method.batch_records(snap.batches - batches_before)
    else:
        snap_config, held = {}, []
    return RunResult(
        arrival_s=np.asarray(rec.arrival, dtype=float),
        start_s=np.asarray(rec.start, dtype=float),
        finish_s=np.asarray(rec.finish, dtype=float),
        outcome=np.asarray(rec.outcome, dtype=np.int8),
        items=np.asarray(rec.items, dtype=np.int64),
        batch_start_s=np.asarray([b.start_s - rec.t0 for b in held], dtype=float),
        batch_duration_s=np.asarray([b.duration_s for b in held], dtype=float),
        batch_items=np.asarray([b.items for b in held], dtype=np.int64),
        batch_requests=np.asarray([b.requests for b in held], dtype=np.int64),
        batch_reason=np.asarray([REASONS.index(b.reason) for b in held], dtype=np.int8),
        duration_s=float(duration_s),
        label=label,
        config=snap_config,
        send_lag_s=np.asarray(rec.lag, dtype=float) if rec.lag else None,
        sent_until_s=rec.last_sent,
        server=server,
        batch_tokens=np.asarray([b.tokens for b in held], dtype=np.int64),
        batch_padding_tokens=np.asarray([b.padding_tokens for b in held], dtype=np.int64),
        errors=dict(rec.errors.most_common()),
    )


def _warn_if_behind(lag_s: np.ndarray, rate_rps: float, stacklevel: int = 1, why: str = "") -> None:
    p99 = float(np.percentile(lag_s, 99))
    if p99 > _LAG_LIMIT_S:
        warnings.warn(
            LoadWarning(
                f"the load generator could not keep {rate_rps:,.0f} req/s: sends fell behind "
                f"schedule by up to {lag_s.max() * 1000:.1f} ms (p99 {p99 * 1000:.1f} ms); "
                f"latencies are measured from the intended send times{why}"
            ),
            stacklevel=stacklevel + 1,
        )
