"""The one background event loop: a daemon thread that owns labserve's asyncio loop.

Batch queues, their timers, and (later) the HTTP server and load generators all live on
this loop. Other threads reach it only through the thread-safe methods documented
below; everything else that runs on the loop is loop-only and says so.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from labserve.base.errors import LoopThreadError

__all__ = ["LOOP_KINDS", "BackgroundLoop", "background_loop", "loop_kind"]

LOOP_KINDS = ("auto", "asyncio", "uvloop")
"""Which event loop a BackgroundLoop runs: ``auto`` is uvloop when it is installed
(``pip install 'labserve[fast]'``), else asyncio's own."""

T = TypeVar("T")

# Worker threads for synchronous model methods. Batches in flight are bounded by each
# method's max_concurrent_batches, not by this; it only has to be large enough.
_WORKERS = 32


class BackgroundLoop:
    """An asyncio loop running on its own named daemon thread.

    Started lazily and idempotently; :meth:`stop` runs the registered shutdown hooks
    (runners drain), stops the loop, closes it and joins the thread. Thread-safe:
    :meth:`start`, :meth:`stop`, :meth:`call_soon`, :meth:`call`, :meth:`submit`,
    :meth:`run`. A blocking call from the loop thread itself raises LoopThreadError.

    >>> bg = BackgroundLoop(); bg.start()
    >>> async def answer(): return 42
    >>> bg.run(answer())
    42
    >>> bg.stop()
    """

    def __init__(self, name: str = "labserve-loop", kind: str | None = None) -> None:
        if kind is not None:
            _check_kind(kind, "BackgroundLoop(kind=...)")
        self.name = name
        self.kind = kind
        """The loop asked for; None: ``$LABSERVE_LOOP``, read at each start, else ``auto``."""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._shutdown_hooks: list[Callable[[], Awaitable[None]]] = []
        self.closing = False
        """True while the loop is being stopped: nothing new should start on it."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (starting it if needed)."""
        self.start()
        assert self._loop is not None
        return self._loop

    @property
    def executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The worker threads that run synchronous model methods."""
        self.start()
        assert self._executor is not None
        return self._executor

    @property
    def running(self) -> bool:
        """True while the loop thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread."""
        return threading.current_thread() is self._thread

    def start(self) -> None:
        """Start the loop thread if it is not running; returns once the loop runs."""
        if self.running:
            return
        with self._lock:
            if self.running:
                return
            self.closing = False
            factory = _loop_factory(self.kind)
            ready: concurrent.futures.Future[asyncio.AbstractEventLoop] = (
                concurrent.futures.Future()
            )
            self._executor = concurrent.futures.ThreadPoolExecutor(
                _WORKERS, thread_name_prefix="labserve-worker"
            )
            thread = threading.Thread(
                target=self._main, args=(ready, factory), name=self.name, daemon=True
            )
            thread.start()
            self._loop = ready.result()
            self._thread = thread

    @property
    def uvloop(self) -> bool:
        """True when the running loop is uvloop's."""
        return self._loop is not None and type(self._loop).__module__.startswith("uvloop")

    def _main(
        self,
        ready: concurrent.futures.Future[asyncio.AbstractEventLoop],
        factory: Callable[[], asyncio.AbstractEventLoop],
    ) -> None:
        loop = factory()
        asyncio.set_event_loop(loop)
        ready.set_result(loop)
        try:
            loop.run_forever()
        finally:
            self.closing = True
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def add_shutdown_hook(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run ``await hook()`` on the loop when it stops (runners drain this way)."""
        self._shutdown_hooks.append(hook)

    def remove_shutdown_hook(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Forget a hook added with :meth:`add_shutdown_hook` (no error if absent)."""
        if hook in self._shutdown_hooks:
            self._shutdown_hooks.remove(hook)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop. Thread-safe; never blocks."""
        loop = self.loop
        if self.in_loop_thread():
            loop.call_soon(fn, *args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """Run ``fn(*args)`` on the loop and return its result. Thread-safe; blocks.

        Raises LoopThreadError from the loop thread, as :meth:`run` does: one rule for
        every blocking door (call ``fn`` directly there).
        """
        if self.in_loop_thread():
            raise LoopThreadError(
                "BackgroundLoop.call() was called from labserve's loop thread, where it would "
                "wait for itself; call the function directly instead"
            )
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def invoke() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # handed to the calling thread, which raises it
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(invoke)
        return done.result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a coroutine on the loop; returns a concurrent Future. Thread-safe."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the loop and wait for its result. Thread-safe; blocks.

        Raises LoopThreadError from the loop thread (await the coroutine there instead).
        An interrupted wait (KeyboardInterrupt, timeout) cancels the coroutine.
        """
        if self.in_loop_thread():
            coro.close()
            raise LoopThreadError(
                "BackgroundLoop.run() was called from labserve's loop thread, where it would "
                "deadlock; await the coroutine instead"
            )
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def stop(self, timeout: float = 10.0) -> None:
        """Drain (shutdown hooks), stop the loop and join its thread. Idempotent."""
        with self._lock:
            thread, loop, executor = self._thread, self._loop, self._executor
            if thread is None or loop is None:
                return
            if threading.current_thread() is thread:
                raise LoopThreadError("BackgroundLoop.stop() cannot be called from the loop thread")
            hooks, self._shutdown_hooks = list(self._shutdown_hooks), []
            if thread.is_alive():
                try:
                    asyncio.run_coroutine_threadsafe(_run_hooks(hooks), loop).result(timeout)
                except (concurrent.futures.TimeoutError, RuntimeError):
                    pass  # stop anyway: a hung model must not hang the kernel's exit
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout)
            if executor is not None:
                # Join the workers, but never longer than timeout: a hung model must not
                # hang the kernel's exit (the workers are daemon threads).
                closer = threading.Thread(
                    target=executor.shutdown,
                    kwargs={"wait": True, "cancel_futures": True},
                    name=f"{self.name}-closer",
                    daemon=True,
                )
                closer.start()
                closer.join(timeout)
            self._thread = self._loop = self._executor = None


