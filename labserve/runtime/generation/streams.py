"""One generation's text on its way to its caller: a blocking iterator or an async one.

The driver feeds a stream once per step with what the step produced for it, and once
more with how it ended. A blocking stream (:class:`TokenStream`) is fed from any thread;
an async one (:class:`AsyncTokenStream`) only on its own event loop, so the driver hands
all of one loop's streams their pieces with one ``call_soon_threadsafe`` per step
(:func:`feed_streams`). Closing a stream early, or cancelling the task that iterates it,
withdraws the sequence: it is freed at the next step and counted ``cancelled``.
"""

from __future__ import annotations

import asyncio
import queue
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from labserve.generation.api import Completion, Finish

__all__ = ["AsyncTokenStream", "End", "TokenStream", "feed_streams"]


@dataclass(frozen=True, slots=True)
class End:
    """How a generation ended: its finish and token ids, or the caller's typed error."""

    finish: Finish | None
    token_ids: tuple[int, ...]
    error: BaseException | None = None


class _Base:
    """What both kinds share: the pieces given out, the end, and the withdrawal."""

    loop: asyncio.AbstractEventLoop | None = None
    """The loop that must feed it (None: any thread may)."""

    def __init__(self, cancel: Callable[[], None]) -> None:
        self._cancel = cancel
        self._end: End | None = None
        self._closed = False
        self._text: list[str] = []

    @property
    def finish(self) -> Finish | None:
        """How it ended, once the iteration stopped (None before, or when it failed)."""
        return self._end.finish if self._end is not None and self._closed else None

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The token ids generated (empty until it ended)."""
        return self._end.token_ids if self._end is not None else ()

    @property
    def withdrawn(self) -> bool:
        """Whether its caller closed it before it ended (nobody listens any more)."""
        return self._closed and self._end is None

    def _withdraw(self) -> None:
        if not self._closed:
            self._closed = True
            if self._end is None:
                self._cancel()

    def _completion(self) -> Completion:
        end = self._end
        assert end is not None and end.finish is not None
        return Completion("".join(self._text), end.token_ids, end.finish)


class TokenStream(_Base):
    """A generation's text pieces, for a blocking caller in any thread but labserve's loop.

    Iterate it (``for piece in stream``); it raises the sequence's typed error when the
    sequence fails. ``close()`` (or leaving a ``with`` block, or an interrupt while it
    waits) withdraws the sequence.
    """

    def __init__(self, cancel: Callable[[], None]) -> None:
        super().__init__(cancel)
        self._queue: queue.SimpleQueue[tuple[list[str], End | None]] = queue.SimpleQueue()
        self._ready: deque[str] = deque()

    def feed(self, pieces: list[str], end: End | None) -> None:
        """Hand it a step's pieces and, last, its end. Any thread."""
        self._queue.put((pieces, end))

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        while not self._ready:
            if self._end is not None or self._closed:
                return self._stop()
            try:
                pieces, end = self._queue.get()
            except BaseException:  # an interrupt while waiting: withdraw, then say so
                self._withdraw()
                raise
            self._ready.extend(p for p in pieces if p)
            if end is not None:
                self._end = end
        piece = self._ready.popleft()
        self._text.append(piece)
        return piece

    def _stop(self) -> str:
        self._closed = True
        end = self._end
        if end is not None and end.error is not None:
            raise end.error
        raise StopIteration

    def close(self) -> None:
        """Withdraw the sequence unless it ended (idempotent)."""
        self._withdraw()

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def result(self) -> Completion:
        """Iterate to the end; the whole generation (raises its typed error)."""
        for _ in self:
            pass
        return self._completion()


class AsyncTokenStream(_Base):
    """A generation's text pieces, for ``async for`` on one event loop.

    Raises the sequence's typed error when it fails; ``await aclose()`` or cancelling the
    iterating task withdraws the sequence. Loop-only (its own loop).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel: Callable[[], None]) -> None:
        super().__init__(cancel)
        self.loop: asyncio.AbstractEventLoop = loop
        self._ready: deque[str] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def feed(self, pieces: list[str], end: End | None) -> None:
        """Hand it a step's pieces and, last, its end. On its own loop only."""
        self._ready.extend(p for p in pieces if p)
        if end is not None:
            self._end = end
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> AsyncTokenStream:
        return self

    async def __anext__(self) -> str:
        while not self._ready:
            if self._end is not None or self._closed:
                self._closed = True
                end = self._end
                if end is not None and end.error is not None:
                    raise end.error
                raise StopAsyncIteration
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                self._withdraw()
                raise
            finally:
                self._waiter = None
        piece = self._ready.popleft()
        self._text.append(piece)
        return piece

    async def aclose(self) -> None:
        """Withdraw the sequence unless it ended (idempotent)."""
        self._withdraw()

    async def result(self) -> Completion:
        """Iterate to the end; the whole generation (raises its typed error)."""
        async for _ in self:
            pass
        return self._completion()


AnyStream = TokenStream | AsyncTokenStream


def feed_streams(
    items: list[tuple[AnyStream, list[str], End | None]], home: asyncio.AbstractEventLoop | None
) -> None:
    """Feed each stream its pieces: one hand-off per foreign event loop, none for ``home``.

    Blocking streams are fed from this thread; async streams of ``home`` (the calling
    thread's loop) directly; those of another loop by one ``call_soon_threadsafe`` to it.
    """
    others: dict[asyncio.AbstractEventLoop, list[tuple[Any, list[str], End | None]]] = {}
    for item in items:
        loop = item[0].loop
        if loop is None or loop is home:
            item[0].feed(item[1], item[2])
        else:
            others.setdefault(loop, []).append(item)
    for loop, theirs in others.items():
        try:
            loop.call_soon_threadsafe(_feed_all, theirs)
        except RuntimeError:
            pass  # that loop is closed: nobody is left listening there


def _feed_all(items: list[tuple[AnyStream, list[str], End | None]]) -> None:
    for stream, pieces, end in items:
        stream.feed(pieces, end)
