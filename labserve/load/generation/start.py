"""Load for a generation server: streamed completions in open or closed loop, TTFT to goodput.

Against ``/v1/completions`` or ``/v1/chat/completions`` of labserve or any OpenAI-compatible
server (vLLM, TGI, SGLang, llama.cpp...). Each request asks for a synthetic prompt of a
drawn length and a drawn number of output tokens (:mod:`~labserve.load.generation.prompts`),
streamed; the client times every content chunk as it arrives
(:mod:`~labserve.load.generation.stream`, over the keep-alive pool of
:mod:`labserve.load.http_client`) and measures from each request's intended send time, so a
server that falls behind cannot hide its queue. Open loop with any arrival process
(:mod:`labserve.load.arrivals`: Poisson, bursts, steps, a trace), or closed loop with
``concurrency`` clients, driven as every load run is (:mod:`labserve.load.run`). Against
labserve, the server's own ``/stats`` for the model is read before and after
(:mod:`~labserve.load.generation.server_view`). The load runs on the HTTP load loop (thread
``labserve-load``), never on a server's.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, TypeAlias

from labserve.base.errors import LoadTargetError
from labserve.base.lengths import LengthDist
from labserve.generation.workload import SharedPrefixWorkload
from labserve.load.arrivals import Arrivals
from labserve.load.generation.goodput import parse_goodput
from labserve.load.generation.prompts import CHAT_PATH, COMPLETIONS_PATH
from labserve.load.generation.result import GenerationLoadResult, build_result
from labserve.load.generation.sender import GenerationSender
from labserve.load.generation.sessions import WorkloadSender
from labserve.load.generation.stream import GenRecord
from labserve.load.loop import load_loop
from labserve.load.run import LoadRun, start_run

__all__ = [
    "GenerationLoadRun",
    "generation_load_test",
    "is_generation_url",
    "start_generation_load",
]

_OPEN_LOOP_CONNECTIONS = 512  # an open loop's most streams at once, unless told

GenerationLoadRun: TypeAlias = LoadRun[GenerationLoadResult]
"""A generation load run: the load run whose result is a :class:`GenerationLoadResult`."""


def is_generation_url(url: str) -> bool:
    """True for an OpenAI-compatible completion URL (``.../v1/completions``, or chat)."""
    path = url.split("?", 1)[0].rstrip("/")
    return path.endswith((COMPLETIONS_PATH, CHAT_PATH))


def generation_load_test(url: str, **options: Any) -> GenerationLoadResult:
    """Stream completions from ``url`` for ``duration_s``; return what the client measured.

    ``url`` is ``.../v1/completions`` or ``.../v1/chat/completions`` of any
    OpenAI-compatible server. Open loop with ``arrivals`` (requests go out on schedule
    whatever the replies), or closed loop with ``concurrency`` clients (each sends its next
    request when its last stream ends). Each request's prompt is ``input_len`` bytes (one
    token each for a byte-level model; approximate for others: see
    :mod:`labserve.load.generation.prompts`) and asks for ``output_len`` tokens
    (``max_tokens``, with ``ignore_eos`` unless ``ignore_eos=False``): lengths or
    distributions in the length vocabulary (``"lognormal:16:128"``, ``"uniform:1:512"``,
    ``128``). ``model`` defaults
    to the only model ``GET /v1/models`` lists. ``goodput`` (``"ttft:300 tpot:30"``, or a
    dict of ms) sets the targets a good request meets. ``token`` goes in
    ``Authorization: Bearer``; ``connections`` bounds the streams at once (default
    ``concurrency``, or 512); ``timeout_s`` is the longest a stream may stay silent.

    ``workload`` (a :class:`~labserve.generation.workload.SharedPrefixWorkload`) sends
    prompts that share prefixes, and sessions of turns that resend their history
    (:mod:`labserve.load.generation.sessions`): each arrival, or each closed-loop client's
    next request, is a session; its prompts and lengths are the workload's (``input_len``
    and ``output_len`` are then not read); ``result.per_turn()`` gives TTFT by turn.

    Blocks until the last stream ends; :func:`start_generation_load` is the same without
    blocking. Against labserve, ``result.server`` holds the server's ``/stats`` for the
    model over the run.

    Raises:
        LoadInterrupted: when interrupted (Ctrl-C): the load stopped, and ``result`` holds
            what was measured so far.
        LoadTargetError: the URL is not a completion URL, or its model cannot be found.
        ValueError, TypeError: an argument breaks its rule (named in the message).

    >>> r = labserve.load_test("http://127.0.0.1:3000/v1/completions",    # doctest: +SKIP
    ...     duration_s=30, arrivals=labserve.arrivals("poisson", rate_rps=4),
    ...     input_len="lognormal:16:128", output_len=128, goodput="ttft:300 tpot:30")
    """
    run = start_generation_load(url, **options)
    return run._wait(None, stacklevel=3)


def start_generation_load(
    url: str,
    *,
    duration_s: float,
    arrivals: Arrivals | None = None,
    concurrency: int | None = None,
    input_len: LengthDist | str | int = 32,
    output_len: LengthDist | str | int = 128,
    model: str | None = None,
    goodput: Any = None,
    ignore_eos: bool = True,
    seed: int = 0,
    token: str | None = None,
    connections: int | None = None,
    timeout_s: float = 30.0,
    label: str = "",
    workload: SharedPrefixWorkload | None = None,
) -> GenerationLoadRun:
    """Start what :func:`generation_load_test` describes; return its run at once."""
    _check_run(duration_s, arrivals, concurrency, connections, timeout_s)
    if not is_generation_url(url):
        needs = f"a generation load needs a {COMPLETIONS_PATH} or {CHAT_PATH} URL"
        raise LoadTargetError(url, needs)
    if workload is not None and not isinstance(workload, SharedPrefixWorkload):
        raise TypeError(f"workload must be a SharedPrefixWorkload, got {type(workload).__name__}")
    targets = parse_goodput(goodput)
    options: dict[str, Any] = {
        "model": model,
        "mix_args": (input_len, output_len, seed, ignore_eos),
        "token": token,
        "connections": connections or concurrency or _OPEN_LOOP_CONNECTIONS,
        "timeout_s": float(timeout_s),
    }
    sender = (
        GenerationSender(url, **options)
        if workload is None
        else WorkloadSender(url, workload, **options)
    )
    report = functools.partial(_report, sender, targets, label)
    return start_run(
        load_loop(),
        sender,
        report,
        duration_s=float(duration_s),
        arrivals=arrivals,
        concurrency=concurrency,
        seed=seed,
    )


def _report(
    sender: GenerationSender,
    goodput_ms: dict[str, float],
    label: str,
    rec: GenRecord,
    duration_s: float,
) -> GenerationLoadResult:
    """The result of a generation run's record, with the server's view when it has one."""
    return build_result(
        rec,
        duration_s,
        goodput_ms=goodput_ms,
        server=sender.server_view(),
        label=label,
        sessions=isinstance(sender, WorkloadSender),
    )


# help() and IDEs show start_generation_load's parameters, declared once there.
setattr(  # noqa: B010 (mypy: functions have no such field)
    generation_load_test,
    "__signature__",
    inspect.signature(start_generation_load).replace(return_annotation="GenerationLoadResult"),
)


def _check_run(
    duration_s: Any, arrivals: Any, concurrency: Any, connections: Any, timeout_s: Any
) -> None:
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)):
        raise TypeError(f"duration_s must be a finite number > 0, got {duration_s!r}")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a finite number > 0, got {duration_s!r}")
    if (arrivals is None) == (concurrency is None):
        raise TypeError("a load needs exactly one of arrivals= (open loop) or concurrency=")
    if arrivals is not None and not isinstance(arrivals, Arrivals):
        raise TypeError(f"arrivals must be an arrival process, got {type(arrivals).__name__}")
    for name, value in (("concurrency", concurrency), ("connections", connections)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an integer >= 1, got {value!r}")
        if value is not None and value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
