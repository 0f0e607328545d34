"""Handing outcomes to callers: their futures, whichever thread and loop they wait on.

A batch's callers are answered with one hand-off per event loop: callers blocked in other
threads (concurrent futures) directly from the delivering thread, callers awaiting on
labserve's loop by the loop itself, callers awaiting on another loop (the kernel's) by one
``call_soon_threadsafe`` to that loop for all of theirs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from labserve.batching.requests import Outcome

__all__ = ["AnyFuture", "hand_out", "settle", "settle_all"]

AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


def settle(handle: AnyFuture, value: Any, error: BaseException | None) -> None:
    """Hand an outcome to the caller's future unless the caller already gave up."""
    if handle.done():
        return
    try:
        if error is None:
            handle.set_result(value)
        else:
            handle.set_exception(error)
    except (asyncio.InvalidStateError, concurrent.futures.InvalidStateError):
        pass  # cancelled by its (other-thread) caller between done() and here


def settle_all(outcomes: list[Outcome]) -> None:
    """Settle asyncio futures of the running loop (or concurrent ones): no lock, no hop."""
    for r, value, error in outcomes:
        handle = r.handle
        if handle.done():
            continue
        if error is None:
            handle.set_result(value)
        else:
            handle.set_exception(error)


def hand_out(outcomes: list[Outcome], home: asyncio.AbstractEventLoop | None) -> list[Outcome]:
    """Answer what can be answered from this thread; return the outcomes for ``home``.

    Concurrent futures are set here (any thread). Futures of another event loop get one
    ``call_soon_threadsafe`` per loop for all of theirs. Those of ``home`` (labserve's
    loop) are returned, to be set on its thread.
    """
    mine: list[Outcome] = []
    others: dict[asyncio.AbstractEventLoop, list[Outcome]] | None = None
    for outcome in outcomes:
        handle = outcome[0].handle
        if type(handle) is concurrent.futures.Future:
            settle(handle, outcome[1], outcome[2])
            continue
        loop = handle.get_loop()
        if loop is home:
            mine.append(outcome)
        else:
            if others is None:
                others = {}
            others.setdefault(loop, []).append(outcome)
    if others:
        for loop, theirs in others.items():
            try:
                loop.call_soon_threadsafe(settle_all, theirs)
            except RuntimeError:
                pass  # that loop is closed: nobody is left awaiting there
    return mine