def _check_kind(kind: str, where: str) -> None:
    if kind not in LOOP_KINDS:
        raise ValueError(f"{where} must be one of {', '.join(LOOP_KINDS)}, got {kind!r}")


def loop_kind(kind: str | None = None) -> str:
    """The loop a BackgroundLoop asked for ``kind`` runs: "asyncio" or "uvloop".

    ``kind`` None reads ``$LABSERVE_LOOP`` (unset: ``auto``). Raises ValueError for an
    unknown kind, or for uvloop asked by name when it is not installed.
    """
    if kind is None:
        kind = os.environ.get("LABSERVE_LOOP", "").strip() or "auto"
        _check_kind(kind, "$LABSERVE_LOOP")
    else:
        _check_kind(kind, "the loop")
    if kind == "asyncio":
        return kind
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if kind == "uvloop":
            raise ValueError(
                "the uvloop event loop was asked for, and uvloop is not installed: "
                "pip install 'labserve[fast]'"
            ) from None
        return "asyncio"
    return "uvloop"


def _loop_factory(kind: str | None) -> Callable[[], asyncio.AbstractEventLoop]:
    if loop_kind(kind) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    if kind == "asyncio" or (kind is None and os.environ.get("LABSERVE_LOOP")):
        # asyncio's own loop for this platform, whatever policy the host program set.
        return asyncio.DefaultEventLoopPolicy().new_event_loop
    return asyncio.new_event_loop  # auto without uvloop: the host program's policy decides


async def _run_hooks(hooks: list[Callable[[], Awaitable[None]]]) -> None:
    await asyncio.gather(*(hook() for hook in hooks), return_exceptions=True)


_default: BackgroundLoop | None = None
_default_lock = threading.Lock()


def background_loop() -> BackgroundLoop:
    """Return labserve's process-wide background loop, started on first use. Thread-safe."""
    global _default
    with _default_lock:
        if _default is None:
            _default = BackgroundLoop()
            atexit.register(_default.stop)
    _default.start()
    return _default
