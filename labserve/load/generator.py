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

import functools
import inspect
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from labserve.base.descriptors import socket_budget
from labserve.base.errors import (
    LabServeError,
    ModelStuckError,
    OverloadError,
    QueueFullError,
    RequestTimeoutError,
)
from labserve.base.vocabulary import FAILED, REASONS, REFUSED, REJECTED, SERVED, TIMEOUT
from labserve.load.arrivals import Arrivals
from labserve.load.examples import ExampleMix
from labserve.load.generation.result import GenerationLoadResult
from labserve.load.generation.start import generation_load_test, is_generation_url
from labserve.load.http import HttpSender
from labserve.load.loop import load_loop  # re-exported: where it was first defined
from labserve.load.mix import LengthMix
from labserve.load.records import Record, Sender, clock_s
from labserve.load.run import LoadRun, start_run  # LoadRun re-exported
from labserve.metrics.results import RunResult
from labserve.runtime import session
from labserve.runtime.runner import RunnerMethod

__all__ = ["LoadRun", "load_loop", "load_test", "start_load"]

# An open-loop HTTP run opens this many keep-alive connections before the clock starts
# (wrk's -c64), and more as requests find them all busy, up to the limit below: a fixed 64
# cannot carry 2,500 req/s at a server latency of 25 ms, and the sends fell seconds behind.
# At the limit, requests wait for a connection (the wait counts in their latency and their
# send lag) and the run says so.
_OPEN_LOOP_CONNECTIONS = 64
# load_test's parameters for a generation URL only (declared on generation_load_test).
_GENERATION_ONLY = ("output_len", "model", "goodput", "workload")


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
        raise TypeError(
            "output_len=, model=, goodput= and workload= are for a /v1 (generation) URL"
        )
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
    sender: Sender[Record]
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
    report = functools.partial(_report, sender, batches_before, label)
    run = start_run(
        bg,
        sender,
        report,
        duration_s=float(duration_s),
        arrivals=arrivals,
        concurrency=concurrency,
        think_s=think_s,
        seed=seed,
    )
    return _tracked(run, target)


def _tracked(run: LoadRun[RunResult], target: RunnerMethod | str) -> LoadRun[RunResult]:
    """Recorded until it ends: stop_all() stops it; so does replacing the runner it loads."""
    where = target if isinstance(target, str) else f"{target.runner.name}.{target.name}"
    needs = [] if isinstance(target, str) else [("runner", target.runner.name)]
    session.track(run, "load", f"{where} #{next(_load_ids)}", run.stop, needs=needs)
    run.add_done_callback(session.forget)
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


def _report(
    sender: Sender[Record], batches_before: int, label: str, rec: Record, duration_s: float
) -> RunResult:
    """The RunResult of a request run's record: with the runner's batches, or the server's."""
    if isinstance(sender, _MethodSender):
        return _result(sender.method, rec, duration_s, batches_before, label, None)
    assert isinstance(sender, HttpSender)
    return _result(None, rec, duration_s, 0, label, sender.server_view(duration_s))


class _MethodSender(Sender[Record]):
    def __init__(
        self, method: RunnerMethod, example: Any, mix: LengthMix | ExampleMix | None = None
    ) -> None:
        self.method = method
        self.example = example
        self.mix = mix

    def new_record(self) -> Record:
        return Record()

    def new_slot(self, rec: Record, intended_s: float) -> int:
        return rec.new_slot(intended_s)

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
