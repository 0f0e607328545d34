"""``app.generate(prompt)`` and ``app.generate.stream(prompt)``: generations through a handle.

A whole generation is one call of the replica's method (a Completion back); a stream is
Serve's streaming call of the replica's ``stream`` (text pieces, then the Finish), so the
text arrives as the replica generates it. Errors come back typed (the replica's
LabServeError, not Ray's wrapper).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from ray.exceptions import RayTaskError
from ray.serve.handle import DeploymentHandle

from labserve.base.errors import LabServeError
from labserve.generation.api import Completion, Finish

__all__ = ["AsyncRayStream", "GenerativeCaller", "RayStream", "in_event_loop", "unwrapped"]

_T = TypeVar("_T")


def in_event_loop() -> bool:
    """True when the calling thread runs an event loop (where Ray refuses to block)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def unwrapped(fn: Callable[[], _T]) -> _T:
    """``fn()``, a replica's typed error raised as itself rather than inside RayTaskError."""
    try:
        return fn()
    except RayTaskError as exc:
        if isinstance(exc.cause, LabServeError):
            raise exc.cause from None
        raise


def _blocking(fn: Callable[[], _T]) -> _T:
    """``fn()``, on a helper thread when this one runs a loop (a notebook cell)."""
    if not in_event_loop():
        return unwrapped(fn)
    with concurrent.futures.ThreadPoolExecutor(1, "labserve-ray-call") as pool:
        return pool.submit(unwrapped, fn).result()


class GenerativeCaller:
    """One generative method of a deployed application. Thread-safe (each call is Ray's).

    >>> app.generate("Once", max_tokens=8, temperature=0).text        # doctest: +SKIP
    >>> for piece in app.generate.stream("Once", max_tokens=8):       # doctest: +SKIP
    ...     print(piece, end="")
    """

    def __init__(self, handle: DeploymentHandle[Any], method: str) -> None:
        self._handle = handle
        self.method = method

    def __call__(self, prompt: Any, *, timeout_s: float | None = None, **params: Any) -> Completion:
        """One whole generation; blocks for its Completion or typed error."""
        response = getattr(self._handle, self.method).remote(prompt, **params)
        done: Completion = _blocking(lambda: response.result(timeout_s=timeout_s))
        return done

    def stream(self, prompt: Any, **params: Any) -> RayStream:
        """One generation, its text pieces as the replica makes them (blocking iteration)."""
        return RayStream(self._generator(prompt, params))

    def astream(self, prompt: Any, **params: Any) -> AsyncRayStream:
        """The same as :meth:`stream`, for ``async for`` on any running loop."""
        return AsyncRayStream(self._generator(prompt, params))

    def _generator(self, prompt: Any, params: dict[str, Any]) -> Any:
        return self._handle.options(stream=True).stream.remote(self.method, prompt, params)


class RayStream:
    """Text pieces of one generation through a handle, then :attr:`finish`.

    ``close()`` (or leaving a ``with`` block) early cancels the generation on its replica.
    Not thread-safe: one reader.
    """

    def __init__(self, generator: Any) -> None:
        self._gen = generator
        self.finish: Finish | None = None
        """How the generation ended, once the iteration stopped (None before)."""

    def __iter__(self) -> Iterator[str]:
        while self.finish is None:
            try:
                item = _blocking(lambda: next(self._gen))
            except StopIteration:
                return
            if isinstance(item, Finish):
                self.finish = item
                return
            yield item

    def close(self) -> None:
        """Give up the generation (idempotent)."""
        if self.finish is None:
            self._gen.cancel()

    def __enter__(self) -> RayStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRayStream:
    """:class:`RayStream` for ``async for``; ``await aclose()`` gives it up."""

    def __init__(self, generator: Any) -> None:
        self._gen = generator
        self.finish: Finish | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        async for item in self._items():
            yield item

    async def _items(self) -> AsyncIterator[Any]:
        """The replica's items up to its Finish (kept as :attr:`finish`), errors typed."""
        while self.finish is None:
            try:
                item = await self._gen.__anext__()
            except StopAsyncIteration:
                return
            except RayTaskError as exc:
                if isinstance(exc.cause, LabServeError):
                    raise exc.cause from None
                raise
            if isinstance(item, Finish):
                self.finish = item
                return
            yield item

    async def aclose(self) -> None:
        """Give up the generation (idempotent)."""
        if self.finish is None:
            self._gen.cancel()
