"""Load for a generation server: streamed completions in open or closed loop, TTFT to goodput.

Against ``/v1/completions`` or ``/v1/chat/completions`` of labserve or any OpenAI-compatible
server (vLLM, TGI, SGLang, llama.cpp...). Each request asks for a synthetic prompt of a
drawn length and a drawn number of output tokens (:mod:`labserve.load.prompts`), streamed;
the client times every content chunk as it arrives (:mod:`labserve.load.gen_stream`, over
the raw keep-alive connections of :mod:`labserve.load.stream_conn`) and measures from each
request's intended send time, so a server that falls behind cannot hide its queue. Open
loop with any arrival process (:mod:`labserve.load.arrivals`: Poisson, bursts, steps, a
trace), or closed loop with ``concurrency`` clients. Against labserve, the server's own
``/stats`` for the model is read before and after (:mod:`labserve.load.gen_server_view`).
The load runs on the HTTP load loop (thread ``labserve-load``), never on a server's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import time
import warnings
from typing import Any

import numpy as np

from labserve.base.errors import LoadInterrupted, LoadTargetError, LoadWarning
from labserve.base.lengths import LengthDist
from labserve.load.arrivals import Arrivals
from labserve.load.gen_result import GenerationLoadResult, build_result
from labserve.load.gen_sender import GenerationSender
from labserve.load.gen_stream import GenRecord
from labserve.load.goodput import parse_goodput
from labserve.load.loop import load_loop
from labserve.load.prompts import CHAT_PATH, COMPLETIONS_PATH
from labserve.load.records import Control, clock_s
from labserve.runtime.loop import BackgroundLoop

__all__ = [
    "GenerationLoadRun",
    "generation_load_test",
    "is_generation_url",
    "start_generation_load",
]

_LAG_LIMIT_S = 0.005  # behind schedule by more than this (p99): say so, as the request load does
_OPEN_LOOP_CONNECTIONS = 512  # an open loop's most streams at once, unless told
_WAKE_S = 0.05  # a blocking wait wakes this often to let Ctrl-C in


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
    :mod:`labserve.load.prompts`) and asks for ``output_len`` tokens (``max_tokens``, with
    ``ignore_eos`` unless ``ignore_eos=False``): lengths or distributions in the length
    vocabulary (``"lognormal:16:128"``, ``"uniform:1:512"``, ``128``). ``model`` defaults
    to the only model ``GET /v1/models`` lists. ``goodput`` (``"ttft:300 tpot:30"``, or a
    dict of ms) sets the targets a good request meets. ``token`` goes in
    ``Authorization: Bearer``; ``connections`` bounds the streams at once (default
    ``concurrency``, or 512); ``timeout_s`` is the longest a stream may stay silent.

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
) -> GenerationLoadRun:
    """Start what :func:`generation_load_test` describes; return its run at once."""
    _check_run(duration_s, arrivals, concurrency, connections, timeout_s)
    if not is_generation_url(url):
        needs = f"a generation load needs a {COMPLETIONS_PATH} or {CHAT_PATH} URL"
        raise LoadTargetError(url, needs)
    targets = parse_goodput(goodput)
    sender = GenerationSender(
        url,
        model=model,
        mix_args=(input_len, output_len, seed, ignore_eos),
        token=token,
        connections=connections or concurrency or _OPEN_LOOP_CONNECTIONS,
        timeout_s=float(timeout_s),
    )
    bg = load_loop()
    control = Control()
    if arrivals is not None:
        times = np.asarray(arrivals.times(duration_s, seed=seed), dtype=float).tolist()
        future = bg.submit(_open_loop(sender, times, control))
    else:
        assert concurrency is not None
        future = bg.submit(_closed_loop(sender, concurrency, float(duration_s), control))
    return GenerationLoadRun(bg, future, control, sender, float(duration_s), targets, label)


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


async def _open_loop(sender: GenerationSender, times: list[float], control: Control) -> GenRecord:
    loop = asyncio.get_running_loop()
    await sender.open()
    rec = GenRecord()
    try:
        rec.t0 = clock_s() + 0.005
        control.sending = loop.create_task(_send_on_schedule(sender, rec, times, control))
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


async def _send_on_schedule(
    sender: GenerationSender, rec: GenRecord, times: list[float], control: Control
) -> None:
    loop = asyncio.get_running_loop()
    t0, n, i = rec.t0, len(times), 0
    while i < n:
        now = clock_s()
        while i < n and t0 + times[i] <= now:  # everything due goes out now
            k = rec.new_slot(times[i], *sender.mix.lengths(len(rec.arrival)))
            control.sent += 1
            control.track(loop.create_task(sender.send(rec, k, True)))
            i += 1
        if i < n:
            await asyncio.sleep(t0 + times[i] - clock_s())


async def _closed_loop(
    sender: GenerationSender, clients: int, duration_s: float, control: Control
) -> GenRecord:
    loop = asyncio.get_running_loop()
    await sender.open()
    rec = GenRecord()
    try:
        rec.t0 = clock_s()
        end = rec.t0 + duration_s

        async def client() -> None:
            while (now := clock_s()) < end and control.stopped_at is None:
                k = rec.new_slot(now - rec.t0, *sender.mix.lengths(len(rec.arrival)))
                control.sent += 1
                await sender.send(rec, k, False)

        for _ in range(clients):
            control.track(loop.create_task(client()))
        await _answered(control)
    finally:
        await _close(sender, control)
    if control.error is not None:
        raise control.error
    return rec


async def _answered(control: Control) -> None:
    while control.in_flight:
        await asyncio.wait(set(control.in_flight))


async def _close(sender: GenerationSender, control: Control) -> None:
    for task in control.in_flight:
        task.cancel()
    await sender.close()


class GenerationLoadRun:
    """A generation load started by :func:`start_generation_load`. Thread-safe.

    ``stop()`` sends no more (streams already going still end); ``result()`` waits for
    the last stream and returns the :class:`GenerationLoadResult`.
    """

    def __init__(
        self,
        bg: BackgroundLoop,
        future: concurrent.futures.Future[GenRecord],
        control: Control,
        sender: GenerationSender,
        duration_s: float,
        goodput_ms: dict[str, float],
        label: str,
    ) -> None:
        self._bg = bg
        self._future = future
        self._control = control
        self._sender = sender
        self._duration_s = duration_s
        self._goodput_ms = goodput_ms
        self._label = label
        self._result: GenerationLoadResult | None = None

    @property
    def running(self) -> bool:
        """True until the last stream has ended."""
        return not self._future.done()

    @property
    def sent(self) -> int:
        """Requests sent so far."""
        return self._control.sent

    def stop(self) -> None:
        """Send no more requests (idempotent; returns at once)."""
        if not self._future.done():
            self._bg.call_soon(self._control.stop)

    def result(self, timeout: float | None = None) -> GenerationLoadResult:
        """Wait for the last stream (up to ``timeout`` s) and return the result.

        Warns :class:`LoadWarning` when the sends fell behind schedule. Raises
        ``TimeoutError`` when still running after ``timeout``, :class:`LoadInterrupted`
        (with the result so far) when interrupted.
        """
        return self._wait(timeout, stacklevel=3)

    def _wait(self, timeout: float | None, stacklevel: int) -> GenerationLoadResult:
        if self._result is not None:
            return self._result
        try:
            rec = _wait_future(self._future, timeout)
        except KeyboardInterrupt:
            if not self._future.done():
                self._bg.call_soon(self._control.stop, True)
            rec = _wait_future(self._future, None)
            raise LoadInterrupted(self._make_result(rec), self._control.sent) from None
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the load run is still going after {timeout} s") from None
        result = self._make_result(rec)
        if result.send_lag_s is not None and len(result.send_lag_s):
            _warn_if_behind(result, self._sender, stacklevel)
        self._result = result
        return result

    def _make_result(self, rec: GenRecord) -> GenerationLoadResult:
        return build_result(
            rec,
            self._duration_s,
            goodput_ms=self._goodput_ms,
            server=self._sender.server_view(),
            label=self._label,
        )

    def __repr__(self) -> str:
        return f"<GenerationLoadRun {'running' if self.running else 'done'}, {self.sent} sent>"


def _wait_future(future: concurrent.futures.Future[GenRecord], timeout: float | None) -> GenRecord:
    """``future.result(timeout)``, waking every few ms so that Ctrl-C gets in at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait_s = _WAKE_S if deadline is None else min(_WAKE_S, max(deadline - time.monotonic(), 0))
        try:
            return future.result(wait_s)
        except concurrent.futures.TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise


def _warn_if_behind(
    result: GenerationLoadResult, sender: GenerationSender, stacklevel: int
) -> None:
    lag = result.send_lag_s
    assert lag is not None
    p99 = float(np.percentile(lag, 99))
    if p99 <= _LAG_LIMIT_S:
        return
    why = ""
    if sender.waited:
        why = (
            f"; {sender.waited / len(lag):.0%} of the requests found all {sender.connections} "
            "connections streaming when due (give more with connections=, --connections)"
        )
    rate = len(lag) / result.duration_s
    warnings.warn(
        LoadWarning(
            f"the load generator could not keep {rate:,.2f} req/s: sends fell behind schedule "
            f"by up to {lag.max() * 1000:.1f} ms (p99 {p99 * 1000:.1f} ms); latencies are "
            f"measured from the intended send times{why}"
        ),
        stacklevel=stacklevel + 1,
    )
